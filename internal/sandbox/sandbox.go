// Package sandbox is one nether session: it boots the guest through an
// engine, connects the channel to the agent, serves the control socket and
// ends with exactly one final usage record, whatever stops it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/control"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/engine/qemu"
	"github.com/nethersandbox/nether/internal/jail"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/snapshot"
	"github.com/oklog/ulid/v2"
)

// ConsoleLog is the file in the launch directory the serial console always
// goes to.
const ConsoleLog = "console.log"

// Options are the process-level inputs of a session.
type Options struct {
	Config *conf.Config
	Log    *slog.Logger
	Stdout io.Writer // the final usage record, and the console in console mode
	Stdin  io.Reader // console input in console mode (may be nil)
	// GuestDir holds the default kernel and image (vmlinux,
	// initramfs.cpio) that setup built.
	GuestDir string
	// Signals delivers SIGTERM/SIGINT; nil means the process's own.
	Signals <-chan os.Signal
}

// Sandbox is a running session.
type Sandbox struct {
	opt   Options
	cfg   *conf.Config
	log   *slog.Logger
	meter *meter.Meter
	jail  *jail.Jail
	ctl   *control.Server
	m     *qemu.Machine
	mux   *channel.Mux
	accel engine.Accel

	agentUp   chan struct{}
	agentOnce sync.Once
	stopCh    chan string // a stop request carrying its reason
	stopOnce  sync.Once

	kernel, image string
	digests       *digests
	identity      snapshot.Identity
	captureMu     sync.Mutex // one capture at a time
}

// KernelCmdline is the guest kernel's command line. A restore passes the
// same one: QEMU's firmware tables must match the captured machine.
//
// quiet: every console byte is an emulated port write under TCG; no
// crypto self-tests, no PS/2 probing, no audit or AppArmor (nothing in the
// guest uses them): each shaves boot time.
func KernelCmdline(consoleMode bool) string {
	c := "console=ttyS0 quiet panic=-1 nether.hostname=sandbox cryptomgr.notests i8042.noaux i8042.nokbd audit=0 apparmor=0 no_timer_check"
	if consoleMode {
		c += " nether.console=1"
	}
	return c
}

// GuestFiles returns the kernel and image a configuration boots: its own
// kernel=/image= or what setup built in guestDir.
func GuestFiles(cfg *conf.Config, guestDir string) (kernel, image string) {
	kernel, image = cfg.Kernel, cfg.Image
	if kernel == "" {
		kernel = filepath.Join(guestDir, "vmlinux")
	}
	if image == "" {
		image = filepath.Join(guestDir, "initramfs.cpio")
	}
	return kernel, image
}

// Run runs a session to its end and returns the process exit code.
func Run(opt Options) int {
	s := &Sandbox{
		opt: opt, cfg: opt.Config, log: opt.Log,
		agentUp: make(chan struct{}), stopCh: make(chan string, 1),
	}
	s.meter = meter.New(time.Now, s.cfg.RAMMB, s.cfg.CPUs)
	reason, err := s.run()
	rec := s.meter.Read()
	if err != nil {
		s.log.Error("nether stopped on an error", "err", err)
	}
	fmt.Fprintln(opt.Stdout, meter.FinalLine(reason, s.cfg.X402, rec))
	if reason == meter.ReasonError {
		return 1
	}
	return 0
}

func (s *Sandbox) run() (reason string, err error) {
	accel, why, err := engine.ResolveAccel(engine.Accel(s.cfg.Accel), engine.ReadHostFacts())
	if err != nil {
		return meter.ReasonError, err
	}
	s.accel = accel
	s.log.Info("accelerator chosen", "accel", accel, "why", why)

	s.kernel, s.image = GuestFiles(s.cfg, s.opt.GuestDir)
	s.digests = newDigests(s.opt.GuestDir)
	s.identity = snapshot.Identity{SandboxID: ulid.Make().String(), Hostname: "sandbox", TrustClass: "default"}

	runDir, err := os.MkdirTemp("", "nether-run-")
	if err != nil {
		return meter.ReasonError, fmt.Errorf("creating run directory: %w", err)
	}
	defer os.RemoveAll(runDir)
	memDir := runDir
	// Guest RAM on tmpfs stays out of disk writeback.
	if d, err := os.MkdirTemp("/dev/shm", "nether-mem-"); err == nil {
		memDir = d
		defer os.RemoveAll(d)
	}

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
	if !consoleMode {
		j, err := jail.Open(s.cfg.Dir)
		if err != nil {
			return meter.ReasonError, fmt.Errorf("pinning the transfer jail: %w", err)
		}
		s.jail = j
		defer j.Close()
		s.ctl = control.New(s.log, s, s.meter, s.cfg.MaxOutputBytes)
		if err := s.ctl.Listen(s.cfg.ControlSocket); err != nil {
			return meter.ReasonError, err
		}
		defer s.ctl.Close()
		go s.ctl.Serve()
		s.log.Info("control socket ready", "path", s.cfg.ControlSocket)
	}

	cmdline := KernelCmdline(consoleMode)
	ctx := context.Background()
	spec := engine.Spec{
		CPUs: s.cfg.CPUs, RAMMB: s.cfg.RAMMB, Accel: accel,
		Kernel: s.kernel, Initrd: s.image, Cmdline: cmdline, RunDir: runDir,
	}
	opt := qemu.Options{Log: s.log, MemDir: memDir}
	var m *qemu.Machine
	if s.cfg.Restore {
		if consoleMode {
			return meter.ReasonError, errors.New("restore=1 needs control_socket: a restored sandbox is driven over its control socket")
		}
		if m, err = s.restore(ctx, spec, opt); err != nil {
			return meter.ReasonError, err
		}
	} else {
		if m, err = qemu.Start(ctx, spec, opt); err != nil {
			return meter.ReasonError, fmt.Errorf("booting the guest: %w", err)
		}
		s.m = m
		s.mux = channel.New(channel.Host, s.log)
		s.mux.Attach(m.ChannelConn(), false)
	}
	s.meter.SetUsage(m.Usage)
	defer m.Quit(context.Background())
	defer s.mux.Close()
	info := m.Info()
	s.log.Info("guest booting", "engine", info.Backend, "version", info.Version, "machine", info.Machine,
		"pid", m.PID(), "run_dir", runDir, "mem_dir", memDir)

	consoleDone, err := s.pumpConsole(consoleMode)
	if err != nil {
		return meter.ReasonError, err
	}
	go s.acceptGuestStreams()

	select {
	case <-m.Done():
		<-consoleDone
		if err := m.Err(); err != nil {
			return meter.ReasonError, err
		}
		return meter.ReasonPoweroff, nil
	case sig := <-sigs:
		reason = meter.ReasonSIGTERM
		if sig == os.Interrupt {
			reason = meter.ReasonSIGINT
		}
		s.log.Info("signal received; stopping", "signal", sig)
	case reason = <-s.stopCh:
	}
	// An orderly stop: close the control socket first so nobody starts new
	// work, let a capture in progress commit or clean up after itself (a
	// SIGTERM must not leave half an artifact), then ask the guest to
	// power off, then make sure it is gone.
	if s.ctl != nil {
		s.ctl.Close()
	}
	s.captureMu.Lock()
	defer s.captureMu.Unlock()
	if reason == meter.ReasonPark {
		// The guest must never run again: its future is the park.
		s.m.Quit(context.Background())
	} else {
		s.powerOff(5 * time.Second)
	}
	<-consoleDone
	return reason, nil
}

// powerOff asks the agent to power the guest off and waits for the engine
// to exit, then forces it.
func (s *Sandbox) powerOff(wait time.Duration) {
	select {
	case <-s.agentUp:
		st, err := s.mux.Open(agentproto.Request{Op: agentproto.OpPoweroff}.Encode())
		if err != nil {
			break // the channel is gone (a park halted it): stop the engine
		}
		st.CloseWrite(nil)
		select {
		case <-s.m.Done():
			return
		case <-time.After(wait):
			s.log.Warn("guest did not power off in time; stopping the engine", "waited", wait)
		}
	default:
	}
	s.m.Quit(context.Background())
}

// pumpConsole copies the serial console into console.log in the launch
// directory, and in console mode to stdout too (with stdin going back in).
func (s *Sandbox) pumpConsole(consoleMode bool) (<-chan struct{}, error) {
	logPath := filepath.Join(s.cfg.Dir, ConsoleLog)
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the console log: %w", err)
	}
	var w io.Writer = f
	if consoleMode {
		w = io.MultiWriter(f, s.opt.Stdout)
		if s.opt.Stdin != nil {
			if cw, ok := s.m.Console().(io.Writer); ok {
				go io.Copy(cw, s.opt.Stdin)
			}
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer f.Close()
		io.Copy(w, s.m.Console())
	}()
	return done, nil
}

// acceptGuestStreams handles streams the agent opens. The only one it may
// open is hello; anything else is refused.
func (s *Sandbox) acceptGuestStreams() {
	for {
		st, err := s.mux.Accept(context.Background())
		if err != nil {
			return
		}
		req, err := agentproto.Decode(st.Meta())
		if err != nil || req.Op != agentproto.OpHello {
			st.Reset("the host does not accept this stream")
			continue
		}
		s.log.Info("agent connected", "boot", req.Boot, "agent_version", req.Version,
			"guest_agent_start_ms", req.StartMS, "guest_modules_done_ms", req.ModulesMS, "guest_hello_ms", req.HelloMS)
		st.CloseWrite(nil)
		go io.Copy(io.Discard, st)
		s.agentOnce.Do(func() { close(s.agentUp) })
	}
}

// Backend implementation for the control server.

// WaitAgent implements control.Backend.
func (s *Sandbox) WaitAgent(ctx context.Context) error {
	select {
	case <-s.agentUp:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Exec implements control.Backend.
func (s *Sandbox) Exec(ctx context.Context, command string) (control.Output, error) {
	st, err := s.mux.Open(agentproto.Request{Op: agentproto.OpExec, Command: command}.Encode())
	if err != nil {
		return nil, err
	}
	st.CloseWrite(nil)
	return st, nil
}

// Put implements control.Backend: the host file is opened inside the
// transfer jail, streamed with its length, and the agent renames it into
// place only when every byte arrived.
func (s *Sandbox) Put(ctx context.Context, hostPath, guestPath string) (int64, error) {
	f, err := s.jail.OpenRead(hostPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	st, err := s.mux.Open(agentproto.Request{Op: agentproto.OpPut, Path: guestPath, Mode: uint32(fi.Mode().Perm())}.Encode())
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(st, f)
	if errors.Is(err, channel.ErrReset) {
		return 0, agentError(err)
	}
	if err != nil {
		st.Reset("host read failed")
		return 0, fmt.Errorf("reading %s: %w", hostPath, err)
	}
	s.meter.In(int(n))
	st.CloseWrite([]byte(fmt.Sprint(n)))
	if _, err := io.Copy(io.Discard, st); err != nil {
		return 0, agentError(err)
	}
	got, err := agentproto.ParseOKStatus(st.Status())
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("guest stored %d bytes of %d", got, n)
	}
	return n, nil
}

// Get implements control.Backend: bytes go to a temporary file in the
// jail that replaces the target only when the agent's declared length
// matches what arrived.
func (s *Sandbox) Get(ctx context.Context, guestPath, hostPath string) (int64, error) {
	af, err := s.jail.Create(hostPath, 0o600)
	if err != nil {
		return 0, err
	}
	st, err := s.mux.Open(agentproto.Request{Op: agentproto.OpGet, Path: guestPath}.Encode())
	if err != nil {
		af.Abort()
		return 0, err
	}
	st.CloseWrite(nil)
	n, err := io.Copy(af, st)
	if err != nil {
		af.Abort()
		if errors.Is(err, channel.ErrReset) {
			return 0, agentError(err)
		}
		return 0, fmt.Errorf("receiving into %s: %w", hostPath, err)
	}
	want, err := agentproto.ParseOKStatus(st.Status())
	if err != nil || want != n {
		af.Abort()
		return 0, fmt.Errorf("transfer incomplete: got %d bytes, guest declared %q", n, st.Status())
	}
	if err := af.Commit(); err != nil {
		return 0, err
	}
	s.meter.Out(int(n))
	return n, nil
}

// agentError turns a stream reset into the agent's own message.
func agentError(err error) error {
	if errors.Is(err, channel.ErrReset) {
		return errors.New(strings.TrimPrefix(err.Error(), channel.ErrReset.Error()+": "))
	}
	return err
}

// Info implements control.Backend.
func (s *Sandbox) Info() string {
	var b strings.Builder
	agent := "booting"
	select {
	case <-s.agentUp:
		agent = "connected"
	default:
	}
	backend, version, machine := "qemu", "", ""
	if s.m != nil {
		in := s.m.Info()
		backend, version, machine = in.Backend, in.Version, in.Machine
	}
	onOff := map[bool]string{true: "on", false: "off"}
	for _, kv := range [][2]any{
		{"proto_version", control.ProtoVersion},
		{"backend", backend},
		{"engine_version", version},
		{"machine", machine},
		{"accel", s.accel},
		{"arch", "x86_64"},
		{"cpus", s.cfg.CPUs},
		{"ram_mb", s.cfg.RAMMB},
		{"net", "off"},
		{"firewall", "off"},
		{"gpu", "off"},
		{"data_plane", "off"},
		{"egress_plane", "off"},
		{"max_output_bytes", s.cfg.MaxOutputBytes},
		{"x402", onOff[s.cfg.X402]},
		{"agent", agent},
	} {
		fmt.Fprintf(&b, "%s=%v\n", kv[0], kv[1])
	}
	return b.String()
}

// Shutdown implements control.Backend.
func (s *Sandbox) Shutdown() { s.stop(meter.ReasonShutdown) }

func (s *Sandbox) stop(reason string) {
	s.stopOnce.Do(func() { s.stopCh <- reason })
}
