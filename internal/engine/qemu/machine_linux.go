// Package qemu is the first engine: it runs the guest in qemu-system-x86_64
// and drives it over QMP.
package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/cleanup"
	"github.com/nethersandbox/nether/internal/engine"
)

// Binary is the QEMU executable looked up on PATH.
const Binary = "qemu-system-x86_64"

// MachineType is the QEMU machine model. pc (i440fx) probes fewer devices
// than q35 at boot, and both carry the vmgenid device.
const MachineType = "pc"

// ChannelPortName is the virtio-serial port name the agent looks for.
const ChannelPortName = "nether.channel"

// Machine is the engine seam's first implementation.
var _ engine.Machine = (*Machine)(nil)

// maxSocketPath is the longest path a Unix socket can be bound at on Linux
// (sun_path is 108 bytes with its terminating NUL).
const maxSocketPath = 107

// Engine runs guests in qemu-system-x86_64.
type Engine struct {
	log *slog.Logger
	// StartTimeout bounds how long QEMU may take to connect its sockets.
	StartTimeout time.Duration

	probeOnce sync.Once
	probed    engine.Info
	probeErr  error
}

var _ engine.Engine = (*Engine)(nil)

// New returns the QEMU engine.
func New(log *slog.Logger) *Engine {
	if log == nil {
		log = slog.Default()
	}
	return &Engine{log: log, StartTimeout: 15 * time.Second}
}

// Machine is a running QEMU.
type Machine struct {
	log     *slog.Logger
	cmd     *exec.Cmd
	stderr  *tailBuffer
	qmp     *qmp
	console net.Conn
	channel net.Conn
	info    engine.Info
	// mem is guest memory when QEMU maps it shared: a memfd nobody can
	// reach by name, so it cannot outlive nether and QEMU, however they
	// end. nil for a restore that maps an artifact's RAM privately.
	mem     *os.File
	vmgenid string
	cmdline string
	cpu     string // the -cpu model (cpuModel)
	display bool   // started with a display device (Spec.Display)
	root    bool   // started with a root image (Spec.RootImage)
	disk    bool   // started with a persistent disk (Spec.Disk)
	// captures numbers the disk captures, for unique QMP node names.
	captures int
	// nic is the host end of the NIC's frame channel (Spec.NIC), closed
	// once QEMU has exited; nil without a NIC.
	nic *os.File
	// procLane is the channel's bulk lane in QEMU's memory
	// (lane_linux.go), closed once QEMU has exited; nil for a restore of
	// an artifact captured without one.
	procLane *procLane
	incoming *engine.Incoming
	ramIn    ramMode // for an incoming machine: where its RAM comes from
	ramMB    int
	// live is a capture Precopy began (capture_linux.go); only the
	// session's capture, which holds its own lock, touches it.
	live *liveCapture

	done    chan struct{}
	waitErr error
	// qmpDone closes when QMP has read everything QEMU said, so the
	// SHUTDOWN event's reason is known before done closes.
	qmpDone chan struct{}

	mu       sync.Mutex
	lastUse  engine.Usage
	shutdown string // reason QEMU reported in its SHUTDOWN event
	// stoppedAt is when QEMU last reported the guest stopped (its STOP
	// event), which a live capture's pause counts from.
	stoppedAt time.Time
}

// Start boots spec, or prepares a restore of spec.Incoming.
func (e *Engine) Start(ctx context.Context, spec engine.Spec) (_ engine.Machine, err error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return nil, fmt.Errorf("finding %s: %w (install Debian's qemu-system-x86, or run scripts/setup.sh)", Binary, err)
	}
	for _, f := range []string{spec.Kernel, spec.Initrd, spec.RootImage} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("guest file: %w (run scripts/setup.sh to build the guest image)", err)
		}
	}
	if spec.Display && spec.Incoming == nil {
		warnPVHDisplay(e.log, spec.Kernel)
	}
	m := &Machine{
		log:     e.log,
		stderr:  &tailBuffer{max: 8 << 10},
		done:    make(chan struct{}),
		qmpDone: make(chan struct{}),
		cmdline: spec.Cmdline,
		ramMB:   spec.RAMMB,
		display: spec.Display,
		root:    spec.RootImage != "",
		disk:    spec.Disk != nil,
		info:    engine.Info{Backend: "qemu", Machine: MachineType, Accel: spec.Accel},
	}
	// What a failed start leaves behind; a started machine keeps it all.
	var cu cleanup.Cleanup
	defer cu.Clean()
	cu.Add(func() {
		if m.mem != nil {
			m.mem.Close()
		}
	})
	cu.Add(func() {
		if m.nic != nil {
			m.nic.Close()
		}
	})
	var extra []*os.File
	memPath, share := "", true
	withLane := true
	if in := spec.Incoming; in != nil {
		sec, err := decodeSection(in.Section)
		if err != nil {
			return nil, fmt.Errorf("restoring %s: %w", in.Dir, err)
		}
		if err := sec.checkDevices(spec); err != nil {
			return nil, fmt.Errorf("restoring %s: %w", in.Dir, err)
		}
		m.incoming, m.ramIn, m.cmdline = in, sec.RAM, sec.Cmdline
		withLane = sec.Lane != 0
		if m.cpu, err = cpuModel(spec.Accel, &sec); err != nil {
			return nil, fmt.Errorf("restoring %s: %w", in.Dir, err)
		}
		m.vmgenid = NewGUID()
		if in.KeepGeneration {
			m.vmgenid = sec.VMGenID
		}
		state, err := os.Open(filepath.Join(in.Dir, "state"))
		if err != nil {
			return nil, fmt.Errorf("restoring %s: %w", in.Dir, err)
		}
		defer state.Close()          // QEMU has its own copy once started
		extra = append(extra, state) // fd 3: LoadIncoming's migrate-incoming reads it
		switch {
		case sec.RAM == ramFile && in.OneShot:
			// A park wakes once, so there are no siblings to share pages
			// with. A private copy as our own memory, instead of a private
			// map of the park, keeps the woken guest's memory shared: its
			// next capture is a fast file copy, not a stream of all its RAM.
			if m.mem, err = newGuestMemory(); err != nil {
				return nil, err
			}
			if err := copyFileInto(m.mem, filepath.Join(in.Dir, "ram")); err != nil {
				return nil, fmt.Errorf("waking %s: copying guest memory: %w", in.Dir, err)
			}
		case sec.RAM == ramFile:
			// Copy-on-write: siblings share the artifact's pages in the
			// page cache and nothing a guest writes ever reaches the
			// artifact.
			memPath, share = filepath.Join(in.Dir, "ram"), false
		}
	} else {
		m.vmgenid = NewGUID()
		m.cpu, _ = cpuModel(spec.Accel, nil) // cannot fail without a capture
	}
	if memPath == "" {
		if m.mem == nil {
			if m.mem, err = newGuestMemory(); err != nil {
				return nil, err
			}
		}
		extra = append(extra, m.mem)
		// QEMU opens the memfd through its own descriptor table.
		memPath = fmt.Sprintf("/proc/self/fd/%d", 2+len(extra))
	}
	lanePath := ""
	if withLane {
		lane, err := newLane()
		if err != nil {
			return nil, err
		}
		defer lane.Close() // QEMU has its own copy once started
		extra = append(extra, lane)
		lanePath = fmt.Sprintf("/proc/self/fd/%d", 2+len(extra))
		m.procLane = &procLane{}
	}
	nicFD := -1
	if spec.NIC {
		// A restore gets a new channel too: the old one died with the
		// QEMU that was captured.
		var guestEnd *os.File
		if m.nic, guestEnd, err = newNICPair(); err != nil {
			return nil, err
		}
		defer guestEnd.Close() // QEMU has its own copy once started
		extra = append(extra, guestEnd)
		nicFD = 2 + len(extra)
	}

	socks := map[string]string{}
	listeners := map[string]*net.UnixListener{}
	defer func() {
		// Each socket file goes once QEMU is connected (or gave up): the
		// run directory is empty while the guest runs.
		for _, l := range listeners {
			l.Close()
		}
	}()
	for _, name := range []string{"qmp", "console", "channel"} {
		p := filepath.Join(spec.RunDir, name+".sock")
		if len(p) > maxSocketPath {
			return nil, fmt.Errorf("the run directory %s is too long for a Unix socket path (%d bytes, at most %d): set TMPDIR to a shorter directory", spec.RunDir, len(p), maxSocketPath)
		}
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("listening for QEMU's %s connection: %w", name, err)
		}
		l.SetUnlinkOnClose(true)
		listeners[name] = l
		socks[name] = p
	}
	args := commandLine(spec, m.cmdline, m.cpu, socks, memPath, share, m.vmgenid, nicFD, lanePath)
	m.log.Debug("starting QEMU", "args", strings.Join(args, " "))
	m.cmd = exec.Command(bin, args...)
	m.cmd.Stdout = m.stderr
	m.cmd.Stderr = m.stderr
	m.cmd.ExtraFiles = extra
	m.cmd.SysProcAttr = &syscall.SysProcAttr{
		// QEMU must not outlive nether, even when nether is SIGKILLed.
		Pdeathsig: syscall.SIGKILL,
		// Its own process group: a terminal's ^C goes to nether, which
		// tears down in order, not to QEMU directly.
		Setpgid: true,
	}
	if err := m.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	// From here a failed start kills QEMU first (which waits for it to
	// be gone), then the closes above.
	cu.Add(m.kill)
	go func() {
		m.waitErr = m.cmd.Wait()
		select {
		case <-m.qmpDone:
		case <-time.After(200 * time.Millisecond):
		}
		if m.mem != nil {
			m.mem.Close() // the guest's memory goes with its last mapping
		}
		if m.nic != nil {
			// A reader has seen end-of-file by now, or sees the file
			// closed: either way the link is gone.
			m.nic.Close()
		}
		if m.procLane != nil {
			m.procLane.close() // the channel falls back to its port
		}
		close(m.done)
	}()

	conns, err := m.acceptAll(ctx, listeners, e.StartTimeout)
	if err != nil {
		return nil, err
	}
	m.console, m.channel = conns["console"], conns["channel"]
	q, version, err := newQMP(ctx, conns["qmp"], m.onEvent)
	if err != nil {
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	m.qmp, m.info.Version = q, version
	if m.procLane != nil {
		// QEMU serves QMP once its machine is built, the lane mapped.
		if err = m.procLane.open(m.cmd.Process.Pid); err != nil {
			return nil, fmt.Errorf("starting QEMU: %w", err)
		}
	}
	go func() {
		<-q.done
		close(m.qmpDone)
	}()
	raw, err := q.execute(ctx, "query-machines", nil)
	if err != nil {
		return nil, fmt.Errorf("starting QEMU: %w", err)
	}
	m.info.Machine = resolveMachineName(raw, MachineType)
	cu.Release()
	return m, nil
}

// newGuestMemory makes an anonymous shared-memory file for guest RAM.
func newGuestMemory() (*os.File, error) {
	fd, err := unix.MemfdCreate("nether-guest-ram", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating guest memory: %w", err)
	}
	return os.NewFile(uintptr(fd), "guest-ram"), nil
}

// copyFileInto copies the file at src sparsely into dst.
func copyFileInto(dst *os.File, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	_, err = CopySparse(dst, in)
	return err
}

// Probe starts QEMU without a guest and asks it, over QMP, for its version
// and the machine type the "pc" alias stands for: the same path a running
// machine reports through, so a fingerprint found here matches one taken
// at capture. The answer is kept for the life of the process.
func (e *Engine) Probe(ctx context.Context) (engine.Info, error) {
	e.probeOnce.Do(func() { e.probed, e.probeErr = e.probe(ctx) })
	return e.probed, e.probeErr
}

func (e *Engine) probe(ctx context.Context) (engine.Info, error) {
	bin, err := exec.LookPath(Binary)
	if err != nil {
		return engine.Info{}, fmt.Errorf("finding %s: %w (install Debian's qemu-system-x86, or run scripts/setup.sh)", Binary, err)
	}
	dir, err := os.MkdirTemp("", "nether-probe-")
	if err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "qmp.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	if err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	defer l.Close()
	m := &Machine{log: e.log, stderr: &tailBuffer{max: 8 << 10}, done: make(chan struct{})}
	m.cmd = exec.Command(bin, "-machine", "none", "-S", "-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "socket,id=qmp,path="+p, "-mon", "chardev=qmp,mode=control")
	m.cmd.Stdout, m.cmd.Stderr = m.stderr, m.stderr
	m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := m.cmd.Start(); err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	go func() {
		m.waitErr = m.cmd.Wait()
		close(m.done)
	}()
	defer m.kill()
	conns, err := m.acceptAll(ctx, map[string]*net.UnixListener{"qmp": l}, e.StartTimeout)
	if err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	defer conns["qmp"].Close()
	q, version, err := newQMP(ctx, conns["qmp"], nil)
	if err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	raw, err := q.execute(ctx, "query-machines", nil)
	if err != nil {
		return engine.Info{}, fmt.Errorf("probing QEMU: %w", err)
	}
	return engine.Info{Backend: "qemu", Version: version, Machine: resolveMachineName(raw, MachineType)}, nil
}

// commandLine is QEMU's argument list. nicFD is the descriptor QEMU
// inherits for the NIC's frames when spec.NIC is set; laneFile is the
// channel's bulk lane, none when empty.
func commandLine(spec engine.Spec, cmdline, cpu string, socks map[string]string, memFile string, shared bool, vmgenid string, nicFD int, laneFile string) []string {
	ram := strconv.Itoa(spec.RAMMB) + "M"
	share := "on"
	if !shared {
		// Copy-on-write: siblings share the artifact's pages in the page
		// cache and nothing a guest writes ever reaches the artifact.
		share = "off"
	}
	args := []string{
		"-name", "nether,debug-threads=on",
		"-machine", MachineType + ",memory-backend=ram0",
		"-smp", strconv.Itoa(spec.CPUs),
		"-m", ram,
		// File-backed, shared guest RAM: a snapshot can take the file as
		// the guest's memory instead of streaming it through QEMU.
		"-object", "memory-backend-file,id=ram0,size=" + ram + ",mem-path=" + memFile + ",share=" + share,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-chardev", "socket,id=qmp,path=" + socks["qmp"],
		"-mon", "chardev=qmp,mode=control",
		"-chardev", "socket,id=con,path=" + socks["console"],
		"-serial", "chardev:con",
		"-chardev", "socket,id=chan,path=" + socks["channel"],
		// No option ROMs: firmware probing them is pure boot latency.
		"-device", "virtio-serial-pci,id=vser,romfile=",
		"-device", "virtserialport,bus=vser.0,chardev=chan,name=" + ChannelPortName,
		// Host entropy for the guest CRNG from its first boot moment, not
		// only the CPU's RDRAND (a CPU model may lack it). Rate-limited so
		// a guest cannot drain the host pool.
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-pci,rng=rng0,max-bytes=65536,period=1000,romfile=",
		// VM generation id: a restore gets a fresh one so the guest
		// reseeds its CRNG.
		"-device", "vmgenid,guid=" + vmgenid,
		"-kernel", spec.Kernel,
		"-initrd", spec.Initrd,
		"-append", cmdline,
		"-no-reboot",
	}
	if laneFile != "" {
		args = append(args, "-object", laneBackend(laneFile), "-device", laneDevice)
	}
	if spec.Display {
		// Keeps its VGA BIOS (no romfile=): the firmware sets up VGA text
		// mode with it, which the kernel's VGA console then draws into.
		args = append(args, "-device", displayDevice)
	}
	if spec.NIC {
		args = append(args, "-netdev", nicNetdev(nicFD), "-device", nicDevice)
	}
	if spec.RootImage != "" {
		args = append(args, "-drive", rootDrive(spec.RootImage), "-device", rootDevice)
	}
	if spec.Disk != nil {
		args = append(args, "-blockdev", dataBlockdev(spec.Disk), "-device", dataDevice)
	}
	if spec.Incoming != nil {
		// -S: the loaded guest stays paused until nether resumes it,
		// whatever run state the capture recorded. A live capture
		// records "running" (QEMU stopped the guest itself), and QEMU
		// would otherwise start it the moment its state is loaded,
		// before nether has wired the channel to it.
		args = append(args, "-incoming", "defer", "-S")
	}
	if spec.Accel == engine.AccelKVM {
		args = append(args, "-accel", "kvm")
	} else {
		args = append(args, "-accel", "tcg,thread=multi")
	}
	return append(args, "-cpu", cpu)
}

// The guest's CPU model. Under TCG it is every feature QEMU emulates
// except ERMS ("enhanced rep movsb"): with ERMS the guest kernel copies
// to and from user space and zeroes pages with rep movsb/stosb, and
// glibc's memcpy turns to rep movsb for large copies, and TCG runs those
// one byte per loop iteration. Without it the kernel uses rep movsq and
// glibc its vector loops. Measured in a Debian guest (64 MiB): cat f >
// copy 0.90 -> 0.50 s, cat f | cat 1.25 -> 0.37 s; a 32 MiB __get__ 745 ->
// 506 ms, __put__ 1392 -> 1049 ms.
const (
	tcgCPU = "max,-erms"
	kvmCPU = "host"
	// legacyTCGCPU is what machines captured before the engine section
	// recorded the CPU ran on; their restores keep it.
	legacyTCGCPU = "max"
)

// cpuModel is the CPU a machine runs on: what it was captured with (a
// restore shows the guest the CPU its kernel and libraries chose their
// code for at boot), else this nether's model for the accelerator.
func cpuModel(accel engine.Accel, captured *section) (string, error) {
	if accel == engine.AccelKVM {
		if captured != nil && captured.CPU != "" && captured.CPU != kvmCPU {
			return "", fmt.Errorf("the artifact was captured on CPU model %q, not under KVM", captured.CPU)
		}
		return kvmCPU, nil
	}
	if captured == nil {
		return tcgCPU, nil
	}
	switch captured.CPU {
	case "":
		return legacyTCGCPU, nil
	case tcgCPU, legacyTCGCPU:
		return captured.CPU, nil
	}
	// The section is checksummed, but a model is never passed to QEMU
	// unless this nether knows it.
	return "", fmt.Errorf("the artifact was captured on CPU model %q, which this nether does not run", captured.CPU)
}

// rootDevice is the root image's block device.
const rootDevice = "virtio-blk-pci,drive=root,serial=" + engine.RootImageSerial

// rootDrive is the root image's drive: raw and read-only, so any number of
// sandboxes share one image file (and the host's page cache of it), and a
// guest cannot change what its siblings and restores boot. QEMU's option
// syntax doubles a comma inside a value.
func rootDrive(path string) string {
	return "file=" + strings.ReplaceAll(path, ",", ",,") + ",format=raw,if=none,id=root,readonly=on"
}

// NewGUID returns a random (version 4) GUID for the vmgenid device.
func NewGUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// acceptAll waits for QEMU to connect each socket, or to die trying.
func (m *Machine) acceptAll(ctx context.Context, ls map[string]*net.UnixListener, timeout time.Duration) (map[string]net.Conn, error) {
	type result struct {
		name string
		c    net.Conn
		err  error
	}
	deadline := time.Now().Add(timeout)
	ch := make(chan result, len(ls))
	for name, l := range ls {
		l.SetDeadline(deadline)
		go func() {
			c, err := l.Accept()
			ch <- result{name, c, err}
		}()
	}
	conns := map[string]net.Conn{}
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for range ls {
		select {
		case r := <-ch:
			if r.err != nil {
				closeAll()
				select {
				case <-m.done:
					return nil, m.exitError("QEMU exited during start")
				case <-time.After(200 * time.Millisecond):
				}
				return nil, fmt.Errorf("waiting for QEMU to connect its %s socket: %w", r.name, r.err)
			}
			conns[r.name] = r.c
		case <-m.done:
			closeAll()
			return nil, m.exitError("QEMU exited during start")
		case <-ctx.Done():
			closeAll()
			return nil, ctx.Err()
		}
	}
	return conns, nil
}

func (m *Machine) exitError(what string) error {
	msg := strings.TrimSpace(m.stderr.String())
	if msg == "" {
		msg = fmt.Sprint(m.waitErr)
	}
	return fmt.Errorf("%s: %s", what, msg)
}

func (m *Machine) onEvent(name string, data json.RawMessage) {
	if name == "STOP" {
		m.mu.Lock()
		m.stoppedAt = time.Now()
		m.mu.Unlock()
	}
	if name == "SHUTDOWN" {
		var d struct {
			Reason string `json:"reason"`
		}
		json.Unmarshal(data, &d)
		m.mu.Lock()
		m.shutdown = d.Reason
		m.mu.Unlock()
	}
}

func resolveMachineName(raw json.RawMessage, alias string) string {
	var ms []struct {
		Name  string `json:"name"`
		Alias string `json:"alias"`
	}
	if json.Unmarshal(raw, &ms) != nil {
		return alias
	}
	for _, mt := range ms {
		if mt.Alias == alias {
			return mt.Name
		}
	}
	return alias
}

func (m *Machine) Console() io.ReadWriter      { return m.console }
func (m *Machine) Channel() io.ReadWriteCloser { return m.channel }
func (m *Machine) Done() <-chan struct{}       { return m.done }
func (m *Machine) Info() engine.Info           { return m.info }
func (m *Machine) PID() int                    { return m.cmd.Process.Pid }

// Err says why QEMU ended; nil for a guest power-off.
func (m *Machine) Err() error {
	select {
	case <-m.done:
	default:
		return nil
	}
	m.mu.Lock()
	reason := m.shutdown
	m.mu.Unlock()
	if m.waitErr != nil {
		return m.exitError("QEMU failed")
	}
	switch reason {
	case "guest-panic":
		return engine.ErrGuestPanic
	case "guest-reset":
		// -no-reboot turns a guest reboot into an exit with this reason.
		return engine.ErrGuestReset
	}
	return nil
}

// quitWait is how long Quit lets QEMU exit on its own after QMP quit: a
// live QEMU takes milliseconds; one that does not is killed.
const quitWait = time.Second

// Quit stops QEMU now and waits for it.
func (m *Machine) Quit(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	default:
	}
	// Bounded on its own: a stop path whose context is already cancelled
	// still asks QEMU politely first, and a wedged QEMU is killed.
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), quitWait)
	defer cancel()
	if m.qmp != nil {
		m.qmp.execute(qctx, "quit", nil)
	}
	select {
	case <-m.done:
		return nil
	case <-qctx.Done():
	}
	m.kill()
	return nil
}

func (m *Machine) kill() {
	m.cmd.Process.Kill()
	<-m.done
}

// Usage reads QEMU's CPU time and peak RSS: live from /proc while it
// runs, from its rusage after it exits.
func (m *Machine) Usage() engine.Usage {
	select {
	case <-m.done:
		if ru, ok := m.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ru != nil {
			u := engine.Usage{
				CPU:      time.Duration(ru.Utime.Nano() + ru.Stime.Nano()),
				PeakRSS:  ru.Maxrss * 1024,
				Observed: true,
			}
			return u
		}
	default:
		if u, err := procUsage(m.cmd.Process.Pid); err == nil {
			m.mu.Lock()
			m.lastUse = u
			m.mu.Unlock()
			return u
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastUse
}

// CPUTime implements engine.Machine: one system call while QEMU runs.
func (m *Machine) CPUTime() time.Duration {
	select {
	case <-m.done:
	default:
		if cpu, ok := processCPU(m.cmd.Process.Pid); ok {
			return cpu
		}
	}
	return m.Usage().CPU
}

// clockTicks is USER_HZ, which Linux fixes at 100 for /proc on x86_64.
const clockTicks = 100

func procUsage(pid int) (engine.Usage, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return engine.Usage{}, err
	}
	// The command name may contain spaces; fields start after its ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return engine.Usage{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return engine.Usage{}, errors.New("short /proc stat")
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u := engine.Usage{CPU: time.Duration(ut+st) * time.Second / clockTicks, Observed: true}
	if cpu, ok := processCPU(pid); ok {
		u.CPU = cpu
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				u.PeakRSS = kb * 1024
			}
		}
	}
	return u, nil
}

// processCPU reads the CPU time of all of pid's threads from the
// scheduler, in nanoseconds: /proc's figure counts whole 10 ms ticks, too
// coarse for the CPU of one command (__cmdlog__'s cpu_ms). The clock id is
// Linux's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED).
func processCPU(pid int) (time.Duration, bool) {
	const cpuclockSched = 2
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^pid<<3|cpuclockSched), &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}

// tailBuffer keeps the last max bytes written to it: QEMU's stderr, for
// error messages.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
