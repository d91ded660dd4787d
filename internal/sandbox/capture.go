package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine/qemu"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// DefaultSnapshotName is where __snapshot__ and __park__ write without a
// path argument, inside the transfer jail.
const DefaultSnapshotName = "nether.snap"

// quiescentWait bounds how long the gate waits for the channel to settle
// (a command that just finished may still owe an acknowledgement).
const quiescentWait = 300 * time.Millisecond

// Snapshot implements control.Backend: capture a base and keep running.
func (s *Sandbox) Snapshot(ctx context.Context, rel string) (string, error) {
	res, err := s.capture(ctx, rel, snapshot.KindBase)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("OK snapshot %s kind=base pause_ms=%d ram=%s", res.rel, res.pause.Milliseconds(), res.mode), nil
}

// Park implements control.Backend: capture a one-shot park and end the
// session. The guest never runs again in this process.
func (s *Sandbox) Park(ctx context.Context, rel string) (string, error) {
	res, err := s.capture(ctx, rel, snapshot.KindPark)
	if err != nil {
		return "", err
	}
	bill := s.meter.Read()
	return fmt.Sprintf("OK parked %s pause_ms=%d %s", res.rel, res.pause.Milliseconds(), bill.Fields()), nil
}

// FinishPark implements control.Backend: called once the park's reply is
// written, it ends the process with reason=park.
func (s *Sandbox) FinishPark() { s.stop(meter.ReasonPark) }

type captureResult struct {
	rel   string
	pause time.Duration
	mode  snapshot.RAMMode
}

// capture writes an artifact. Order matters:
//
//  1. the quiescence gate (fail closed unless the config opts out);
//  2. freeze the channel and let QEMU drain what we already wrote, so the
//     paused guest's memory cannot change under the copy;
//  3. pause, capture the channel state, the device state and the RAM;
//  4. resume (base) or halt for good (park);
//  5. commit: checksums, metadata, fsync, marker last, rename into place.
//
// Any failure removes the partial artifact; a base capture that fails
// leaves the sandbox running as before.
func (s *Sandbox) capture(ctx context.Context, rel string, kind snapshot.Kind) (captureResult, error) {
	s.captureMu.Lock()
	defer s.captureMu.Unlock()
	if rel == "" {
		rel = DefaultSnapshotName
	}
	res := captureResult{rel: rel}
	dirty := s.cfg.SnapshotAllowDirty
	if kind == snapshot.KindPark {
		dirty = s.cfg.ParkDirty
	}
	if err := s.quiescent(ctx); err != nil {
		if !dirty {
			opt := "snapshot_allow_dirty=1"
			if kind == snapshot.KindPark {
				opt = "park_dirty=1"
			}
			return res, fmt.Errorf("guest not quiescent: %v (set %s to capture anyway)", err, opt)
		}
		s.log.Warn("capturing a guest that is not quiescent, as configured", "kind", kind, "why", err)
	}
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
	stateFile, err := w.CreateFile("state")
	if err != nil {
		return res, err
	}
	defer stateFile.Close()
	memPath, shared := s.m.RAMFile()
	res.mode = snapshot.RAMStream
	var ramFile *os.File
	if shared {
		res.mode = snapshot.RAMFile
		if ramFile, err = w.CreateFile("ram"); err != nil {
			return res, err
		}
		defer ramFile.Close()
	}

	// 2-3: freeze, drain, pause, capture.
	start := time.Now()
	s.mux.Freeze()
	drainSocket(s.m.ChannelConn(), 100*time.Millisecond)
	if err := s.m.Pause(ctx); err != nil {
		s.mux.Thaw()
		return res, fmt.Errorf("pausing the guest: %w", err)
	}
	// Whatever happens from here, a base resumes, and so does a park that
	// failed before it was committed: the session goes on as if it had
	// not been asked.
	resumed := false
	resumeGuest := func() {
		if !resumed {
			resumed = true
			if err := s.m.Resume(context.Background()); err != nil {
				s.log.Error("resuming after a capture failed", "err", err)
			}
			s.mux.Thaw()
		}
	}
	fail := func(err error) (captureResult, error) {
		resumeGuest()
		return res, err
	}
	paused := time.Now()
	chState := s.mux.State()
	chJSON, err := chState.Marshal()
	if err != nil {
		return fail(fmt.Errorf("encoding channel state: %w", err))
	}
	if err := s.m.SaveState(ctx, stateFile); err != nil {
		return fail(fmt.Errorf("saving device state: %w", err))
	}
	saved := time.Now()
	var ramBytes int64
	if shared {
		mem, err := os.Open(memPath)
		if err != nil {
			return fail(fmt.Errorf("opening guest memory: %w", err))
		}
		ramBytes, err = qemu.CopySparse(ramFile, mem)
		mem.Close()
		if err != nil {
			return fail(fmt.Errorf("copying guest memory: %w", err))
		}
	}
	copied := time.Now()
	if kind == snapshot.KindBase {
		resumeGuest()
	}
	res.pause = time.Since(start)
	s.log.Info("capture pause", "kind", kind, "pause_ms", res.pause.Milliseconds(),
		"drain_and_stop_ms", paused.Sub(start).Milliseconds(), "device_state_ms", saved.Sub(paused).Milliseconds(),
		"ram_copy_ms", copied.Sub(saved).Milliseconds(), "ram_bytes", ramBytes)

	// 5: commit (checksums and fsync happen here, with the guest running
	// again for a base).
	fp, err := s.fingerprint()
	if err != nil {
		return fail(err)
	}
	meta := &snapshot.Meta{
		Format:      snapshot.FormatVersion,
		Kind:        kind,
		Created:     time.Now().UTC(),
		Fingerprint: fp,
		RAMMode:     res.mode,
		Channel:     chJSON,
		VMGenID:     s.m.VMGenID(),
		Identity:    s.identity,
		PauseMS:     res.pause.Milliseconds(),
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

// quiescent is the capture gate: the agent is up, no stream is open (no
// command or transfer in flight, from any client) and every frame we sent
// has been acknowledged. A command that just ended may owe an
// acknowledgement for a moment, so the gate waits briefly for that.
func (s *Sandbox) quiescent(ctx context.Context) error {
	select {
	case <-s.agentUp:
	default:
		return errors.New("the guest agent is not connected")
	}
	deadline := time.Now().Add(quiescentWait)
	for {
		ok, why := s.mux.Settled()
		if ok {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New(why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// drainSocket waits until the kernel has handed QEMU every byte we wrote
// to the channel socket, so a paused QEMU has nothing left to push into
// guest memory while we copy it.
func drainSocket(c net.Conn, limit time.Duration) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		pending := 0
		raw.Control(func(fd uintptr) {
			pending, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		})
		if pending == 0 {
			return
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// fingerprint is everything a restore of this machine must match.
func (s *Sandbox) fingerprint() (snapshot.Fingerprint, error) {
	info := s.m.Info()
	kernel, err := s.digests.of(s.kernel)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	image, err := s.digests.of(s.image)
	if err != nil {
		return snapshot.Fingerprint{}, err
	}
	return snapshot.Fingerprint{
		Engine: info.Backend, EngineVersion: info.Version, Machine: info.Machine,
		Accel: string(info.Accel), KernelSHA256: kernel, ImageSHA256: image,
		CPUs: s.cfg.CPUs, RAMMB: s.cfg.RAMMB,
	}, nil
}
