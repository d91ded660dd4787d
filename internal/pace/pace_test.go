package pace

import (
	"context"
	"testing"
	"time"
)

func TestBucket(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  int64
		takes []int
		min   time.Duration
	}{
		{"within the burst", 100_000, []int{5000, 5000}, 0},
		// The second take waits for a burst's worth, then owes the rest,
		// which the third take waits out: 0.1 s + 0.5 s.
		{"debt past the burst", 100_000, []int{10_000, 50_000, 50_000}, 600 * time.Millisecond},
		{"one take over the burst", 100_000, []int{10_000, 30_000, 1}, 250 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(tc.rate)
			start := time.Now()
			for _, n := range tc.takes {
				if err := b.Take(context.Background(), n); err != nil {
					t.Fatal(err)
				}
			}
			if d := time.Since(start); d < tc.min || d > tc.min+500*time.Millisecond {
				t.Fatalf("took %v, want about %v", d, tc.min)
			}
		})
	}
}
