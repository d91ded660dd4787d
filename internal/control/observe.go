package control

import (
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/cmdlog"
	"github.com/nethersandbox/nether/internal/framebuf"
	"github.com/nethersandbox/nether/internal/netlog"
	"github.com/nethersandbox/nether/internal/screen"
	"github.com/nethersandbox/nether/internal/timeline"
)

// Observe is what the server records about the commands it runs: CMD
// events on the session's timeline and the per-command audit. A nil field
// records nothing, and its command answers a framed ERR.
type Observe struct {
	Events   *timeline.Timeline
	Commands *cmdlog.Log
	// Flows is the egress audit; nil when the sandbox has no network.
	Flows *netlog.Log
}

// cmdSeq numbers the commands of a session in the order they started, so
// a command's start and end events can be paired.
type cmdSeq struct{ n atomic.Uint64 }

// observed is one command being observed from its start to its end.
type observed struct {
	s     *Server
	n     uint64
	text  string
	start time.Duration // since the session began
	cpu   time.Duration // the guest's CPU time when it started
}

// beginCommand records that a command reached the guest.
func (s *Server) beginCommand(text string) *observed {
	o := &observed{s: s, n: s.seq.n.Add(1), text: text}
	if s.Observe.Events == nil && s.Observe.Commands == nil {
		return o
	}
	o.start = s.meter.Elapsed()
	o.cpu = s.meter.CPU()
	s.Observe.Events.Addf(timeline.CMD, "start n=%d %s", o.n, text)
	return o
}

// endShell records how a shell command ended: its exit as relayed
// (0..255; 255 when the guest's trailer was malformed or the reply ended
// early) and what it cost.
func (o *observed) endShell(exit int, note string) {
	s := o.s
	if s.Observe.Events == nil && s.Observe.Commands == nil {
		return
	}
	cpu := (s.meter.CPU() - o.cpu).Milliseconds()
	dur := (s.meter.Elapsed() - o.start).Milliseconds()
	s.Observe.Commands.Add(cmdlog.Entry{MS: o.start.Milliseconds(), Exit: exit, CPUMS: cpu, Command: o.text})
	text := fmt.Sprintf("end n=%d exit=%d ms=%d cpu_ms=%d", o.n, exit, dur, cpu)
	if note != "" {
		text += " " + note
	}
	s.Observe.Events.Add(timeline.CMD, text)
}

// endTransfer records how a transfer ended.
func (o *observed) endTransfer(n int64, err error) {
	s := o.s
	if s.Observe.Events == nil {
		return
	}
	dur := (s.meter.Elapsed() - o.start).Milliseconds()
	if err != nil {
		s.Observe.Events.Addf(timeline.CMD, "end n=%d failed ms=%d: %v", o.n, dur, err)
		return
	}
	s.Observe.Events.Addf(timeline.CMD, "end n=%d ok bytes=%d ms=%d", o.n, n, dur)
}

// events answers __events__ [seq].
func (c *client) events(cmd cmdline.Command) {
	tl := c.s.Observe.Events
	if tl == nil {
		c.errReply("__events__: this sandbox keeps no event timeline")
		return
	}
	var cursor uint64
	if len(cmd.Args) == 1 {
		v, err := strconv.ParseUint(cmd.Args[0], 10, 64)
		if err != nil {
			// The parser checked the digits; only a value past 2^64 gets here.
			c.errReply("__events__: sequence number %s is out of range", cmd.Args[0])
			return
		}
		cursor = v
	}
	c.replyStreamed(tl.Reply(cursor))
}

// netlog answers __netlog__.
func (c *client) netlog(cmdline.Command) {
	l := c.s.Observe.Flows
	if l == nil {
		c.errReply("__netlog__: needs net = 1 in nether.conf")
		return
	}
	c.replyStreamed(l.Reply())
}

// cmdlog answers __cmdlog__.
func (c *client) cmdlog(cmdline.Command) {
	l := c.s.Observe.Commands
	if l == nil {
		c.errReply("__cmdlog__: this sandbox keeps no command log")
		return
	}
	c.replyStreamed(l.Reply())
}

// views is what a client keeps between its diff calls: the rows and the
// tiles it was last sent.
type views struct {
	screen screen.View
	frame  framebuf.View
}

// screen answers __screen__.
func (c *client) screen(cmdline.Command) {
	b, err := c.s.backend.Screen()
	if err != nil {
		c.errReply("__screen__: %v", err)
		return
	}
	c.replyStreamed(b)
}

// screenDiff answers __screendiff__ against this client's last call.
func (c *client) screenDiff(cmdline.Command) {
	b, err := c.s.backend.ScreenDiff(&c.views.screen)
	if err != nil {
		c.errReply("__screendiff__: %v", err)
		return
	}
	c.replyStreamed(b)
}

// frameDump answers __frame__.
func (c *client) frameDump(cmd cmdline.Command) {
	ctx, cancel := c.s.stoppable(c.ctx)
	defer cancel()
	b, err := c.s.backend.Frame(ctx)
	if err != nil {
		c.errReply("%s: %v", cmd.Name, oneLine(err.Error()))
		return
	}
	c.replyStreamed(b)
}

// frameDiff answers __framediff__ against this client's last call.
func (c *client) frameDiff(cmd cmdline.Command) {
	ctx, cancel := c.s.stoppable(c.ctx)
	defer cancel()
	b, err := c.s.backend.FrameDiff(ctx, &c.views.frame)
	if err != nil {
		c.errReply("%s: %v", cmd.Name, oneLine(err.Error()))
		return
	}
	c.replyStreamed(b)
}
