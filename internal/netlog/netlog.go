// Package netlog is a session's egress audit, the body of __netlog__:
// every new flow the guest attempted, with the firewall's verdict.
package netlog

import (
	"net/netip"
	"strconv"

	"github.com/nethersandbox/nether/internal/ring"
)

// DefaultCapacity is how many flows the log keeps; older ones are
// dropped and counted. A guest that floods connection attempts fills it
// with its flood, never more memory.
const DefaultCapacity = 4096

// Entry is one flow attempt.
type Entry struct {
	MS      int64  // when, in milliseconds since the session began
	Proto   string // TCP or UDP, as the protocol spells the netlog
	Dst     netip.AddrPort
	Allowed bool
}

// Log is safe for concurrent use.
type Log struct{ r *ring.Ring[Entry] }

// New makes a log of capacity entries (≤ 0: DefaultCapacity).
func New(capacity int) *Log {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Log{r: ring.New[Entry](capacity)}
}

// Add records a flow attempt.
func (l *Log) Add(e Entry) {
	if l == nil {
		return
	}
	l.r.Add(e)
}

// Entries returns the entries held, oldest first, and how many older ones
// were dropped.
func (l *Log) Entries() (entries []Entry, dropped uint64) {
	return l.r.Entries()
}

// Reply renders the __netlog__ reply: "NETLOG <count>[ dropped=<n>]",
// then "<ms> <TCP|UDP> <ip>:<port> <ALLOW|BLOCK>" per flow, oldest
// first.
func (l *Log) Reply() []byte {
	entries, dropped := l.Entries()
	b := make([]byte, 0, 32+len(entries)*40)
	b = ring.AppendHeader(b, "NETLOG", len(entries), dropped)
	for _, e := range entries {
		b = strconv.AppendInt(b, e.MS, 10)
		b = append(b, ' ')
		b = append(b, e.Proto...)
		b = append(b, ' ')
		b = e.Dst.AppendTo(b)
		if e.Allowed {
			b = append(b, " ALLOW\n"...)
		} else {
			b = append(b, " BLOCK\n"...)
		}
	}
	return b
}
