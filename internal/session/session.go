// Package session is one nether process: a sandbox from its boot or
// restore to exactly one final usage record, whatever stops it. It owns
// a root context that stop, a signal or the engine's death cancels; every
// wait on the guest hangs from it or has a deadline.
//
// The work is split by job: this file is the lifecycle; machine.go the one
// path that assembles a machine (boot and restore share it); capture.go
// snapshots and parks; component.go the state that crosses a capture; the
// agent client (internal/agentclient) speaks to the guest.
package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/internal/agentclient"
	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/cmdlog"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/consolelog"
	"github.com/nethersandbox/nether/internal/control"
	"github.com/nethersandbox/nether/internal/disk"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/jail"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/netlog"
	"github.com/nethersandbox/nether/internal/netstack"
	"github.com/nethersandbox/nether/internal/plane"
	"github.com/nethersandbox/nether/internal/screen"
	"github.com/nethersandbox/nether/internal/snapshot"
	"github.com/nethersandbox/nether/internal/timeline"
)

// ConsoleLog is the file in the launch directory the serial console always
// goes to.
const ConsoleLog = "console.log"

// Timeouts of the stop path. A SIGTERM ends the process within about
// captureGrace + powerOffWait + the engine's own quit bound, even with a
// frozen engine.
const (
	// captureGrace is how long a stop lets a capture in progress commit
	// before cancelling it (a cancelled capture removes its partial
	// artifact).
	captureGrace = 2 * time.Second
	// powerOffWait is how long the guest gets to power off cleanly, once
	// its agent acknowledged the request within powerOffAck.
	powerOffWait = 4 * time.Second
	powerOffAck  = time.Second
	// handshakeTimeout bounds the post-restore handshake: a healthy agent
	// answers in milliseconds, even under TCG.
	handshakeTimeout = 20 * time.Second
	// channelSilence is how long the guest may send nothing at all on
	// the channel while nether waits for an answer (a keepalive goes
	// after a fifth of it) before the channel is declared dead and the
	// sandbox ends with reason=error. A healthy agent acknowledges within
	// milliseconds, even under TCG on a loaded host; silence this long
	// means the guest can no longer be driven (it removed the channel's
	// device, or its agent no longer runs).
	channelSilence = 10 * time.Second
)

// Options are the process-level inputs of a session.
type Options struct {
	Config *conf.Config
	Engine engine.Engine
	Log    *slog.Logger
	Stdout io.Writer // the final usage record, and the console in console mode
	Stdin  io.Reader // console input in console mode (may be nil)
	// GuestDir holds the default kernel and image (vmlinux,
	// initramfs.cpio) that setup built.
	GuestDir string
	// Signals delivers SIGTERM/SIGINT; nil means the process's own.
	Signals <-chan os.Signal
	// TempDir is where run directories go; "" is os.TempDir().
	TempDir string
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// HandshakeTimeout and PowerOffWait override the defaults
	// (handshakeTimeout, powerOffWait); tests shorten them.
	HandshakeTimeout time.Duration
	PowerOffWait     time.Duration
	// ChannelSilence overrides channelSilence; tests shorten it.
	ChannelSilence time.Duration
	// Verified remembers the artifacts this host verified in full, so a
	// restore of an unchanged one does not read all of it again; nil
	// verifies every restore in full. validate_snapshot always does.
	Verified *snapshot.VerifiedCache
	// Unobserved turns the event timeline and the command log off (their
	// commands answer a framed ERR). It exists to measure what
	// observation costs (bench/observe builds nether with the
	// nether_unobserved tag); a platform has no reason to set it.
	Unobserved bool
	// Secrets are the sandbox's secrets (read from nether.conf's
	// secrets_fd), delivered to the guest's /run/secrets after the boot
	// or in the restore handshake, before the first command.
	Secrets agentproto.Secrets
	// installed, when set, is called with the session once its machine
	// is installed: the unit tests' way to the channel, to send what a
	// host of an older session would. Nothing else sets it.
	installed func(*Session)
}

// Session is a running sandbox.
type Session struct {
	opt   Options
	cfg   *conf.Config
	log   *slog.Logger
	meter *meter.Meter
	jail  *jail.Jail
	ctl   *control.Server

	ctx    context.Context // the root context
	cancel context.CancelCauseFunc

	kernel, image string
	rootImage     string // "" without one (rootfs = busybox)
	digests       *guestimage.Digests
	art           *snapshot.Artifact // the artifact a restore starts from
	// diskPath is the persistent disk's host file ("" without one), set
	// by assemble; diskLock holds it for the session's life.
	diskPath string
	diskLock atomic.Pointer[disk.Lock]
	diskComp *diskComponent
	// forkLayer is the disk layer this restore made ("" if none): removed
	// again when the restore fails.
	forkLayer string

	// Set once by assemble, before ready is closed; read freely after.
	machine engine.Machine
	mux     *channel.Mux
	agent   *agentclient.Client
	comps   components
	console *consolelog.Writer // set once the console pump runs
	events  *timeline.Timeline // __events__
	cmds    *cmdlog.Log        // __cmdlog__
	term    *screen.Terminal   // the console's terminal (__screen__); nil in console mode
	flows   *netlog.Log        // __netlog__; nil without a network
	net     *netstack.Stack    // set by assemble when net = 1
	// The data and egress planes, made before assembly (startPlanes);
	// nil in console mode. The ports are the effective ones: nether.conf's,
	// else the restored artifact's.
	planes                                  *plane.Planes
	appPort, egressPort, capturedEgressPort int
	netComp                                 *netComponent
	// consoleDone closes when the console pump has read the console to
	// its end; set by assemble with the machine.
	consoleDone <-chan struct{}
	ready       chan struct{}
	// restored is closed once a restore has finished: the handshake is
	// done and the guest's egress listener set as nether.conf wants. A
	// claim is refused before.
	restored chan struct{}

	mu   sync.Mutex // guards view
	view view       // what __info__ reports; changes as the session assembles

	stopCh    chan stopRequest
	stopOnce  sync.Once
	captureMu sync.Mutex // one capture at a time; the stop path takes it too
}

// view is the session's public face, read by __info__ while the machine
// is still assembling.
type view struct {
	engine   engine.Info
	accel    engine.Accel
	identity snapshot.Identity
	snapshot string // the artifact restored from, "" for a boot
	parent   string
	claimed  bool   // a __claim__ gave this fork its identity
	runAs    string // the guest's run_as policy: "" = root
	disk     string // the persistent disk's host file, "" without one
	boot     bootIdentity
}

// bootIdentity is what identifies this boot (restore, wake, claim) of
// the sandbox beyond its id: never captured, handed to the guest fresh
// each time (agentproto.Identity).
type bootIdentity struct {
	nodeID, bootID, planDigest, token string
}

// errStopping is the cause of the root context's cancellation.
var errStopping = errors.New("nether is stopping")

// Run runs a session to its end and returns the process exit code.
func Run(opt Options) int {
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.HandshakeTimeout == 0 {
		opt.HandshakeTimeout = handshakeTimeout
	}
	if opt.PowerOffWait == 0 {
		opt.PowerOffWait = powerOffWait
	}
	s := &Session{
		opt: opt, cfg: opt.Config, log: opt.Log,
		stopCh: make(chan stopRequest, 1), ready: make(chan struct{}), restored: make(chan struct{}),
	}
	s.meter = meter.New(opt.Now, s.cfg.RAMMB, s.cfg.CPUs)
	// Who the sandbox is is known before anything starts, so __info__
	// says it from the first moment.
	s.view.identity = sandboxIdentity(s.cfg)
	s.view.boot = bootIdentity{nodeID: s.cfg.NodeID, bootID: s.cfg.BootID, planDigest: s.cfg.PlanDigest, token: s.cfg.IdentityToken}
	if s.view.boot.bootID == "" {
		s.view.boot.bootID = ulid.Make().String()
	}
	if !s.cfg.Restore {
		s.view.disk = s.cfg.Disk
		if s.cfg.RunAs != "root" {
			s.view.runAs = s.cfg.RunAs
		}
	}
	s.newObservation()
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	reason, err := s.run()
	s.cancel(errStopping)
	rec := s.meter.Read()
	if err != nil {
		s.log.Error("nether stopped on an error", "err", err)
	}
	fmt.Fprintln(opt.Stdout, meter.FinalLine(reason, s.cfg.X402, rec))
	switch reason {
	case meter.ReasonError, meter.ReasonGuestPanic, meter.ReasonGuestCrash:
		return 1
	}
	return 0
}

func (s *Session) run() (reason string, err error) {
	sigs := s.opt.Signals
	if sigs == nil {
		ch := make(chan os.Signal, 2)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(ch)
		sigs = ch
	}
	// A client that disconnects mid-write must never kill nether.
	signal.Ignore(syscall.SIGPIPE)

	consoleMode := s.cfg.ControlSocket == ""
	if consoleMode && s.cfg.Restore {
		return meter.ReasonError, errors.New("restore=1 needs control_socket: a restored sandbox is driven over its control socket")
	}
	if s.cfg.Restore {
		if err := s.openRestore(); err != nil {
			return meter.ReasonError, err
		}
	}
	s.lifeStart()
	if !consoleMode {
		j, err := jail.Open(s.cfg.Dir)
		if err != nil {
			return meter.ReasonError, fmt.Errorf("pinning the transfer jail: %w", err)
		}
		s.jail = j
		defer j.Close()
		// A transfer must never replace what nether itself reads or
		// writes in the launch directory, nor read it: a __get__ onto
		// nether.conf would choose the next run's configuration, one onto
		// console.log forge its log, a __put__ of nether.conf would show
		// the guest its identity token.
		j.Protect(conf.FileName, ConsoleLog)
		// Nor nether's own stdout and stderr, when they are files: an
		// orchestrator bills from the final record on stdout (nexus's
		// nether.out) and reads the log on stderr (nether.log), and a
		// transfer must neither forge them nor carry them into the guest.
		for _, fd := range []int{1, 2} {
			if err := j.ProtectFD(fd); err != nil {
				s.log.Warn("cannot protect an output of nether from transfers", "fd", fd, "err", err)
			}
		}
		if filepath.Dir(s.cfg.ControlSocket) == filepath.Clean(s.cfg.Dir) {
			j.Protect(filepath.Base(s.cfg.ControlSocket))
		}
		// Nor the disk the guest is writing (a fork's layer lives in the
		// launch directory by default).
		if d := s.getView().disk; d != "" && filepath.Dir(d) == filepath.Clean(s.cfg.Dir) {
			j.Protect(filepath.Base(d))
		}
		s.term = screen.New(screenCols, screenRows, screenScrollback)
		defer s.term.Close()
		s.ctl = control.New(s.log, s, s.meter, s.cfg.MaxOutputBytes)
		s.ctl.Observe = control.Observe{Events: s.events, Commands: s.cmds, Flows: s.flows}
		if err := s.ctl.Listen(s.cfg.ControlSocket); err != nil {
			return meter.ReasonError, err
		}
		defer s.ctl.Close()
		if err := s.startPlanes(); err != nil {
			return meter.ReasonError, err
		}
		// Closed after the machine is gone (deferred before it): the
		// platform's connections end with the guest.
		defer s.planes.Close()
		go s.ctl.Serve(s.ctx)
		s.log.Info("control socket ready", "path", s.cfg.ControlSocket)
	}

	go s.govern()

	// Assembly runs beside the wait for signals and stop requests, so a
	// SIGTERM during a boot or a restore ends the process as promptly as
	// one later on: it cancels the root context, and every wait inside
	// assembly gives up.
	assembled := make(chan error, 1)
	go func() { assembled <- s.assemble(consoleMode) }()
	// Deferred first, so it runs last: the host sockets of the guest's
	// flows close once the guest is gone.
	defer s.stopNetwork()
	defer s.releaseDisk()
	defer s.quitMachine()

	var engineDone <-chan struct{}
	var consoleDone <-chan struct{}
	for engineDone == nil {
		select {
		case err := <-assembled:
			if err != nil {
				// Clients waiting for the agent learn why it never came.
				s.stopControl("start failed: " + err.Error())
				return meter.ReasonError, err
			}
			engineDone, consoleDone = s.machine.Done(), s.consoleDone
		case sig := <-sigs:
			return s.stopDuringAssembly(stopRequest{reason: signalReason(sig)}, assembled)
		case r := <-s.stopCh:
			return s.stopDuringAssembly(r, assembled)
		}
	}

	select {
	case <-engineDone:
		<-consoleDone
		reason, err := s.endReason(s.machine.Err())
		s.life("stopping reason=%s", reason)
		s.stopControl(stopRequest{reason, err}.why())
		// A capture the engine's death interrupted removes its partial
		// artifact before the process ends.
		s.holdCaptures()
		s.captureMu.Unlock()
		return reason, err
	case sig := <-sigs:
		reason = signalReason(sig)
		s.log.Info("signal received; stopping", "signal", sig)
		s.life("stopping reason=%s", reason)
	case r := <-s.stopCh:
		reason, err = r.reason, r.err
	}
	s.teardown(stopRequest{reason, err})
	<-consoleDone
	return reason, err
}

// endReason names how a machine that ended by itself ended: a power-off
// the guest asked for, or a crash, which the console tells apart from a
// panic.
func (s *Session) endReason(err error) (string, error) {
	switch {
	case err == nil:
		return meter.ReasonPoweroff, nil
	case errors.Is(err, engine.ErrGuestPanic):
		return meter.ReasonGuestPanic, fmt.Errorf("%w (the console log has its last words)", err)
	case errors.Is(err, engine.ErrGuestReset):
		if bytes.Contains(s.console.Tail(), []byte("Kernel panic")) {
			return meter.ReasonGuestPanic, fmt.Errorf("%w: the console shows a kernel panic (see %s)", engine.ErrGuestPanic, ConsoleLog)
		}
		return meter.ReasonGuestCrash, fmt.Errorf("%w (see %s)", err, ConsoleLog)
	}
	return meter.ReasonError, err
}

func signalReason(sig os.Signal) string {
	if sig == os.Interrupt {
		return meter.ReasonSIGINT
	}
	return meter.ReasonSIGTERM
}

// stopDuringAssembly ends a session whose machine is not up yet: cancel
// everything, wait (bounded, since every wait in assembly is) for the
// assembly to give up, and let the deferred quit stop whatever started.
func (s *Session) stopDuringAssembly(r stopRequest, assembled <-chan error) (string, error) {
	s.log.Info("stopping while the sandbox is still starting", "reason", r.reason)
	s.stopControl(r.why())
	s.cancel(errStopping)
	<-assembled
	return r.reason, r.err
}

// teardown is an orderly stop of a running machine: close the control
// socket first so nobody starts new work, let a capture in progress commit
// or clean up after itself (a SIGTERM must not leave half an artifact, and
// a wedged engine must not hold the stop), then ask the guest to power
// off, then make sure it is gone.
func (s *Session) teardown(r stopRequest) {
	s.stopControl(r.why())
	s.holdCaptures()
	defer s.captureMu.Unlock()
	if r.reason == meter.ReasonPark {
		// The guest must never run again: its future is the park.
		s.quitMachine()
		return
	}
	s.powerOff(s.opt.PowerOffWait)
	s.cancel(errStopping)
}

// stopControl closes the control socket, answering every command still
// in flight with "ERR sandbox stopping: <why>" before its client goes.
func (s *Session) stopControl(why string) {
	if s.ctl != nil {
		s.ctl.Stop(why)
	}
}

// holdCaptures takes the capture lock, so no capture starts and none is
// left half done when the process ends: one in progress gets captureGrace
// to commit (or clean up after itself), then is cancelled and waited for.
func (s *Session) holdCaptures() {
	locked := make(chan struct{})
	go func() {
		s.captureMu.Lock()
		close(locked)
	}()
	select {
	case <-locked:
	case <-time.After(captureGrace):
		s.log.Warn("a capture in progress did not finish in time; cancelling it", "waited", captureGrace)
		s.cancel(errStopping)
		<-locked
	}
}

// powerOff asks the agent to power the guest off and waits for the engine
// to exit, then forces it. A guest that does not even acknowledge the
// request within powerOffAck (frozen, wedged) is stopped at once.
func (s *Session) powerOff(wait time.Duration) {
	select {
	case <-s.agent.Up():
	default:
		s.quitMachine()
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, powerOffAck)
	err := s.agent.PowerOff(ctx)
	cancel()
	if err != nil {
		s.log.Warn("the guest did not acknowledge the power-off; stopping the engine", "err", err)
		s.quitMachine()
		return
	}
	select {
	case <-s.machine.Done():
		return
	case <-time.After(wait):
		s.log.Warn("guest did not power off in time; stopping the engine", "waited", wait)
	}
	s.quitMachine()
}

// quitMachine stops the engine, if one started; safe to call repeatedly.
func (s *Session) quitMachine() {
	select {
	case <-s.ready:
		s.machine.Quit(s.ctx)
	default:
	}
}

// pumpConsole copies the serial console of m into console.log in the
// launch directory (bounded, and never pushing back on the guest), and in
// console mode to stdout too (with stdin going back in). It starts as soon
// as the engine does, so a guest writing to its console during a long boot
// or restore never waits for nether.
func (s *Session) pumpConsole(consoleMode bool, m engine.Machine) (<-chan struct{}, error) {
	logPath := filepath.Join(s.cfg.Dir, ConsoleLog)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_RDWR|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the console log: %w", err)
	}
	cl := consolelog.New(s.log, f, 0, s.cfg.ConsoleLogMaxBytes)
	s.console = cl
	var w io.Writer = cl
	if s.term != nil {
		// Both never fail and never block on the guest's bytes.
		w = io.MultiWriter(cl, s.term)
	}
	console := m.Console()
	if consoleMode {
		w = io.MultiWriter(cl, neverFail{s.opt.Stdout})
		if s.opt.Stdin != nil {
			go io.Copy(console, s.opt.Stdin)
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		io.Copy(w, console)
		if dropped, trimmed := cl.Stats(); dropped > 0 || trimmed > 0 {
			s.log.Info("console log totals", "dropped_bytes", dropped, "trimmed_bytes", trimmed)
		}
	}()
	return done, nil
}

// neverFail swallows write errors: the console pump must keep draining
// the guest even when stdout is gone.
type neverFail struct{ w io.Writer }

func (n neverFail) Write(p []byte) (int, error) {
	n.w.Write(p)
	return len(p), nil
}

// stop asks the session to end with reason; the first request wins.
func (s *Session) stop(reason string) { s.stopFor(stopRequest{reason: reason}) }

// fail ends the session on err, which nothing the session can do mends:
// reason=error (exit status 1), err in nether's log and in the ERR line
// of every command still in flight.
func (s *Session) fail(err error) { s.stopFor(stopRequest{meter.ReasonError, err}) }

func (s *Session) stopFor(r stopRequest) {
	s.stopOnce.Do(func() {
		s.life("stopping reason=%s", r.reason)
		s.stopCh <- r
	})
}

// stopRequest is a stop asked of run: its reason, and for a failure
// (fail) what failed.
type stopRequest struct {
	reason string
	err    error
}

// why is what the clients hear: "sandbox stopping: <why>".
func (r stopRequest) why() string {
	if r.err == nil {
		return r.reason
	}
	return r.reason + ": " + r.err.Error()
}

// setView updates what __info__ reports.
func (s *Session) setView(f func(v *view)) {
	s.mu.Lock()
	f(&s.view)
	s.mu.Unlock()
}

func (s *Session) getView() view {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.view
}
