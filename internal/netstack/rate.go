package netstack

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// bucket is a token bucket of bytes per second, shared by every flow of
// a sandbox: the host -> guest cap (RateKbps). Its burst is a tenth of a
// second's worth, so the rate holds over any window longer than that.
type bucket struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(bytesPerSec int64) *bucket {
	b := float64(bytesPerSec)
	return &bucket{rate: b, burst: max(b/10, 1500), tokens: max(b/10, 1500), last: time.Now()}
}

func (b *bucket) refill(now time.Time) {
	b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.rate, b.burst)
	b.last = now
}

// take waits until n bytes may pass, or ctx ends. A take larger than the
// burst waits for a full bucket and leaves it in debt, which the next
// take pays off.
func (b *bucket) take(ctx context.Context, n int) error {
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

// allow takes n tokens if they are there, without waiting.
func (b *bucket) allow(n float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	if b.tokens < n {
		return false
	}
	b.tokens -= n
	return true
}

// paced reads through the bucket: reading slower from the host socket is
// what slows the sender (TCP backpressure); nothing read is dropped.
type paced struct {
	r   io.Reader
	b   *bucket
	ctx context.Context
}

func (p *paced) Read(buf []byte) (int, error) {
	// Small reads keep the pacing smooth: a read is paid for after it,
	// so the next one waits.
	if len(buf) > 16<<10 {
		buf = buf[:16<<10]
	}
	k, err := p.r.Read(buf)
	if k > 0 {
		if werr := p.b.take(p.ctx, k); werr != nil {
			return k, werr
		}
	}
	return k, err
}

// atomicTime is a last-activity clock several goroutines touch.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) touch() { t.ns.Store(time.Now().UnixNano()) }

func (t *atomicTime) idle(d time.Duration) bool {
	return time.Since(time.Unix(0, t.ns.Load())) >= d
}
