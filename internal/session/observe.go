package session

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nethersandbox/nether/internal/cmdlog"
	"github.com/nethersandbox/nether/internal/framebuf"
	"github.com/nethersandbox/nether/internal/netlog"
	"github.com/nethersandbox/nether/internal/screen"
	"github.com/nethersandbox/nether/internal/snapshot"
	"github.com/nethersandbox/nether/internal/timeline"
)

// The session's observation: the event timeline (__events__), which the
// control server adds the commands to, and the command log (__cmdlog__).
// Both start empty in every session: a fork or a woken park starts its
// own timeline, whose first event says where it came from.

// newObservation makes the session's timeline and command log, on the
// meter's clock so that every "ms" of a session counts from one moment.
func (s *Session) newObservation() {
	if s.opt.Unobserved {
		return
	}
	s.events = timeline.New(s.meter.Start(), s.opt.Now, 0)
	s.cmds = cmdlog.New(0)
	if s.cfg.Net {
		s.flows = netlog.New(0)
	}
}

// life records a lifecycle moment on the timeline.
func (s *Session) life(format string, a ...any) {
	s.events.Add(timeline.LIFE, fmt.Sprintf(format, a...))
}

// lifeStart records how this session began: a boot, or a restore that
// names its artifact and lineage.
func (s *Session) lifeStart() {
	v := s.getView()
	if !s.cfg.Restore {
		s.life("start boot sandbox=%s hostname=%s generation=%d", v.identity.SandboxID, v.identity.Hostname, v.identity.Generation)
		return
	}
	what := "wake"
	if s.art.Meta.Kind == snapshot.KindBase {
		what = "fork"
	}
	s.life("start %s from=%s parent=%s parent_generation=%d sandbox=%s hostname=%s generation=%d",
		what, v.snapshot, v.parent, s.art.Meta.Identity.Generation, v.identity.SandboxID, v.identity.Hostname, v.identity.Generation)
}

// watchAgent records when the guest agent comes up, and ends the
// sandbox when its guest could not mount the persistent disk: nothing a
// command does mends that, so a sandbox that ran on would refuse every
// command forever.
func (s *Session) watchAgent() {
	err := s.agent.WaitUp(s.ctx)
	switch {
	case err == nil:
		s.life("agent_up")
	case s.ctx.Err() != nil:
	default:
		s.endOnDiskError(err)
	}
}

// consoleComponent carries the console's screen across captures: its
// newest bytes are saved from the console log and replayed into the
// terminal on restore.
func (s *Session) consoleComponent() *consoleComponent {
	return &consoleComponent{
		tail: func() []byte {
			if s.console == nil {
				return nil
			}
			return s.console.Tail()
		},
		term: func() io.Writer {
			if s.term == nil {
				return nil
			}
			return s.term
		},
	}
}

// Screen geometry of the console's terminal: the guest's serial console
// is 80x24 unless something in the guest resizes it, and a thousand
// lines of scrollback keep a boot's worth of messages.
const (
	screenCols       = 80
	screenRows       = 24
	screenScrollback = 1000
)

// errNoGPU answers the frame commands of a sandbox without a display.
var errNoGPU = errors.New("needs gpu = 1 in nether.conf")

// Screen implements control.Backend.
func (s *Session) Screen() ([]byte, error) {
	if s.term == nil {
		return nil, errors.New("the console has no terminal (console mode)")
	}
	return s.term.Screen(), nil
}

// ScreenDiff implements control.Backend.
func (s *Session) ScreenDiff(v *screen.View) ([]byte, error) {
	if s.term == nil {
		return nil, errors.New("the console has no terminal (console mode)")
	}
	return s.term.Diff(v), nil
}

// Frame implements control.Backend: the display's scanout as a canonical
// PPM, checked (the bytes are the engine's, and a client sizes its read
// by the header).
func (s *Session) Frame(ctx context.Context) ([]byte, error) {
	img, err := s.scanout(ctx)
	if err != nil {
		return nil, err
	}
	return img.PPM(), nil
}

// FrameDiff implements control.Backend.
func (s *Session) FrameDiff(ctx context.Context, v *framebuf.View) ([]byte, error) {
	img, err := s.scanout(ctx)
	if err != nil {
		return nil, err
	}
	return v.Diff(img, framebuf.DefaultTile), nil
}

func (s *Session) scanout(ctx context.Context) (framebuf.Image, error) {
	if !s.cfg.GPU {
		return framebuf.Image{}, errNoGPU
	}
	select {
	case <-s.ready:
	default:
		return framebuf.Image{}, errors.New("the display is not up yet: the sandbox is still starting")
	}
	ppm, err := s.machine.Screendump(ctx)
	if err != nil {
		return framebuf.Image{}, fmt.Errorf("reading the display: %w", err)
	}
	img, err := framebuf.ParsePPM(ppm)
	if err != nil {
		return framebuf.Image{}, fmt.Errorf("the engine's screendump: %w", err)
	}
	return img, nil
}
