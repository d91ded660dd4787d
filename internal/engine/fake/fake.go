// Package fake is an engine for tests: an in-memory guest whose agent
// speaks the real channel and agent protocol, captured and restored
// through the same seam as QEMU, with faults to inject (a guest that dies
// mid-command, an agent that never answers the handshake, a frozen
// engine). It lets the session layer be tested under -race in
// milliseconds.
//
// The fake agent understands a tiny shell: "echo WORDS" prints WORDS,
// "exit N" exits N, "die" crashes the engine, "panic" and "reboot" end
// the guest as a kernel panic and a reset do, "poweroff" powers it off,
// "hang" never ends, "reset" makes the agent abort the stream, "burn MS"
// adds MS milliseconds to the engine's CPU usage, "sleep MS" ends after MS
// milliseconds, "draw X Y" paints pixel X,Y of the display white, "resize
// W H" gives the display a new, black frame, "console TEXT" prints TEXT
// on the serial console; anything else is echoed back
// and exits 0. Files put into the guest, and the display's frame, live in
// the fake's memory and cross captures.
//
// The fake agent's handshake sets what it carries, as the real one does:
// the epoch it serves, the hostname and the machine-id (Epoch, Hostname,
// MachineID). A reseed request is recorded (Reseeds) where the real agent
// would mix its seed into the kernel's pool.
//
// A machine started with Spec.Display has a DisplayWidth x DisplayHeight
// display, black at boot, read with Screendump.
//
// A machine started with Spec.NIC has a NIC whose frame channel is a
// SOCK_SEQPACKET socketpair, as QEMU's is: NIC is the host end, GuestNIC
// the guest's. The fake guest never reads or writes frames itself; a test
// plays the guest on GuestNIC. Frames the host writes wait there, as in a
// guest that does not read its ring, until the channel's buffer is full.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/framebuf"
)

// The fake display's size at boot: small, and not a multiple of
// framebuf.DefaultTile either way, so a diff has edge tiles narrower and
// shorter than the rest (3x2 tiles).
const (
	DisplayWidth  = 160
	DisplayHeight = 96
)

// maxFakeDisplay bounds "resize".
const maxFakeDisplay = 1024

// Faults are behaviours to inject into the next machines an Engine starts.
type Faults struct {
	// StartErr makes Start fail.
	StartErr error
	// HangHandshake: the agent never answers the post-restore handshake.
	HangHandshake bool
	// DieInHandshake: the engine dies when the handshake arrives.
	DieInHandshake bool
	// Frozen: every engine call (pause, resume, capture, load) blocks
	// until its context ends, and the guest stops answering, as a QEMU
	// stopped with SIGSTOP would. Quit still works (it kills).
	Frozen bool
	// DieInCapture: the engine dies during Capture.
	DieInCapture bool
	// NoHello: the booted agent never says hello.
	NoHello bool
	// AgentVersion is the protocol version the agent's hello claims; 0 is
	// agentproto.Version.
	AgentVersion int
	// DiskProblem is what the booted agent's hello says is wrong with the
	// persistent disk, as an agent that could not mount it says.
	DiskProblem string
	// OldAgent: the agent predates reseed requests and refuses them as
	// an unknown operation, as an agent built before them does.
	OldAgent bool
}

// Engine makes fake machines.
type Engine struct {
	Log *slog.Logger
	// Version overrides the version the engine reports (default Version),
	// as an upgraded engine would.
	Version string

	mu       sync.Mutex
	faults   Faults
	machines []*Machine
	probes   atomic.Int32
}

var _ engine.Engine = (*Engine)(nil)

// Version is what Probe and Info report.
const Version = "1.0.0"

// New returns a fake engine.
func New(log *slog.Logger) *Engine { return &Engine{Log: log} }

func (e *Engine) version() string {
	if e.Version != "" {
		return e.Version
	}
	return Version
}

// SetFaults sets what the next machines do.
func (e *Engine) SetFaults(f Faults) {
	e.mu.Lock()
	e.faults = f
	e.mu.Unlock()
}

// Machines returns the machines started so far.
func (e *Engine) Machines() []*Machine {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*Machine(nil), e.machines...)
}

// Probes counts Probe calls that did real work.
func (e *Engine) Probes() int { return int(e.probes.Load()) }

// Probe implements engine.Engine.
func (e *Engine) Probe(ctx context.Context) (engine.Info, error) {
	e.probes.Add(1)
	return engine.Info{Backend: "fake", Version: e.version(), Machine: "fake-1"}, nil
}

// Start implements engine.Engine.
func (e *Engine) Start(ctx context.Context, spec engine.Spec) (engine.Machine, error) {
	e.mu.Lock()
	f := e.faults
	e.mu.Unlock()
	if f.StartErr != nil {
		return nil, f.StartErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var hostNIC, guestNIC *os.File
	if spec.NIC {
		var err error
		if hostNIC, guestNIC, err = nicPair(); err != nil {
			return nil, err
		}
	}
	hostCh, guestCh := net.Pipe()
	hostCon, guestCon := net.Pipe()
	m := &Machine{
		hostNIC: hostNIC, guestNIC: guestNIC,
		log: e.Log, faults: f, spec: spec,
		hostCh: hostCh, guestCh: guestCh, hostCon: hostCon, guestCon: guestCon,
		done: make(chan struct{}), files: map[string][]byte{}, running: make(chan struct{}),
		frame: blankFrame(spec.Display, DisplayWidth, DisplayHeight),
		info:  engine.Info{Backend: "fake", Version: e.version(), Machine: "fake-1", Accel: spec.Accel},
	}
	m.freeze.Store(f.Frozen)
	go io.Copy(io.Discard, guestCon) // console input goes nowhere
	if in := spec.Incoming; in != nil {
		// As QEMU, a restore must ask for the devices the artifact had.
		var sec section
		if err := json.Unmarshal(in.Section.Data, &sec); err != nil {
			return nil, fmt.Errorf("restoring %s: decoding the fake section: %w", in.Dir, err)
		}
		if sec.Display != spec.Display {
			m.end(nil)
			return nil, fmt.Errorf("restoring %s: %w: the artifact was captured with gpu = %t and this sandbox has gpu = %t",
				in.Dir, engine.ErrDeviceMismatch, sec.Display, spec.Display)
		}
		if sec.NIC != spec.NIC {
			m.end(nil)
			return nil, fmt.Errorf("restoring %s: %w: the artifact was captured with net = %d and this sandbox has net = %d",
				in.Dir, engine.ErrDeviceMismatch, b2i(sec.NIC), b2i(spec.NIC))
		}
	} else {
		m.hostname = cmdlineHostname(spec.Cmdline)
		m.guest = channel.New(channel.Guest, e.Log)
		m.guest.Attach(guestCh, true)
		m.startAgent()
		close(m.running)
		if !f.NoHello {
			m.hello()
		}
		go fmt.Fprintf(guestCon, "fake guest booted: %s\n", spec.Cmdline)
	}
	e.mu.Lock()
	e.machines = append(e.machines, m)
	e.mu.Unlock()
	return m, nil
}

// Machine is a fake guest.
type Machine struct {
	log    *slog.Logger
	faults Faults
	spec   engine.Spec
	info   engine.Info

	hostCh, guestCh   net.Conn
	hostCon, guestCon net.Conn
	guest             *channel.Mux

	running chan struct{} // closed when the guest first runs (boot or resume)
	freeze  atomic.Bool
	cpu     atomic.Int64 // nanoseconds of host CPU the guest "used"
	mu      sync.Mutex
	files   map[string][]byte
	epoch   uint64
	paused  bool
	frame   *framebuf.Image // the display; nil without one
	// The guest's identity as its agent set it: the hostname (the boot
	// command line's, then each handshake's) and /etc/machine-id.
	hostname, machineID string
	// seeds are the seeds of the reseed requests the agent served, in
	// order.
	seeds [][]byte
	// clocks are the wall clock settings the agent took (a provision's,
	// a handshake's, OpClock's), in order, as the host stamped them.
	clocks []time.Time
	// identity and secrets are what the last provision or handshake
	// handed the agent (/run/nether/identity, /run/secrets).
	identity agentproto.Identity
	secrets  agentproto.Secrets
	// withdrawals counts OpWithdraw requests served.
	withdrawals int

	// The NIC's frame channel (nil without Spec.NIC): a new pair for
	// every machine, a restore's too, as QEMU's.
	hostNIC, guestNIC *os.File

	done     chan struct{}
	doneOnce sync.Once
	err      error
}

var _ engine.Machine = (*Machine)(nil)

// state is what a fake capture writes: the guest's memory, in short.
type state struct {
	Guest     json.RawMessage   `json:"guest"` // the guest half of the channel
	Files     map[string][]byte `json:"files"`
	Epoch     uint64            `json:"epoch"`
	Frame     *framebuf.Image   `json:"frame,omitempty"` // the display's memory
	Hostname  string            `json:"hostname,omitempty"`
	MachineID string            `json:"machine_id,omitempty"`
	// Secrets are /run/secrets at the capture: in guest memory.
	Secrets agentproto.Secrets `json:"secrets,omitempty"`
}

// section is the fake engine's metadata in an artifact.
type section struct {
	Fake    bool `json:"fake"`
	Display bool `json:"display,omitempty"`
	NIC     bool `json:"nic,omitempty"`
}

// nicPair makes a NIC's frame channel as the QEMU engine does: the host
// end non-blocking, so it takes deadlines and a Close wakes its readers.
func nicPair() (host, guest *os.File, err error) {
	// Close-on-exec set apart, not by a socket flag: the fake builds
	// wherever the session's tests run, not only on Linux.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("fake NIC: %w", err)
	}
	unix.CloseOnExec(fds[0])
	unix.CloseOnExec(fds[1])
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, nil, fmt.Errorf("fake NIC: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "fake-nic"), os.NewFile(uintptr(fds[1]), "fake-nic-guest"), nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// NIC implements engine.Machine.
func (m *Machine) NIC() *os.File { return m.hostNIC }

// Lane implements engine.Machine: the fake has no bulk lane; its guest's
// channel carries everything.
func (m *Machine) Lane() (engine.SharedMemory, int64) { return nil, 0 }

// GuestNIC is the guest's end of the NIC's frame channel (nil without a
// NIC), for a test to play the guest: what it writes the host reads from
// NIC, and the other way round. It closes when the machine ends.
func (m *Machine) GuestNIC() *os.File { return m.guestNIC }

// blankFrame is a black w x h frame, or nil without a display.
func blankFrame(display bool, w, h int) *framebuf.Image {
	if !display {
		return nil
	}
	return &framebuf.Image{Width: w, Height: h, Pix: make([]byte, w*h*3)}
}

// Screendump implements engine.Machine: the fake frame as a PPM.
func (m *Machine) Screendump(ctx context.Context) ([]byte, error) {
	if err := m.frozen(ctx); err != nil {
		return nil, err
	}
	select {
	case <-m.done:
		return nil, errors.New("fake engine ended")
	default:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.frame == nil {
		return nil, engine.ErrNoDisplay
	}
	return m.frame.PPM(), nil
}

// draw paints pixel x,y of the display white.
func (m *Machine) draw(x, y int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.frame
	if f == nil {
		return errors.New("no display")
	}
	if x < 0 || y < 0 || x >= f.Width || y >= f.Height {
		return fmt.Errorf("%d,%d is outside the %dx%d display", x, y, f.Width, f.Height)
	}
	i := (y*f.Width + x) * 3
	f.Pix[i], f.Pix[i+1], f.Pix[i+2] = 0xff, 0xff, 0xff
	return nil
}

// resize gives the display a new black frame of w x h.
func (m *Machine) resize(w, h int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.frame == nil {
		return errors.New("no display")
	}
	if w < 1 || h < 1 || w > maxFakeDisplay || h > maxFakeDisplay {
		return fmt.Errorf("%dx%d is outside 1x1..%dx%d", w, h, maxFakeDisplay, maxFakeDisplay)
	}
	m.frame = blankFrame(true, w, h)
	return nil
}

func (m *Machine) Console() io.ReadWriter      { return m.hostCon }
func (m *Machine) Channel() io.ReadWriteCloser { return m.hostCh }
func (m *Machine) Done() <-chan struct{}       { return m.done }
func (m *Machine) Info() engine.Info           { return m.info }
func (m *Machine) PID() int                    { return os.Getpid() }

// Usage implements engine.Machine: the CPU time "burn" commands used.
func (m *Machine) Usage() engine.Usage {
	return engine.Usage{CPU: time.Duration(m.cpu.Load()), Observed: true}
}

// CPUTime implements engine.Machine.
func (m *Machine) CPUTime() time.Duration { return time.Duration(m.cpu.Load()) }

// Err implements engine.Machine.
func (m *Machine) Err() error {
	select {
	case <-m.done:
		return m.err
	default:
		return nil
	}
}

// SetFaults changes what this running machine does from now on (its
// engine's SetFaults reaches only machines started later).
func (m *Machine) SetFaults(f Faults) {
	m.mu.Lock()
	m.faults = f
	m.mu.Unlock()
}

func (m *Machine) fault() Faults {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.faults
}

// Reseeds returns the seeds of the reseed requests the agent served, in
// order: the real agent mixes each into the kernel's entropy pool and
// reseeds the CRNG from it.
// Clocks returns the wall clock settings the agent took, in order.
func (m *Machine) Clocks() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]time.Time(nil), m.clocks...)
}

// setClockLocked records what the agent would set the wall clock to.
func (m *Machine) setClockLocked(ns int64) {
	if ns != 0 {
		m.clocks = append(m.clocks, time.Unix(0, ns))
	}
}

func (m *Machine) Reseeds() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]byte(nil), m.seeds...)
}

// Hostname is the guest's hostname: the boot command line's, or the
// last handshake's that carried one.
func (m *Machine) Hostname() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hostname
}

// MachineID is the guest's /etc/machine-id as the last handshake that
// carried one set it ("" before any).
func (m *Machine) MachineID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.machineID
}

// cmdlineHostname is the hostname a boot's kernel command line hands the
// agent (nether.hostname=).
func cmdlineHostname(cmdline string) string {
	for _, f := range strings.Fields(cmdline) {
		if h, ok := strings.CutPrefix(f, "nether.hostname="); ok {
			return h
		}
	}
	return ""
}

// Epoch is the session epoch the fake agent serves.
func (m *Machine) Epoch() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.epoch
}

// provision takes what req hands the guest, as the real agent does: a
// fork's handshake empties the secrets first. Called with m.mu held.
func (m *Machine) provision(req agentproto.Request, wipe bool) {
	if wipe || req.Secrets != nil {
		m.secrets = nil
	}
	if req.Secrets != nil {
		m.secrets = req.Secrets
	}
	if req.Identity != nil {
		m.identity = *req.Identity
	}
}

// Identity is /run/nether/identity as the guest's agent last wrote it.
func (m *Machine) Identity() agentproto.Identity {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.identity
}

// Secrets are /run/secrets as the guest's agent last wrote them.
func (m *Machine) Secrets() agentproto.Secrets {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.secrets
}

// Withdrawals is how many times the agent emptied /run/secrets for a
// capture (OpWithdraw).
func (m *Machine) Withdrawals() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.withdrawals
}

// File returns a file the guest holds.
func (m *Machine) File(path string) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.files[path]
	return b, ok
}

// Crash ends the machine as a crashed engine would.
func (m *Machine) Crash() { m.end(errors.New("the fake engine crashed")) }

// GuestPanic ends the machine as a guest kernel panic does, printing
// panicText on the console first.
func (m *Machine) GuestPanic(panicText string) {
	fmt.Fprint(m.guestCon, panicText)
	m.end(engine.ErrGuestReset)
}

// end stops the machine once; err nil is a guest power-off.
func (m *Machine) end(err error) {
	m.doneOnce.Do(func() {
		m.err = err
		if m.guest != nil {
			m.guest.Close()
		}
		m.hostCh.Close()
		m.guestCh.Close()
		m.hostCon.Close()
		m.guestCon.Close()
		// As with QEMU: the guest's end goes with the engine (the host
		// reader sees end-of-file), then the machine closes the host's.
		if m.guestNIC != nil {
			m.guestNIC.Close()
			m.hostNIC.Close()
		}
		close(m.done)
	})
}

// Freeze makes the machine behave from now on as a QEMU stopped with
// SIGSTOP: engine calls block, the guest answers nothing.
func (m *Machine) Freeze() { m.freeze.Store(true) }

// frozen blocks like a call into a stopped engine process.
func (m *Machine) frozen(ctx context.Context) error {
	if !m.freeze.Load() {
		return nil
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("fake engine is frozen: %w", ctx.Err())
	case <-m.done:
		return errors.New("fake engine ended")
	}
}

// Pause implements engine.Machine.
func (m *Machine) Pause(ctx context.Context) error {
	if err := m.frozen(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused = true
	m.mu.Unlock()
	m.guest.Freeze()
	return nil
}

// Resume implements engine.Machine.
func (m *Machine) Resume(ctx context.Context) error {
	if err := m.frozen(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.paused = false
	m.mu.Unlock()
	m.guest.Thaw()
	select {
	case <-m.running:
	default:
		m.startAgent()
		close(m.running)
	}
	return nil
}

// Capture implements engine.Machine: the guest's channel half and files
// go into "state" (the fake's RAM rides in the stream).
func (m *Machine) Capture(ctx context.Context, sink engine.Sink) (engine.Captured, error) {
	if err := m.frozen(ctx); err != nil {
		return engine.Captured{}, err
	}
	if m.fault().DieInCapture {
		m.Crash()
		return engine.Captured{}, errors.New("fake engine died during capture")
	}
	guest, err := m.guest.State().Marshal()
	if err != nil {
		return engine.Captured{}, err
	}
	m.mu.Lock()
	st := state{Guest: guest, Files: m.files, Epoch: m.epoch, Frame: m.frame, Hostname: m.hostname, MachineID: m.machineID, Secrets: m.secrets}
	b, err := json.Marshal(st)
	m.mu.Unlock()
	if err != nil {
		return engine.Captured{}, err
	}
	f, err := sink.CreateFile("state")
	if err != nil {
		return engine.Captured{}, err
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		return engine.Captured{}, err
	}
	sec, err := json.Marshal(section{Fake: true, Display: m.spec.Display, NIC: m.spec.NIC})
	if err != nil {
		return engine.Captured{}, err
	}
	return engine.Captured{Section: engine.Section{Version: 1, Data: sec}}, nil
}

// LoadIncoming implements engine.Machine.
func (m *Machine) LoadIncoming(ctx context.Context) error {
	if err := m.frozen(ctx); err != nil {
		return err
	}
	in := m.spec.Incoming
	if in == nil {
		return errors.New("not an incoming machine")
	}
	if in.Section.Version != 1 {
		return fmt.Errorf("%w: fake section version %d", engine.ErrSectionVersion, in.Section.Version)
	}
	b, err := os.ReadFile(filepath.Join(in.Dir, "state"))
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("decoding fake state: %w", err)
	}
	cs, err := channel.UnmarshalState(st.Guest)
	if err != nil {
		return err
	}
	g, err := channel.Restore(cs, m.log)
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.files, m.epoch, m.paused = st.Files, st.Epoch, true
	m.hostname, m.machineID, m.secrets = st.Hostname, st.MachineID, st.Secrets
	if m.spec.Display {
		if st.Frame == nil || st.Frame.Check() != nil {
			m.mu.Unlock()
			return errors.New("fake state: the display's frame is missing or malformed")
		}
		m.frame = st.Frame
	}
	if m.files == nil {
		m.files = map[string][]byte{}
	}
	m.mu.Unlock()
	g.Freeze() // a loaded machine is paused until Resume
	m.guest = g
	g.Attach(m.guestCh, true)
	return nil
}

// Quit implements engine.Machine; it always works, even on a frozen fake.
func (m *Machine) Quit(ctx context.Context) error {
	m.end(nil)
	return nil
}

func (m *Machine) hello() {
	v := m.fault().AgentVersion
	if v == 0 {
		v = agentproto.Version
	}
	st, err := m.guest.Open(agentproto.Request{Op: agentproto.OpHello, Version: v, Boot: "fake", DiskProblem: m.fault().DiskProblem}.Encode())
	if err != nil {
		return
	}
	st.CloseWrite(nil)
}

// startAgent serves the streams the host opens, as the real agent does.
func (m *Machine) startAgent() {
	g := m.guest
	go func() {
		for {
			st, err := g.Accept(context.Background())
			if err != nil {
				return
			}
			go m.serve(st)
		}
	}()
}

func (m *Machine) serve(st *channel.Stream) {
	if m.freeze.Load() {
		<-m.done // a stopped guest answers nothing
		return
	}
	req, err := agentproto.Decode(st.Meta())
	if err != nil {
		st.Reset(err.Error())
		return
	}
	m.mu.Lock()
	epoch := m.epoch
	m.mu.Unlock()
	if err := agentproto.CheckEpoch(req, epoch); err != nil {
		st.Reset(err.Error())
		return
	}
	switch req.Op {
	case agentproto.OpExec:
		m.exec(st, string(req.Command))
	case agentproto.OpPut:
		b, err := io.ReadAll(st)
		if err != nil {
			return
		}
		m.mu.Lock()
		m.files[string(req.Path)] = b
		m.mu.Unlock()
		st.CloseWrite(agentproto.OKStatus(int64(len(b))))
	case agentproto.OpGet:
		io.Copy(io.Discard, st)
		m.mu.Lock()
		b, ok := m.files[string(req.Path)]
		m.mu.Unlock()
		if !ok {
			st.Reset(string(req.Path) + ": no such file")
			return
		}
		st.Write(b)
		st.CloseWrite(agentproto.OKStatus(int64(len(b))))
	case agentproto.OpRestored:
		switch f := m.fault(); {
		case f.DieInHandshake:
			m.Crash()
			return
		case f.HangHandshake:
			<-m.done
			return
		}
		// As the real agent: a handshake sets what it carries (a fork's
		// hostname and machine-id) and the epoch.
		old := m.fault().OldAgent
		m.mu.Lock()
		if !old {
			m.setClockLocked(req.RealtimeNS)
		}
		m.epoch = req.Epoch
		if req.Hostname != "" {
			m.hostname = req.Hostname
		}
		if req.MachineID != "" {
			m.machineID = req.MachineID
		}
		status := fmt.Sprintf("ok %d", req.Epoch)
		if !old && (req.Fork || req.Identity != nil || req.Secrets != nil) {
			m.provision(req, req.Fork)
			status += " " + agentproto.Provisioned
		}
		m.mu.Unlock()
		st.CloseWrite([]byte(status))
	case agentproto.OpProvision:
		m.mu.Lock()
		m.setClockLocked(req.RealtimeNS)
		m.provision(req, false)
		m.mu.Unlock()
		st.CloseWrite([]byte("ok 0 " + agentproto.Provisioned))
	case agentproto.OpWithdraw:
		if m.fault().OldAgent {
			st.Reset(fmt.Sprintf("unknown agent operation %q", req.Op))
			return
		}
		m.mu.Lock()
		m.secrets = nil
		m.withdrawals++
		m.mu.Unlock()
		st.CloseWrite([]byte("ok 0 " + agentproto.Withdrawn))
	case agentproto.OpReseed:
		if m.fault().OldAgent {
			st.Reset(fmt.Sprintf("unknown agent operation %q", req.Op))
			return
		}
		if len(req.Seed) < agentproto.MinSeed {
			st.Reset(fmt.Sprintf("reseed: a seed of %d bytes is too short (at least %d)", len(req.Seed), agentproto.MinSeed))
			return
		}
		m.mu.Lock()
		m.seeds = append(m.seeds, []byte(req.Seed))
		m.mu.Unlock()
		st.CloseWrite([]byte("ok"))
	case agentproto.OpClock:
		if m.fault().OldAgent || req.RealtimeNS == 0 {
			st.Reset(fmt.Sprintf("unknown agent operation %q", req.Op))
			return
		}
		m.mu.Lock()
		m.setClockLocked(req.RealtimeNS)
		m.mu.Unlock()
		st.CloseWrite([]byte("ok 0"))
	case agentproto.OpPoweroff:
		st.CloseWrite([]byte("ok 0"))
		m.end(nil)
	case agentproto.OpConnect:
		// The tenant's server at every port echoes until the host
		// half-closes.
		io.Copy(st, st)
		st.CloseWrite(nil)
	default:
		st.Reset("operation not served by the fake agent")
	}
}

func (m *Machine) exec(st *channel.Stream, command string) {
	verb, arg, _ := strings.Cut(strings.TrimSpace(command), " ")
	switch verb {
	case "echo":
		st.Write([]byte(arg + "\n"))
		st.CloseWrite([]byte("0"))
	case "exit":
		n, err := strconv.Atoi(arg)
		if err != nil {
			n = 2
		}
		st.CloseWrite([]byte(strconv.Itoa(n)))
	case "die":
		st.Write([]byte("dying\n"))
		m.Crash()
	case "panic":
		m.GuestPanic("Kernel panic - not syncing: Attempted to kill init!\n")
	case "reboot":
		m.end(engine.ErrGuestReset)
	case "poweroff":
		m.end(nil)
	case "sleep":
		ms, _ := strconv.Atoi(arg)
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			st.CloseWrite([]byte("0"))
		case <-m.done:
		}
	case "burn":
		// Spend CPU time: the engine's usage grows by arg milliseconds.
		ms, _ := strconv.Atoi(arg)
		m.cpu.Add(int64(ms) * int64(time.Millisecond))
		st.CloseWrite([]byte("0"))
	case "draw", "resize":
		a, b, _ := strings.Cut(arg, " ")
		x, errX := strconv.Atoi(a)
		y, errY := strconv.Atoi(b)
		err := errors.Join(errX, errY)
		if err == nil && verb == "draw" {
			err = m.draw(x, y)
		} else if err == nil {
			err = m.resize(x, y)
		}
		if err != nil {
			st.Write([]byte(verb + ": " + err.Error() + "\n"))
			st.CloseWrite([]byte("1"))
			return
		}
		st.CloseWrite([]byte("0"))
	case "console":
		// What a guest prints on its serial console, as its tty sends it.
		fmt.Fprintf(m.guestCon, "%s\r\n", arg)
		st.CloseWrite([]byte("0"))
	case "hang":
		<-m.done
	case "reset":
		st.Reset("the fake agent broke: \x1e-1\n")
	default:
		st.Write([]byte(command + "\n"))
		st.CloseWrite([]byte("0"))
	}
}
