// Package cmdlog is a session's per-command audit, the body of __cmdlog__:
// when each command started, how it ended and what CPU it cost, with the
// command as sent.
package cmdlog

import (
	"strconv"

	"github.com/nethersandbox/nether/internal/logtext"
	"github.com/nethersandbox/nether/internal/ring"
)

// DefaultCapacity is how many commands the log keeps; older entries are
// dropped and counted.
const DefaultCapacity = 4096

// MaxCommand bounds the logged text of one command (the control protocol
// allows command lines far longer): the rest is cut with a note of its
// size, so the log stays a few MiB at most.
const MaxCommand = 1024

// Entry is one finished command.
type Entry struct {
	MS      int64  // when it started, in milliseconds since the session began
	Exit    int    // 0..255; a malformed or missing exit is recorded as 255
	CPUMS   int64  // the guest's host CPU time while it ran
	Command string // as sent; escaped and bounded by Add
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

// Add records a finished command. Exit is clamped to 0..255 (an exit
// outside it can only come from a broken trailer, which the relay also
// reports as 255), so a reader never sees a negative exit in the log.
func (l *Log) Add(e Entry) {
	if l == nil {
		return
	}
	if e.Exit < 0 || e.Exit > 255 {
		e.Exit = 255
	}
	e.CPUMS = max(e.CPUMS, 0)
	e.Command = logtext.Escape(logtext.Truncate(e.Command, MaxCommand))
	l.r.Add(e)
}

// Entries returns the entries held, oldest first, and how many older ones
// were dropped.
func (l *Log) Entries() (entries []Entry, dropped uint64) {
	return l.r.Entries()
}

// Reply renders the __cmdlog__ reply: "CMDLOG <count>[ dropped=<n>]",
// then "<ms> exit=<code> cpu_ms=<n> <command>" per command, oldest first.
func (l *Log) Reply() []byte {
	entries, dropped := l.Entries()
	b := make([]byte, 0, 32+len(entries)*48)
	b = ring.AppendHeader(b, "CMDLOG", len(entries), dropped)
	for _, e := range entries {
		b = strconv.AppendInt(b, e.MS, 10)
		b = append(b, " exit="...)
		b = strconv.AppendInt(b, int64(e.Exit), 10)
		b = append(b, " cpu_ms="...)
		b = strconv.AppendInt(b, e.CPUMS, 10)
		b = append(b, ' ')
		b = append(b, e.Command...)
		b = append(b, '\n')
	}
	return b
}
