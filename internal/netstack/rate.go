package netstack

import (
	"sync/atomic"
	"time"
)

// atomicTime is a last-activity clock several goroutines touch.
type atomicTime struct{ ns atomic.Int64 }

func (t *atomicTime) touch() { t.ns.Store(time.Now().UnixNano()) }

func (t *atomicTime) idle(d time.Duration) bool {
	return time.Since(time.Unix(0, t.ns.Load())) >= d
}
