package session

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// DefaultSnapshotName is where __snapshot__ and __park__ write without a
// path argument, inside the transfer jail.
const DefaultSnapshotName = "nether.snap"

// quiescentWait bounds how long the gate waits for the components to
// settle (a command that just finished may still owe an acknowledgement);
// drainWait how long a park waits for host-side buffers to drain.
const (
	quiescentWait = 300 * time.Millisecond
	drainWait     = time.Second
)

// captureTimeout bounds a whole capture: device state and a sparse RAM
// copy of a few GiB take seconds, never minutes.
const captureTimeout = 2 * time.Minute

// Snapshot implements control.Backend: capture a base and keep running.
func (s *Session) Snapshot(ctx context.Context, rel string) (string, error) {
	res, err := s.capture(ctx, rel, snapshot.KindBase)
	if err != nil {
		s.life("snapshot failed path=%s: %v", res.rel, err)
		return "", err
	}
	s.life("snapshot path=%s pause_ms=%d ram=%s", res.rel, res.pause.Milliseconds(), res.mode)
	return fmt.Sprintf("OK snapshot %s kind=base pause_ms=%d ram=%s", res.rel, res.pause.Milliseconds(), res.mode), nil
}

// Park implements control.Backend: capture a one-shot park and end the
// session. The guest never runs again in this process. The reply carries
// the session's bill with the field names of __stats__.
func (s *Session) Park(ctx context.Context, rel string) (string, error) {
	res, err := s.capture(ctx, rel, snapshot.KindPark)
	if err != nil {
		s.life("park failed path=%s: %v", res.rel, err)
		return "", err
	}
	s.life("park path=%s pause_ms=%d", res.rel, res.pause.Milliseconds())
	// The bill is settled here: the final record of this session carries
	// exactly the same figures.
	bill := strings.Join(strings.Fields(s.meter.Settle().Stats()), " ")
	return fmt.Sprintf("OK parked %s pause_ms=%d %s", res.rel, res.pause.Milliseconds(), bill), nil
}

// FinishPark implements control.Backend: called once the park's reply is
// written, it ends the process with reason=park.
func (s *Session) FinishPark() { s.stop(meter.ReasonPark) }

type captureResult struct {
	rel   string
	pause time.Duration
	mode  snapshot.RAMMode
}

// capture writes an artifact. Order matters:
//
//  1. the gates: quiescence (no work in flight; snapshot_allow_dirty=1
//     overrides it, for both kinds) and, for a park, the drain gate (no
//     host-side bytes owed to the guest; park_dirty=1 overrides only that);
//  2. the engine's precopy, when it has one: the bulk of the capture
//     while the guest runs (it may stop the guest to finish);
//  3. freeze the components, so the paused guest's memory and their state
//     agree, and pause the engine (which drains what we already wrote);
//  4. save every component's section and the engine's capture (what
//     changed since the precopy);
//  5. resume (base) or halt for good (park);
//  6. commit: checksums, metadata, fsync, marker last, rename into place.
//
// Any failure removes the partial artifact; a base capture that fails
// leaves the sandbox running as before. The capture gives up when the
// session stops (after a grace period) or when ctx ends.
func (s *Session) capture(ctx context.Context, rel string, kind snapshot.Kind) (captureResult, error) {
	s.captureMu.Lock()
	defer s.captureMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, captureTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	if rel == "" {
		rel = DefaultSnapshotName
	}
	res := captureResult{rel: rel}
	select {
	case <-s.agent.Up():
	default:
		return res, errors.New("guest not quiescent: the guest agent is not connected")
	}
	if err := waitGate(ctx, quiescentWait, s.comps.quiescent); err != nil {
		if !s.cfg.SnapshotAllowDirty {
			return res, fmt.Errorf("guest not quiescent: %v (set snapshot_allow_dirty=1 to capture anyway)", err)
		}
		s.log.Warn("capturing a guest that is not quiescent, as configured", "kind", kind, "why", err)
	}
	if kind == snapshot.KindPark {
		// The drain gate: bytes a component holds for the guest on the
		// host side cannot cross a park.
		if err := waitGate(ctx, drainWait, s.comps.drained); err != nil {
			if !s.cfg.ParkDirty {
				return res, fmt.Errorf("undelivered bytes: %v (set park_dirty=1 to park anyway and lose them)", err)
			}
			s.log.Warn("parking with undelivered bytes, as configured (park_dirty=1)", "why", err)
		}
	}
	giveBack, err := s.withdrawSecrets(ctx, kind)
	if err != nil {
		return res, err
	}
	defer giveBack() // a capture that failed on the way
	parent, base, err := s.jail.OpenParent(rel)
	if err != nil {
		return res, err
	}
	defer parent.Close()
	w, err := snapshot.Create(parent, base)
	if err != nil {
		return res, err
	}
	committed := false
	defer func() {
		if !committed {
			w.Abort()
		}
	}()

	// 2: what the engine can copy while the guest runs.
	var pausedAt time.Time
	var precopy time.Duration
	abortPrecopy := func() {}
	if pc, ok := s.machine.(engine.Precopier); ok {
		t := time.Now()
		if pausedAt, err = pc.Precopy(ctx, w); err != nil {
			return res, fmt.Errorf("capturing: %w", err)
		}
		precopy = time.Since(t)
		abortPrecopy = pc.AbortPrecopy
		defer abortPrecopy() // nothing once Capture finished it
		// A command that began while the guest ran on is work in
		// flight: the gate, again, without a wait.
		if err := s.comps.quiescent(); err != nil && !s.cfg.SnapshotAllowDirty {
			abortPrecopy()
			return res, fmt.Errorf("guest not quiescent: %v (set snapshot_allow_dirty=1 to capture anyway)", err)
		}
	}

	// 3-4: freeze, pause, capture. The pause counts from the engine's
	// own stop when it stopped the guest first.
	start := time.Now()
	if !pausedAt.IsZero() && pausedAt.Before(start) {
		start = pausedAt
	}
	s.comps.freeze()
	if kind == snapshot.KindPark && !s.cfg.ParkDirty {
		// Bytes that reached a bridge between the gate and the freeze
		// would be lost with the park: the gate, again, without a wait.
		if err := s.comps.drained(); err != nil {
			abortPrecopy()
			s.comps.thaw()
			return res, fmt.Errorf("undelivered bytes: %v (set park_dirty=1 to park anyway and lose them)", err)
		}
	}
	if err := s.machine.Pause(ctx); err != nil {
		abortPrecopy()
		s.comps.thaw()
		return res, fmt.Errorf("pausing the guest: %w", err)
	}
	// Whatever happens from here, a base resumes, and so does a park that
	// failed before it was committed: the session goes on as if it had
	// not been asked.
	resumed := false
	resumeGuest := func() {
		if !resumed {
			resumed = true
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := s.machine.Resume(rctx); err != nil {
				s.log.Error("resuming after a capture failed", "err", err)
			}
			s.comps.thaw()
			s.syncClock(rctx)
		}
	}
	fail := func(err error) (captureResult, error) {
		abortPrecopy()
		resumeGuest()
		return res, err
	}
	paused := time.Now()
	sections := map[string]snapshot.Section{}
	s.diskComp.kind = kind
	if err := s.comps.save(sections); err != nil {
		return fail(err)
	}
	captured, err := s.machine.Capture(ctx, w)
	if err != nil {
		return fail(err)
	}
	sections[snapshot.SectionEngine] = snapshot.Section(captured.Section)
	// The disk as it is now, copied while the guest runs on (a base):
	// its memory and its disk agree in every fork.
	diskCopied, err := s.startDiskCapture(ctx, kind, w)
	if err != nil {
		return fail(err)
	}
	res.mode = snapshot.RAMStream
	if captured.RAMInFile {
		res.mode = snapshot.RAMFile
	}
	if kind == snapshot.KindBase {
		resumeGuest()
		giveBack() // now: the tenant's gap ends before the commit's fsyncs
	}
	res.pause = time.Since(start)
	diskStart := time.Now()
	if err := diskCopied(ctx); err != nil {
		return fail(fmt.Errorf("capturing the disk: %w", err))
	}
	if s.diskPath != "" && kind == snapshot.KindBase {
		s.log.Info("disk captured", "copy_ms", time.Since(diskStart).Milliseconds())
	}
	s.log.Info("capture pause", "kind", kind, "pause_ms", res.pause.Milliseconds(), "precopy_ms", precopy.Milliseconds(),
		"drain_and_stop_ms", paused.Sub(start).Milliseconds(), "device_state_ms", captured.DeviceState.Milliseconds(),
		"ram_copy_ms", captured.RAMCopy.Milliseconds(), "ram_bytes", captured.RAMBytes)

	// 6: commit (checksums and fsync happen here, with the guest running
	// again for a base).
	v := s.getView()
	fp, err := s.fingerprintWith(s.machine.Info(), v.accel)
	if err != nil {
		return fail(err)
	}
	meta := &snapshot.Meta{
		Format:      snapshot.FormatVersion,
		Kind:        kind,
		Created:     time.Now().UTC(),
		Fingerprint: fp,
		RAMMode:     res.mode,
		Identity:    v.identity,
		PauseMS:     res.pause.Milliseconds(),
		Sections:    sections,
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("capture cancelled: %w", context.Cause(ctx)))
	}
	if err := w.Commit(meta); err != nil {
		return fail(fmt.Errorf("committing snapshot %s: %w", rel, err))
	}
	committed = true
	if kind == snapshot.KindPark {
		// Nothing may leave the channel now: the artifact holds its future.
		s.mux.Halt()
	}
	s.log.Info("snapshot captured", "kind", kind, "path", rel, "pause_ms", res.pause.Milliseconds(), "ram", res.mode)
	return res, nil
}

// portPad is the filler a capture sends before withdrawing secrets:
// twice the guest's virtio-serial receive buffers (QEMU gives a port's
// input queue 128 entries, the guest driver a page to each).
const portPad = 2 * 128 * 4096

// withdrawSecrets empties the guest's /run/secrets before a base is
// captured and returns what gives them back (once: later calls do
// nothing), to be called as soon as the guest runs on. A base is only
// ever restored as a fork, whose handshake empties /run/secrets anyway:
// the secrets in a base serve no one, and would be there for any fork
// to read in its memory. The tenant finds /run/secrets empty for the
// capture's length. A park keeps them (its wake is the same sandbox), and
// so does a base of a guest that holds secrets this process never had:
// a park woken without new ones keeps those it parked with, and nether
// cannot give them back.
func (s *Session) withdrawSecrets(ctx context.Context, kind snapshot.Kind) (func(), error) {
	if kind != snapshot.KindBase || len(s.opt.Secrets) == 0 {
		return func() {}, nil
	}
	done := false
	giveBack := func() {
		if done {
			return
		}
		done = true
		// Even when the capture was cancelled: the sandbox goes on.
		gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		req := agentproto.Request{Secrets: s.opt.Secrets}
		if err := s.agent.Provision(gctx, req); err != nil {
			s.log.Error("giving the guest its secrets back after a capture", "names", agentproto.SecretNames(req.Secrets), "err", err)
			s.life("secrets not given back after the capture: %v", err)
			return
		}
		s.log.Info("secrets given back after the capture", "names", agentproto.SecretNames(req.Secrets))
	}
	// The port's receive buffers still hold the frame that delivered
	// them (guest pages, reused in turn): filler through every one of
	// them first, which the withdrawal's answer comes after.
	s.mux.Pad(portPad)
	if err := s.agent.Withdraw(ctx); err != nil {
		giveBack() // some may be gone
		return nil, fmt.Errorf("the guest still holds its secrets, which a base must not: %w", err)
	}
	// The withdrawal's frames settle like any command's.
	if err := waitGate(ctx, quiescentWait, s.comps.quiescent); err != nil && !s.cfg.SnapshotAllowDirty {
		giveBack()
		return nil, fmt.Errorf("guest not quiescent: %v (set snapshot_allow_dirty=1 to capture anyway)", err)
	}
	return giveBack, nil
}

// waitGate polls a capture gate until it passes or wait runs out (a
// command that just ended may still owe an acknowledgement for a moment).
func waitGate(ctx context.Context, wait time.Duration, gate func() error) error {
	deadline := time.Now().Add(wait)
	for {
		err := gate()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ engine.Sink = (*snapshot.Writer)(nil)

// syncClock sets the guest's wall clock to the host's after a pause: the
// guest's clocks stand still while it is paused (QEMU stops its time
// source), so a sandbox that keeps running after a capture would fall
// behind by each pause, 20-60 ms a snapshot. A restore, a wake and a
// claim set the clock in their handshake instead. A guest whose agent
// predates OpClock keeps its clock, as before; that is logged, not fatal.
func (s *Session) syncClock(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := s.agent.SetClock(ctx); err != nil {
		s.log.Warn("the guest's wall clock could not be corrected after the pause", "err", err)
	}
}
