package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// The channel's bulk lane (internal/channel/lane.go) is an ivshmem-plain
// PCI device whose memory BAR the host shares: the agent maps it through
// sysfs. No driver is needed, and none claims the device.
const (
	laneVendor = "0x1af4" // Red Hat, Inc. (QEMU's virtio and ivshmem devices)
	laneDevice = "0x1110" // Inter-VM shared memory
	laneBAR    = "resource2"
)

// mappedLane is the lane's BAR mapped into the agent.
type mappedLane struct{ mem []byte }

// Bytes lets the channel read the host's batches in place (it trusts the
// host not to change them under it; the host never reads ours in place).
func (l *mappedLane) Bytes() []byte { return l.mem }

func (l *mappedLane) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(l.mem)) {
		return 0, io.EOF
	}
	return copy(p, l.mem[off:]), nil
}

func (l *mappedLane) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > int64(len(l.mem)) {
		return 0, io.ErrShortWrite
	}
	return copy(l.mem[off:], p), nil
}

// errNoLane says the machine has no lane device: a sandbox restored from
// an artifact captured before lanes, or an engine without them.
var errNoLane = errors.New("no bulk lane device")

// openLane finds the lane device under sysdir (/sys/bus/pci/devices),
// enables its memory and maps its BAR.
func openLane(sysdir string) (*mappedLane, error) {
	devs, _ := filepath.Glob(filepath.Join(sysdir, "*"))
	for _, d := range devs {
		if readTrim(filepath.Join(d, "vendor")) != laneVendor || readTrim(filepath.Join(d, "device")) != laneDevice {
			continue
		}
		// The firmware assigns the BAR; the kernel leaves a device
		// without a driver disabled, so its memory does not decode yet.
		if readTrim(filepath.Join(d, "enable")) != "1" {
			if err := os.WriteFile(filepath.Join(d, "enable"), []byte("1"), 0); err != nil {
				return nil, fmt.Errorf("enabling the bulk lane device %s: %w", filepath.Base(d), err)
			}
		}
		f, err := os.OpenFile(filepath.Join(d, laneBAR), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening the bulk lane's memory: %w", err)
		}
		defer f.Close() // the mapping outlives the descriptor
		fi, err := f.Stat()
		if err != nil {
			return nil, fmt.Errorf("sizing the bulk lane's memory: %w", err)
		}
		mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mapping the bulk lane's memory (%d bytes): %w", fi.Size(), err)
		}
		return &mappedLane{mem: mem}, nil
	}
	return nil, errNoLane
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}
