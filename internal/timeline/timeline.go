// Package timeline is a session's event timeline, the body of __events__:
// commands (CMD), network flows (NET) and lifecycle moments (LIFE) in one
// bounded ring, each with a sequence number a client polls from.
package timeline

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nethersandbox/nether/internal/logtext"
	"github.com/nethersandbox/nether/internal/ring"
)

// Kind is the class of an event.
type Kind string

// The kinds of the protocol.
const (
	CMD  Kind = "CMD"
	NET  Kind = "NET"
	LIFE Kind = "LIFE"
)

// DefaultCapacity is how many events a timeline keeps: enough for a long
// interactive session's commands between two polls, small enough (with
// texts bounded by MaxText) to stay under a few MiB.
const DefaultCapacity = 4096

// MaxText bounds one event's text; longer text (a huge command) is cut
// with a note of how much was cut.
const MaxText = 1024

// Event is one line of the timeline.
type Event struct {
	Seq  uint64
	MS   int64 // milliseconds since the session began
	Kind Kind
	Text string // escaped: one line of printable UTF-8
}

// Timeline is safe for concurrent use. The zero value is not usable; see New.
type Timeline struct {
	start time.Time
	now   func() time.Time

	mu   sync.Mutex
	ring []Event // ring[i%cap] holds seq i+1
	last uint64  // seq of the newest event, 0 before the first
}

// New makes a timeline whose clock starts at start. now is the clock
// (time.Now when nil); capacity ≤ 0 means DefaultCapacity.
func New(start time.Time, now func() time.Time, capacity int) *Timeline {
	if now == nil {
		now = time.Now
	}
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Timeline{start: start, now: now, ring: make([]Event, capacity)}
}

// Add records an event. The text is escaped and bounded here, so callers
// may pass what a guest or a client sent.
func (t *Timeline) Add(kind Kind, text string) {
	if t == nil {
		return
	}
	text = logtext.Escape(logtext.Truncate(text, MaxText))
	ms := t.now().Sub(t.start).Milliseconds()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.last++
	t.ring[(t.last-1)%uint64(len(t.ring))] = Event{Seq: t.last, MS: ms, Kind: kind, Text: text}
}

// Addf is Add with a format.
func (t *Timeline) Addf(kind Kind, format string, a ...any) {
	if t == nil {
		return
	}
	t.Add(kind, fmt.Sprintf(format, a...))
}

// Since returns the events after cursor, oldest first, the cursor to pass
// next time (the newest sequence number), and how many events after
// cursor the ring no longer holds. A cursor newer than the newest event
// belongs to another timeline (a fork's parent, say): every event held is
// returned.
func (t *Timeline) Since(cursor uint64) (events []Event, next, dropped uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	size := uint64(len(t.ring))
	oldest := uint64(1)
	if t.last > size {
		oldest = t.last - size + 1
	}
	if cursor > t.last {
		cursor = 0
	}
	from := cursor + 1
	if from < oldest {
		dropped = oldest - from
		from = oldest
	}
	for seq := from; seq <= t.last; seq++ {
		events = append(events, t.ring[(seq-1)%size])
	}
	return events, t.last, dropped
}

// Reply renders the __events__ reply for cursor: the header
// "EVENTS <cursor> <count>[ dropped=<n>]" and one line per event,
// "<seq> <ms> <kind> <text>".
func (t *Timeline) Reply(cursor uint64) []byte {
	events, next, dropped := t.Since(cursor)
	b := make([]byte, 0, 64+len(events)*48)
	b = ring.AppendHeader(b, "EVENTS "+strconv.FormatUint(next, 10), len(events), dropped)
	for _, e := range events {
		b = strconv.AppendUint(b, e.Seq, 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, e.MS, 10)
		b = append(b, ' ')
		b = append(b, e.Kind...)
		b = append(b, ' ')
		b = append(b, e.Text...)
		b = append(b, '\n')
	}
	return b
}
