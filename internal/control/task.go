package control

import (
	"context"
	"sync"

	"github.com/nethersandbox/nether/internal/frame"
)

// task is one queued command while it runs: the reply it owes its client.
//
// Every byte of a queued command's reply goes through its task, because two
// parties may end that reply: the handler, when the work finishes, and the
// client's work loop, when the server stops and the work is abandoned
// (Stop). Whichever comes first ends the frame; the other finds it ended
// and writes nothing, so a reply is always exactly one complete frame.
type task struct {
	c    *client
	done chan struct{} // closed when the handler has returned

	mu      sync.Mutex
	holding bool // the task holds c.frame: a streamed reply is mid-frame
	sent    bool // body bytes of the streamed reply went out
	ended   bool // the reply's frame has ended
}

func newTask(c *client) *task {
	return &task{c: c, done: make(chan struct{})}
}

// open begins a streamed reply: it takes the client's frame interlock, so
// query replies wait for the trailer.
func (t *task) open() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended || t.holding {
		return
	}
	select {
	case t.c.frame <- struct{}{}:
		t.holding = true
	case <-t.c.done:
		// Nobody to write to; the output is still drained and discarded.
	}
}

// release gives the frame interlock back; t.mu is held.
func (t *task) release() {
	if t.holding {
		t.holding = false
		<-t.c.frame
	}
}

// chunk writes part of a streamed body. An error means the client will
// never get more of this reply (it went away, or the reply was ended by
// Stop): the caller keeps draining and discards the rest.
func (t *task) chunk(b []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return errReplyEnded
	}
	if err := t.c.write(b); err != nil {
		return err
	}
	if len(b) > 0 {
		t.sent = true
	}
	return nil
}

// endStream ends a streamed reply with tail (a trailer).
func (t *task) endStream(tail []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	t.c.write(tail)
	t.release()
}

// failStream ends a streamed reply with nether's ERR on a line of its own
// after whatever body was sent. When the server is stopping, the ERR is
// Stop's, whatever the failure: the stop is why the work failed.
func (t *task) failStream(text string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	if stop, ok := t.c.s.stopText(); ok {
		t.writeStop(stop)
		return
	}
	b := frame.Framed("ERR "+text, -1)
	if t.sent {
		// On a line of its own after the body; with no body the ERR
		// must lead the frame, or a client would not see a control error.
		b = append([]byte("\n"), b...)
	}
	t.c.write(b)
	t.release()
}

// reply ends the task's reply with one complete frame. A control-plane
// error (exit < 0) that happens while the server is stopping becomes Stop's
// ERR: the work was cancelled because of the stop.
func (t *task) reply(body string, exit int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	if exit < 0 {
		if stop, ok := t.c.s.stopText(); ok {
			t.writeStop(stop)
			return
		}
	}
	if t.holding {
		t.c.write(frame.Framed(body, exit))
		t.release()
		return
	}
	t.c.reply(body, exit)
}

// abort ends the reply with Stop's ERR unless it has already ended. It
// does not wait for the handler, which may be blocked on a guest that will
// never answer; what the handler writes later is discarded.
func (t *task) abort() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	stop, _ := t.c.s.stopText()
	t.writeStop(stop)
}

// writeStop writes Stop's ERR as the end of the reply; t.mu is held and
// t.ended set. Mid-stream it goes on a line of its own after the body
// sent so far, so a reader that printed the body sees it apart.
func (t *task) writeStop(stop string) {
	if !t.holding {
		t.c.reply(stop, -1)
		return
	}
	b := frame.Framed(stop, -1)
	if t.sent {
		b = append([]byte("\n"), b...)
	}
	t.c.write(b)
	t.release()
}

// finish runs after the handler returned: a reply it left open (a bug,
// but one that must not wedge the client) ends with an ERR, and the frame
// interlock is given back.
func (t *task) finish() {
	t.mu.Lock()
	ended := t.ended
	t.mu.Unlock()
	if !ended {
		t.c.s.log.Error("control: a command ended without a reply")
		t.failStream("internal error: the command ended without a reply")
	}
	t.mu.Lock()
	t.release()
	t.mu.Unlock()
	close(t.done)
}

// waitAgent applies the readiness rule: a driving command waits, bounded,
// for the agent. The wait ends early when the client leaves or the server
// stops.
func (t *task) waitAgent() bool {
	c := t.c
	ctx, cancel := c.s.stoppable(c.ctx)
	defer cancel()
	ctx, cancelWait := context.WithTimeout(ctx, c.s.AgentWait)
	defer cancelWait()
	if err := c.s.backend.WaitAgent(ctx); err != nil {
		switch {
		case c.s.ctx.Err() != nil:
			t.reply("ERR "+errStopping, -1)
		case ctx.Err() != nil:
			t.reply("ERR "+errAgentNotConnected, -1)
		default:
			// The backend knows the agent cannot be driven, and why
			// (its own words, e.g. a protocol mismatch).
			t.reply("ERR "+oneLine(err.Error()), -1)
		}
		return false
	}
	return true
}
