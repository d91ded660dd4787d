package qemu

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine"
)

// laneBytes is the size of the channel's bulk lane (internal/channel's
// lane.go): 2 MiB each way holds two batches of a stream's whole credit
// window in flight. A PCI BAR's size is a power of two.
const laneBytes = 4 << 20

// The lane is an ivshmem-plain device whose BAR is QEMU's private map of
// a memfd of ours, and nether reads and writes it in QEMU's memory
// through /proc/PID/mem. Not a map shared with nether, which would be
// simpler: QEMU 7.2's migration skips shared memory (x-ignore-shared,
// which file artifacts need for the guest's RAM) only at the guest
// address it had at capture, and a restored BAR has no address until
// the guest's PCI state loads after the RAM, so a restore fails
// ("Mismatched GPAs for block"). Private, the lane's 4 MiB travel in the
// device state like any device memory; master=on makes ivshmem
// migratable at all.
const laneDevice = "ivshmem-plain,memdev=lane0,master=on"

// laneMemfdName names the memfd so its mapping can be found in QEMU's
// /proc/PID/maps (as "/memfd:nether-channel-lane (deleted)").
const laneMemfdName = "nether-channel-lane"

func laneBackend(path string) string {
	return fmt.Sprintf("memory-backend-file,id=lane0,size=%d,mem-path=%s,share=off", laneBytes, path)
}

// newLane makes the memfd QEMU maps as the lane.
func newLane() (*os.File, error) {
	fd, err := unix.MemfdCreate(laneMemfdName, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("creating the channel's bulk lane: %w", err)
	}
	f := os.NewFile(uintptr(fd), "channel-lane")
	if err := f.Truncate(laneBytes); err != nil {
		f.Close()
		return nil, fmt.Errorf("creating the channel's bulk lane: %w", err)
	}
	return f, nil
}

// procLane is the lane in QEMU's memory: its /proc/PID/mem, opened
// once, which refers to that process's memory and no other's (a later
// process with the same PID is never reached), at the lane's address.
type procLane struct {
	mu     sync.RWMutex
	mem    *os.File // nil until open, and once closed
	base   int64
	closed bool
}

// open finds the lane's mapping in QEMU's memory. It fails once close
// was called: QEMU is gone.
func (l *procLane) open(pid int) error {
	base, err := findMapping(fmt.Sprintf("/proc/%d/maps", pid), "/memfd:"+laneMemfdName, laneBytes)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening QEMU's memory for the bulk lane: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		f.Close()
		return os.ErrClosed
	}
	l.mem, l.base = f, base
	return nil
}

// findMapping returns the start of the mapping of size bytes whose path
// begins with name in a /proc/PID/maps file.
func findMapping(mapsPath, name string, size int64) (int64, error) {
	return findMappingWhere(mapsPath, size, name, func(_, _, path string) bool {
		return strings.HasPrefix(path, name)
	})
}

// findMappingWhere returns the start of the first mapping in a
// /proc/PID/maps file that maps a whole object of size bytes from its
// start and whose device, inode and path match; what names the object in
// the error.
func findMappingWhere(mapsPath string, size int64, what string, match func(dev, inode, path string) bool) (int64, error) {
	f, err := os.Open(mapsPath)
	if err != nil {
		return 0, fmt.Errorf("reading QEMU's memory map: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// start-end perms offset dev inode path
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !match(fields[3], fields[4], fields[5]) {
			continue
		}
		start, end, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		s, err1 := strconv.ParseUint(start, 16, 64)
		e, err2 := strconv.ParseUint(end, 16, 64)
		if err1 != nil || err2 != nil || int64(e-s) != size || strings.Trim(fields[2], "0") != "" {
			continue // not the whole object from its start
		}
		return int64(s), nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("reading QEMU's memory map: %w", err)
	}
	return 0, fmt.Errorf("no mapping of %s (%d bytes) in QEMU's memory map", what, size)
}

func (l *procLane) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > laneBytes {
		return 0, fmt.Errorf("bulk lane read of %d bytes at %d: out of bounds", len(p), off)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mem == nil {
		return 0, os.ErrClosed
	}
	return l.mem.ReadAt(p, l.base+off)
}

func (l *procLane) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > laneBytes {
		return 0, fmt.Errorf("bulk lane write of %d bytes at %d: out of bounds", len(p), off)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.mem == nil {
		return 0, os.ErrClosed
	}
	return l.mem.WriteAt(p, l.base+off)
}

// close ends the lane; reads and writes fail from now on.
func (l *procLane) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.mem != nil {
		l.mem.Close()
		l.mem = nil
	}
}

// Lane implements engine.Machine.
func (m *Machine) Lane() (engine.SharedMemory, int64) {
	if m.procLane == nil {
		return nil, 0
	}
	return m.procLane, laneBytes
}
