// Package engine is the seam between nether and whatever runs the guest.
// A session asks an Engine for a Machine and talks to it only through
// these interfaces; everything about a particular engine (QEMU's command
// lines, QMP, versions, how RAM is captured) stays in that engine's
// package. Only the engine's own package and the one place that picks an
// engine (cmd/nether) import it.
package engine

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"
)

// Engine makes machines of one kind.
type Engine interface {
	// Probe asks the engine, once, who it is on this host: its name,
	// version and the concrete machine type it would run. It starts no
	// guest. Fingerprints of artifacts are built from it.
	Probe(ctx context.Context) (Info, error)
	// Start boots spec, or, with spec.Incoming set, starts a machine that
	// waits paused for Machine.LoadIncoming.
	Start(ctx context.Context, spec Spec) (Machine, error)
}

// Spec is what a session wants run.
type Spec struct {
	CPUs    int
	RAMMB   int
	Accel   Accel  // resolved: kvm or tcg
	Kernel  string // absolute path
	Initrd  string // absolute path
	Cmdline string // kernel command line (a restore uses the captured one)
	// RunDir is a private (0700) directory the engine may use for its
	// sockets while it starts; the session removes it once Start returns.
	RunDir string
	// Incoming, when set, starts the machine paused, waiting to load a
	// captured state instead of booting.
	Incoming *Incoming
	// Display gives the guest a display device (gpu = 1), read back with
	// Machine.Screendump. It is part of the device set: a restore must
	// ask for the display the artifact was captured with.
	Display bool
	// NIC gives the guest a network card (net = 1) with the MAC NICMAC,
	// whose frames the host reads and writes through Machine.NIC. It is
	// part of the device set, as Display is.
	NIC bool
	// RootImage, when set, is the absolute path of a read-only root file
	// system image the guest mounts as its root (under a writable layer
	// in its own memory). The engine attaches it read-only with the
	// serial RootImageSerial; its bytes are never written. Part of the
	// device set, as Display is; the image's identity (its digest) is
	// the session's to check.
	RootImage string
	// Disk, when set, is the sandbox's persistent disk: attached
	// read-write with the serial DataDiskSerial, its writes flushed to
	// the host file when the guest flushes. Part of the device set.
	Disk *Disk

	// Devices the next planes add (block devices) join Spec here as
	// endpoint descriptions, and Machine grows the matching endpoint
	// accessors; the session passes them through untouched.
}

// NICMAC is the guest NIC's hardware address: fixed, so a fork's NIC is
// the one its base had (the guest's ARP caches and the host stack agree
// across a restore). Every sandbox has a link of its own, so one address
// for all of them never collides.
const NICMAC = "52:54:00:12:34:56"

// NICMTU is the guest link's MTU, which the NIC announces to the guest's
// driver (virtio-net's MTU feature) and the host's stack uses too. The
// link is a socket inside one host, not a wire: a 64 KiB frame costs one
// message where a 1500-byte one costs forty-four, so bulk TCP moves in
// 64 KiB segments with a fraction of the per-frame system calls and
// wake-ups on both sides. 65520 is the largest that leaves room for the
// Ethernet header in a 64 KiB message.
const NICMTU = 65520

// RootImageSerial is the block device serial of the root image, which the
// agent looks for in /sys/block/*/serial: names like vda follow the order
// of devices, the serial does not.
const RootImageSerial = "nether-root"

// DataDiskSerial is the persistent disk's block device serial; the agent
// mounts the device that has it at /data.
const DataDiskSerial = "nether-data"

// DiskFileName is the name of the disk layer inside an artifact.
const DiskFileName = "disk"

// Disk is a persistent disk's host file.
type Disk struct {
	// Path is the file the guest's writes go to: a raw ext4 image, or a
	// copy-on-write layer over a snapshot's disk (LayerMaker).
	Path string
	// QCOW2: the file is a qcow2 layer; otherwise the file is the block
	// device, byte for byte.
	QCOW2 bool
}

// LayerMaker is an Engine that can make a fork's disk: a new
// copy-on-write layer over a committed artifact's disk layer, so the fork
// reads the disk its memory expects and writes only into its own layer,
// which costs what it writes.
type LayerMaker interface {
	// CreateLayer creates path, which must not exist, as a layer over
	// backing.
	CreateLayer(ctx context.Context, path, backing string) error
}

// DiskCapturer is a Machine whose persistent disk can be captured with
// its memory.
type DiskCapturer interface {
	// CaptureDisk starts copying the paused machine's disk, as it is at
	// this instant, into the sink's DiskFileName, and returns at once:
	// the guest may run again while the copy goes on (its later writes do
	// not reach the copy). wait blocks until the copy is complete and
	// durable, or failed; it must be called exactly once.
	CaptureDisk(ctx context.Context, sink Sink) (wait func(context.Context) error, err error)
}

// Precopier is a Machine that can do most of a capture while the guest
// runs, so the pause that follows costs what changed since instead of
// what the guest holds.
type Precopier interface {
	// Precopy begins a capture into sink and returns once what is left
	// is small. The engine may have paused the guest to finish (it then
	// says since when in pausedAt; zero while the guest runs). The
	// Capture into the same sink that follows, machine paused, finishes
	// it (a Precopier's Capture without it fails); on an error the
	// guest runs as before.
	Precopy(ctx context.Context, sink Sink) (pausedAt time.Time, err error)
	// AbortPrecopy ends a capture Precopy began and no Capture
	// finished, the guest running as before Precopy unless the caller
	// paused it; it does nothing otherwise.
	AbortPrecopy()
}

// Incoming is a committed artifact to restore.
type Incoming struct {
	// Dir is the artifact directory. Its files are immutable: an engine
	// maps or reads them, never writes them.
	Dir string
	// Section is what the engine's Capture returned for this artifact.
	Section Section
	// OneShot says the artifact wakes exactly once (a park): the engine
	// may take its memory as its own instead of sharing it with siblings.
	OneShot bool
	// KeepGeneration keeps the VM generation id the guest saw at capture
	// (fork_reseed=0). By default a restore gets a fresh one, so the guest
	// reseeds its CRNG.
	KeepGeneration bool
}

// Section is one versioned piece of an artifact's metadata, written and
// read by whoever owns it (the engine, or a session component).
type Section struct {
	Version int             `json:"version"`
	Data    json.RawMessage `json:"data"`
}

// Sink receives a capture's files. Only the names the artifact format
// knows ("ram", "state", DiskFileName) may be created.
type Sink interface {
	CreateFile(name string) (*os.File, error)
}

// Captured describes what Capture wrote.
type Captured struct {
	// RAMInFile: guest memory went into the sink's "ram" file; otherwise
	// it is inside the "state" stream.
	RAMInFile bool
	RAMBytes  int64
	// Section is the engine's own metadata for a later restore.
	Section Section
	// Timings for the capture log.
	DeviceState, RAMCopy time.Duration
}

// Machine is one running guest.
type Machine interface {
	// Console is the guest's serial console: output to read, input to
	// write.
	Console() io.ReadWriter
	// Channel is the host end of the guest's channel port, connected
	// once per engine process, at start.
	Channel() io.ReadWriteCloser
	// Done is closed when the engine process has exited.
	Done() <-chan struct{}
	// Err is why the machine ended: nil for a guest power-off; wraps
	// ErrGuestPanic or ErrGuestReset when the guest crashed.
	Err() error
	// Usage is the host cost of the machine so far (or in total, after
	// Done).
	Usage() Usage
	// CPUTime is Usage's CPU alone, cheap enough to read twice for every
	// command (the command log's cpu_ms).
	CPUTime() time.Duration
	// Info describes the engine for reports: name, version, machine type.
	Info() Info
	// PID is the engine process, for logs.
	PID() int

	// LoadIncoming loads the state of a machine started with
	// Spec.Incoming and leaves it paused.
	LoadIncoming(ctx context.Context) error
	// Pause stops the vCPUs once the engine has taken every byte the
	// host already wrote to the channel, so a paused guest's memory
	// cannot change under a capture.
	Pause(ctx context.Context) error
	// Resume restarts the vCPUs.
	Resume(ctx context.Context) error
	// Capture writes the paused machine's device state and memory into
	// sink. It leaves the machine paused. A Precopier's Capture finishes
	// the Precopy into the same sink and fails without one.
	Capture(ctx context.Context, sink Sink) (Captured, error)
	// Quit stops the machine at once (no guest shutdown) and waits for
	// the engine to exit. It works on a wedged engine too.
	Quit(ctx context.Context) error

	// Screendump returns what the display shows now, as a binary PPM
	// (P6, maxval 255; internal/framebuf parses it). It fails with
	// ErrNoDisplay on a machine started without Spec.Display. It works
	// on a paused machine too.
	Screendump(ctx context.Context) ([]byte, error)

	// NIC is the host end of the guest NIC's frame channel, nil on a
	// machine started without Spec.NIC: a Unix socket carrying one raw
	// Ethernet frame (no virtio-net header, no length prefix) per
	// message in each direction. A write that finds the guest's receive
	// ring full waits (or fails with EAGAIN on a non-blocking write);
	// frames are never cut or merged. A restored machine has a new one:
	// frames in flight at capture are lost, as on a real link.
	//
	// The machine owns it: reads see end-of-file once the engine process
	// has exited, and the machine closes it then. Use it through the
	// *os.File (Read, Write, SyscallConn), never through its descriptor
	// number, which a close frees for reuse.
	NIC() *os.File

	// Lane is the channel's bulk lane: memory the guest sees as a device
	// and the host reads and writes at offsets (internal/channel's
	// Lane), with its size; nil when the machine has none (a restore of
	// an artifact captured before lanes). The machine owns it: once the
	// engine process has exited, reads and writes fail.
	Lane() (SharedMemory, int64)
}

// SharedMemory is memory the host shares with a guest, read and written
// at offsets.
type SharedMemory interface {
	io.ReaderAt
	io.WriterAt
}

// Usage is what the machine cost the host.
type Usage struct {
	CPU      time.Duration
	PeakRSS  int64 // bytes
	Observed bool  // false when the figures could not be read
}

// Info names the engine.
type Info struct {
	Backend string // e.g. "qemu"
	Version string // e.g. "7.2.19"
	Machine string // e.g. "pc-i440fx-7.2"
	Accel   Accel
}

// How a machine can end other than by a power-off the guest asked for;
// Machine.Err wraps one of them.
var (
	// ErrGuestPanic: the engine saw the guest kernel panic.
	ErrGuestPanic = errors.New("the guest kernel panicked")
	// ErrGuestReset: the guest reset itself. nether's guests never reboot
	// on purpose, so this is a crash (a panic with panic=-1, a triple
	// fault, an init that died).
	ErrGuestReset = errors.New("the guest reset itself")
)

// ErrNoDisplay is returned by Screendump on a machine without a display.
var ErrNoDisplay = errors.New("the machine has no display")

// ErrDeviceMismatch is wrapped by a restore refused because the artifact
// was captured with another device set (a display, say) than the Spec
// asks for: the engine could not load its device state.
var ErrDeviceMismatch = errors.New("the artifact's devices differ from the sandbox's")

// ErrSectionVersion is returned by an engine asked to restore a section
// newer than it understands.
var ErrSectionVersion = errors.New("engine section version not supported")
