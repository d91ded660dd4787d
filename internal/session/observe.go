package session

import (
	"fmt"

	"github.com/nethersandbox/nether/internal/cmdlog"
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

// watchAgent records when the guest agent comes up.
func (s *Session) watchAgent() {
	select {
	case <-s.agent.Up():
		s.life("agent_up")
	case <-s.ctx.Done():
	}
}
