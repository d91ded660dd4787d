package timeline

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTest(capacity int) (*Timeline, *clock) {
	c := &clock{t: time.Unix(1000, 0)}
	return New(c.t, c.now, capacity), c
}

func TestReply(t *testing.T) {
	tl, c := newTest(8)
	if got, want := string(tl.Reply(0)), "EVENTS 0 0\n"; got != want {
		t.Fatalf("empty timeline: %q, want %q", got, want)
	}
	tl.Add(LIFE, "boot")
	c.t = c.t.Add(1500 * time.Millisecond)
	tl.Add(CMD, "start n=1 echo hi\nthere")
	want := "EVENTS 2 2\n1 0 LIFE boot\n2 1500 CMD start n=1 echo hi\\x0athere\n"
	if got := string(tl.Reply(0)); got != want {
		t.Fatalf("Reply(0) = %q, want %q", got, want)
	}
	if got, want := string(tl.Reply(1)), "EVENTS 2 1\n2 1500 CMD start n=1 echo hi\\x0athere\n"; got != want {
		t.Fatalf("Reply(1) = %q, want %q", got, want)
	}
	if got, want := string(tl.Reply(2)), "EVENTS 2 0\n"; got != want {
		t.Fatalf("Reply(2) = %q, want %q", got, want)
	}
}

func TestSince(t *testing.T) {
	for _, tc := range []struct {
		name        string
		added       int
		cursor      uint64
		wantFirst   uint64 // 0: no events
		wantCount   int
		wantNext    uint64
		wantDropped uint64
	}{
		{name: "empty", added: 0, cursor: 0, wantNext: 0},
		{name: "all", added: 3, cursor: 0, wantFirst: 1, wantCount: 3, wantNext: 3},
		{name: "after cursor", added: 3, cursor: 2, wantFirst: 3, wantCount: 1, wantNext: 3},
		{name: "up to date", added: 3, cursor: 3, wantNext: 3},
		{name: "ring wrapped, whole ring", added: 10, cursor: 0, wantFirst: 3, wantCount: 8, wantNext: 10, wantDropped: 2},
		{name: "cursor older than ring", added: 10, cursor: 1, wantFirst: 3, wantCount: 8, wantNext: 10, wantDropped: 1},
		{name: "cursor at ring edge", added: 10, cursor: 2, wantFirst: 3, wantCount: 8, wantNext: 10},
		{name: "cursor from another timeline", added: 3, cursor: 99, wantFirst: 1, wantCount: 3, wantNext: 3},
		{name: "cursor from another timeline, wrapped", added: 10, cursor: 99, wantFirst: 3, wantCount: 8, wantNext: 10, wantDropped: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl, _ := newTest(8)
			for i := range tc.added {
				tl.Add(CMD, fmt.Sprint("e", i+1))
			}
			events, next, dropped := tl.Since(tc.cursor)
			if len(events) != tc.wantCount || next != tc.wantNext || dropped != tc.wantDropped {
				t.Fatalf("Since(%d) = %d events, next %d, dropped %d; want %d, %d, %d",
					tc.cursor, len(events), next, dropped, tc.wantCount, tc.wantNext, tc.wantDropped)
			}
			for i, e := range events {
				seq := tc.wantFirst + uint64(i)
				if e.Seq != seq || e.Text != fmt.Sprint("e", seq) {
					t.Fatalf("event %d = %+v, want seq %d", i, e, seq)
				}
			}
		})
	}
}

func TestDroppedInHeader(t *testing.T) {
	tl, _ := newTest(2)
	for range 5 {
		tl.Add(LIFE, "x")
	}
	if got := strings.SplitN(string(tl.Reply(1)), "\n", 2)[0]; got != "EVENTS 5 2 dropped=2" {
		t.Fatalf("header %q, want %q", got, "EVENTS 5 2 dropped=2")
	}
}

func TestTextBounded(t *testing.T) {
	tl, _ := newTest(2)
	tl.Add(CMD, strings.Repeat("a", 10*MaxText))
	events, _, _ := tl.Since(0)
	if n := len(events[0].Text); n > MaxText+32 {
		t.Fatalf("event text is %d bytes, want it bounded near %d", n, MaxText)
	}
}

func TestNilTimelineIsOff(t *testing.T) {
	var tl *Timeline
	tl.Add(LIFE, "boot")
	tl.Addf(LIFE, "boot %d", 1)
}

func TestConcurrentAdd(t *testing.T) {
	tl, _ := newTest(64)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 100 {
				tl.Addf(CMD, "g%d i%d", g, i)
				tl.Reply(uint64(i))
			}
		}()
	}
	for range 4 {
		<-done
	}
	events, next, _ := tl.Since(0)
	if next != 400 || len(events) != 64 || events[63].Seq != 400 {
		t.Fatalf("after 400 adds: next %d, %d events, newest %d", next, len(events), events[len(events)-1].Seq)
	}
}
