// Package pace is a token bucket of bytes (or of anything counted) per
// second, and a reader that pays for what it reads: the download cap of
// the network stack and the data planes' shared rate cap. Pacing reads,
// never dropping what was read, is what makes a cap lossless: the sender
// slows because its reader does.
package pace

import (
	"context"
	"io"
	"sync"
	"time"
)

// Bucket is a token bucket shared by every flow it paces. Its burst is a
// tenth of a second's worth (at least 1500), so the rate holds over any
// window longer than that.
type Bucket struct {
	mu     sync.Mutex
	rate   float64 // per second
	burst  float64
	tokens float64
	last   time.Time
}

// New returns a full bucket of perSec tokens a second (perSec > 0).
func New(perSec int64) *Bucket {
	b := float64(perSec)
	return NewBurst(perSec, max(b/10, 1500))
}

// NewBurst returns a full bucket of perSec tokens a second holding at
// most burst.
func NewBurst(perSec int64, burst float64) *Bucket {
	return &Bucket{rate: float64(perSec), burst: burst, tokens: burst, last: time.Now()}
}

func (b *Bucket) refill(now time.Time) {
	b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.rate, b.burst)
	b.last = now
}

// Take waits until n may pass, or ctx ends. A take larger than the burst
// waits for a full bucket and leaves it in debt, which the next take
// pays off.
func (b *Bucket) Take(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		b.refill(time.Now())
		need := min(float64(n), b.burst)
		if b.tokens >= need {
			b.tokens -= float64(n)
			b.mu.Unlock()
			return nil
		}
		wait := time.Duration((need - b.tokens) / b.rate * float64(time.Second))
		b.mu.Unlock()
		t := time.NewTimer(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Allow takes n tokens if they are there, without waiting.
func (b *Bucket) Allow(n float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// Reader reads through a bucket. A read is paid for after it, so the
// next one waits; reads are kept to 16 KiB so the pacing is smooth.
type Reader struct {
	R   io.Reader
	B   *Bucket
	Ctx context.Context
}

func (p *Reader) Read(buf []byte) (int, error) {
	if len(buf) > 16<<10 {
		buf = buf[:16<<10]
	}
	k, err := p.R.Read(buf)
	if k > 0 {
		if werr := p.B.Take(p.Ctx, k); werr != nil {
			return k, werr
		}
	}
	return k, err
}
