// Package ring is the bounded, oldest-first log behind nether's audit
// replies (__cmdlog__, __netlog__): a flood of entries costs the ring's
// size and a count of what was dropped, never more memory.
package ring

import (
	"strconv"
	"sync"
)

// Ring keeps the newest entries. It is safe for concurrent use.
type Ring[T any] struct {
	mu      sync.Mutex
	buf     []T
	n       uint64 // entries ever added
	dropped uint64
}

// New makes a ring of capacity entries (at least 1).
func New[T any](capacity int) *Ring[T] {
	return &Ring[T]{buf: make([]T, max(capacity, 1))}
}

// Add keeps e, dropping the oldest entry when the ring is full.
func (r *Ring[T]) Add(e T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	size := uint64(len(r.buf))
	if r.n >= size {
		r.dropped++
	}
	r.buf[r.n%size] = e
	r.n++
}

// Entries returns the entries held, oldest first, and how many older ones
// were dropped.
func (r *Ring[T]) Entries() (entries []T, dropped uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	size := uint64(len(r.buf))
	first := uint64(0)
	if r.n > size {
		first = r.n - size
	}
	entries = make([]T, 0, r.n-first)
	for i := first; i < r.n; i++ {
		entries = append(entries, r.buf[i%size])
	}
	return entries, r.dropped
}

// AppendHeader appends the header line every log reply starts with:
// head (the reply's word, and any field before the count), the count of
// lines that follow, and " dropped=<n>" when the ring lost entries.
func AppendHeader(b []byte, head string, count int, dropped uint64) []byte {
	b = append(b, head...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(count), 10)
	if dropped > 0 {
		b = append(b, " dropped="...)
		b = strconv.AppendUint(b, dropped, 10)
	}
	return append(b, '\n')
}
