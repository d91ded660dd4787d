package session

import (
	"time"

	"github.com/nethersandbox/nether/internal/meter"
)

// governTick is how often the budgets are checked: a budget ends the
// session well within a second of its limit.
const governTick = 200 * time.Millisecond

// govern ends the session when a budget of nether.conf runs out:
// max_runtime_s (wall clock since this session began, so a fork counts
// from its restore), max_cpu_s (the guest's host CPU time, as the final
// record counts it) and idle_timeout_s (no client connected and no command
// or transfer running, for that long). The stop goes through the normal
// teardown: commands in flight get "ERR sandbox stopping: <reason>", and
// the final record names the budget.
func (s *Session) govern() {
	cfg := s.cfg
	if cfg.MaxRuntimeS == 0 && cfg.MaxCPUS == 0 && (cfg.IdleTimeoutS == 0 || s.ctl == nil) {
		return
	}
	t := time.NewTicker(governTick)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if reason := s.budgetReached(); reason != "" {
			s.log.Info("a budget ran out; stopping", "reason", reason)
			s.life("budget reason=%s", reason)
			s.stop(reason)
			return
		}
	}
}

// budgetReached names the first budget that ran out, or "".
func (s *Session) budgetReached() string {
	cfg := s.cfg
	rec := s.meter.Read()
	switch {
	case cfg.MaxRuntimeS > 0 && rec.UptimeMS >= cfg.MaxRuntimeS*1000:
		return meter.ReasonMaxRuntime
	case cfg.MaxCPUS > 0 && rec.CPUMS >= cfg.MaxCPUS*1000:
		return meter.ReasonMaxCPU
	case cfg.IdleTimeoutS > 0 && s.ctl != nil && !s.planesBusy() && s.ctl.IdleFor(time.Now()) >= time.Duration(cfg.IdleTimeoutS)*time.Second:
		return meter.ReasonIdle
	}
	return ""
}
