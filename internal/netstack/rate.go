package netstack

import (
	"context"
	"io"
	"sync"
	"time"
)

// bucket is a token bucket of bytes per second, shared by every flow of
// a sandbox: the download cap (net_rate_kbps).
type bucket struct {
	mu     sync.Mutex
	rate   float64 // bytes per second
	tokens float64
	last   time.Time
}

func newBucket(bytesPerSec int64) *bucket {
	return &bucket{rate: float64(bytesPerSec), tokens: float64(bytesPerSec) / 10, last: time.Now()}
}

// take waits until n bytes may pass, or ctx ends.
func (b *bucket) take(ctx context.Context, n int) error {
	for {
		b.mu.Lock()
		now := time.Now()
		b.tokens = min(b.tokens+now.Sub(b.last).Seconds()*b.rate, b.rate/10)
		b.last = now
		if b.tokens >= float64(n) || b.tokens >= b.rate/10 {
			b.tokens -= float64(n)
			b.mu.Unlock()
			return nil
		}
		wait := time.Duration((float64(n) - b.tokens) / b.rate * float64(time.Second))
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(wait, 100*time.Millisecond)):
		}
	}
}

// paced reads through the bucket: reading slower from the host socket is
// what slows the sender (TCP backpressure); nothing read is dropped.
type paced struct {
	r   io.Reader
	b   *bucket
	ctx context.Context
}

func (p *paced) Read(buf []byte) (int, error) {
	if len(buf) > 16<<10 {
		buf = buf[:16<<10]
	}
	k, err := p.r.Read(buf)
	if k > 0 {
		// Paid after the read, for what was read: the next read waits.
		if werr := p.b.take(p.ctx, k); werr != nil {
			return k, werr
		}
	}
	return k, err
}
