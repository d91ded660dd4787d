// Package engine is the seam between nether and whatever runs the guest.
// nether asks an engine for a Machine and talks to it only through this
// interface; everything about QEMU (command lines, QMP, versions) stays in
// engine/qemu.
package engine

import (
	"context"
	"io"
	"net"
	"os"
	"time"
)

// Spec is what nether wants booted.
type Spec struct {
	CPUs    int
	RAMMB   int
	Accel   Accel  // resolved: kvm or tcg
	Kernel  string // absolute path
	Initrd  string // absolute path
	Cmdline string // kernel command line
	// RunDir is a private (0700) directory the engine may use for its
	// sockets and the guest RAM file; nether removes it at exit.
	RunDir string
	// VMGenID is the VM generation GUID; empty means a fresh random one.
	VMGenID string
	// Incoming, when set, starts the machine paused, waiting to load a
	// captured state instead of booting.
	Incoming *Incoming
}

// Incoming is a captured machine to restore.
type Incoming struct {
	// RAMFile, when set, is guest memory as a flat file, mapped
	// copy-on-write; when empty the state stream carries the memory and it
	// is loaded into a fresh shared file.
	RAMFile string
	// RAMFileOwned says RAMFile is this machine's own copy: it is mapped
	// shared (so a later capture can take the file again instead of
	// streaming RAM) and removed when the machine ends.
	RAMFileOwned bool
	// State is the engine's device-state stream.
	State *os.File
}

// Machine is one running guest.
type Machine interface {
	// Console is the guest's serial console output.
	Console() io.Reader
	// ChannelConn is the host end of the guest's channel port, connected
	// once per engine process, at start.
	ChannelConn() net.Conn
	// Done is closed when the engine process has exited.
	Done() <-chan struct{}
	// Err is why the machine ended: nil for a guest power-off.
	Err() error
	// Usage is the host cost of the machine so far (or in total, after Done).
	Usage() Usage
	// Info describes the engine for reports: name, version, machine type.
	Info() Info
	// Quit stops the machine at once (no guest shutdown) and waits for the
	// engine to exit.
	Quit(ctx context.Context) error
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
