package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine"
)

// ramMode says where an artifact's guest memory lives.
type ramMode string

const (
	ramFile   ramMode = "file"   // the artifact's "ram" file
	ramStream ramMode = "stream" // inside the migration stream ("state")
)

// sectionVersion is the newest engine section this build reads. It
// writes the oldest version that can say what it captured: 1 for a
// machine without a display or NIC (the format before either existed, so
// such artifacts stay readable by older nethers), 2 for one with a
// display, 3 for one with a NIC, so an older nether refuses such an
// artifact by its version instead of starting QEMU without the device and
// failing obscurely in the migration; 4 for one with a root image; 5 for
// one with a persistent disk; 6 for one with the channel's bulk lane.
const sectionVersion = 6

// displaySectionVersion is the first version that records a display.
const displaySectionVersion = 2

// nicSectionVersion is the first version that records a NIC.
const nicSectionVersion = 3

// rootSectionVersion is the first version that records a root image.
const rootSectionVersion = 4

// diskSectionVersion is the first version that records a persistent disk.
const diskSectionVersion = 5

// laneSectionVersion is the first version that records a bulk lane.
const laneSectionVersion = 6

// section is the QEMU engine's part of an artifact's metadata.
type section struct {
	RAM     ramMode `json:"ram"`
	VMGenID string  `json:"vmgenid"` // the GUID the guest saw at capture
	// Cmdline is the kernel command line the captured machine booted
	// with: QEMU's firmware tables must match it on restore.
	Cmdline string `json:"cmdline"`
	// Display: the machine had a display device (gpu = 1). The device
	// set must match on restore, so a restore with another Spec.Display
	// is refused before QEMU starts.
	Display bool `json:"display,omitempty"`
	// NIC: the machine had a network card (net = 1); like the display,
	// part of the device set a restore must match.
	NIC bool `json:"nic,omitempty"`
	// RootImage: the machine had a root image's block device; part of
	// the device set too. Which image it was is in the fingerprint.
	RootImage bool `json:"root_image,omitempty"`
	// Disk: the machine had a persistent disk; part of the device set.
	// Which disk it was is the session's to record and check.
	Disk bool `json:"disk,omitempty"`
	// CPU is the -cpu model the machine ran on; a restore runs on the
	// same. Absent in artifacts from before it was recorded (they ran on
	// "max").
	CPU string `json:"cpu,omitempty"`
	// Lane is the size of the channel's bulk lane device, 0 for a
	// machine without one (captured before it existed).
	Lane int64 `json:"lane,omitempty"`
}

// encode returns sec as an engine section of the version it needs.
func (sec section) encode() (engine.Section, error) {
	data, err := json.Marshal(sec)
	if err != nil {
		return engine.Section{}, fmt.Errorf("encoding the engine section: %w", err)
	}
	v := 1
	if sec.Display {
		v = displaySectionVersion
	}
	if sec.NIC {
		v = nicSectionVersion
	}
	if sec.RootImage {
		v = rootSectionVersion
	}
	if sec.Disk {
		v = diskSectionVersion
	}
	if sec.Lane != 0 {
		v = laneSectionVersion
	}
	return engine.Section{Version: v, Data: data}, nil
}

// checkDevices refuses to restore sec into a machine whose Spec asks for
// another device set.
func (sec section) checkDevices(spec engine.Spec) error {
	if sec.Display != spec.Display {
		return fmt.Errorf("%w: the artifact was captured with gpu = %d (display device %s) and this sandbox has gpu = %d; set gpu in nether.conf as it was at capture",
			engine.ErrDeviceMismatch, b2i(sec.Display), displayDevice, b2i(spec.Display))
	}
	if sec.NIC != spec.NIC {
		return fmt.Errorf("%w: the artifact was captured with net = %d (network card virtio-net-pci) and this sandbox has net = %d; set net in nether.conf as it was at capture",
			engine.ErrDeviceMismatch, b2i(sec.NIC), b2i(spec.NIC))
	}
	if root := spec.RootImage != ""; sec.RootImage != root {
		return fmt.Errorf("%w: the artifact was captured with %s and this sandbox has %s; set rootfs in nether.conf as it was at capture",
			engine.ErrDeviceMismatch, rootName(sec.RootImage), rootName(root))
	}
	if disk := spec.Disk != nil; sec.Disk != disk {
		return fmt.Errorf("%w: the artifact was captured %s a persistent disk and this sandbox has %s",
			engine.ErrDeviceMismatch, map[bool]string{true: "with", false: "without"}[sec.Disk], map[bool]string{true: "one (disk =)", false: "none"}[disk])
	}
	return nil
}

func rootName(root bool) string {
	if root {
		return "a root image (a block device)"
	}
	return "no root image (rootfs = busybox)"
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func decodeSection(s engine.Section) (section, error) {
	var sec section
	if s.Version < 1 || s.Version > sectionVersion {
		return sec, fmt.Errorf("%w: qemu engine section version %d, this nether reads up to %d",
			engine.ErrSectionVersion, s.Version, sectionVersion)
	}
	dec := json.NewDecoder(bytes.NewReader(s.Data))
	if err := dec.Decode(&sec); err != nil {
		return sec, fmt.Errorf("decoding the qemu engine section: %w", err)
	}
	if sec.RAM != ramFile && sec.RAM != ramStream {
		return sec, fmt.Errorf("qemu engine section: unknown ram mode %q", sec.RAM)
	}
	if sec.VMGenID == "" {
		return sec, errors.New("qemu engine section: no vmgenid")
	}
	if sec.Display && s.Version < displaySectionVersion {
		return sec, fmt.Errorf("qemu engine section version %d cannot record a display", s.Version)
	}
	if sec.NIC && s.Version < nicSectionVersion {
		return sec, fmt.Errorf("qemu engine section version %d cannot record a network card", s.Version)
	}
	if sec.RootImage && s.Version < rootSectionVersion {
		return sec, fmt.Errorf("qemu engine section version %d cannot record a root image", s.Version)
	}
	if sec.Disk && s.Version < diskSectionVersion {
		return sec, fmt.Errorf("qemu engine section version %d cannot record a persistent disk", s.Version)
	}
	if sec.Lane != 0 && s.Version < laneSectionVersion {
		return sec, fmt.Errorf("qemu engine section version %d cannot record a bulk lane", s.Version)
	}
	if sec.Lane != 0 && sec.Lane != laneBytes {
		// Never a size QEMU is handed unless this nether made it.
		return sec, fmt.Errorf("qemu engine section: a bulk lane of %d bytes, this nether makes %d", sec.Lane, laneBytes)
	}
	return sec, nil
}

// Pause waits until QEMU has taken every byte nether wrote to the channel
// socket (bounded), then stops the vCPUs. QEMU's stop is architecturally
// consistent: no instruction is half done.
func (m *Machine) Pause(ctx context.Context) error {
	drainSocket(ctx, m.channel, 100*time.Millisecond)
	_, err := m.qmp.execute(ctx, "stop", nil)
	return err
}

// Resume restarts the vCPUs.
func (m *Machine) Resume(ctx context.Context) error {
	_, err := m.qmp.execute(ctx, "cont", nil)
	return err
}

// drainSocket waits until the kernel has handed QEMU every byte written
// to the channel socket, so a paused QEMU has nothing left to push into
// guest memory while it is copied.
func drainSocket(ctx context.Context, c net.Conn, limit time.Duration) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
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

// migrationTuning makes a migration of a stopped VM as fast as the host
// allows: QEMU's default bandwidth cap would dominate capture time.
func (m *Machine) migrationTuning(ctx context.Context, ignoreShared bool) error {
	if _, err := m.qmp.execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}); err != nil {
		return err
	}
	_, err := m.qmp.execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	return err
}

// Capture writes the paused machine's device state into the sink's
// "state" file. Guest RAM that lives in our shared memory file is skipped
// by the migration (x-ignore-shared) and copied sparsely into "ram"; RAM
// QEMU maps privately (a restore of a base) goes into the stream.
func (m *Machine) Capture(ctx context.Context, sink engine.Sink) (engine.Captured, error) {
	var out engine.Captured
	state, err := sink.CreateFile("state")
	if err != nil {
		return out, err
	}
	defer state.Close()
	var ram *os.File
	if m.mem != nil {
		if ram, err = sink.CreateFile("ram"); err != nil {
			return out, err
		}
		defer ram.Close()
	}
	start := time.Now()
	if err := m.migrationTuning(ctx, m.mem != nil); err != nil {
		return out, fmt.Errorf("preparing migration: %w", err)
	}
	if _, err := m.qmp.executeFD(ctx, "getfd", map[string]any{"fdname": "snapstate"}, state); err != nil {
		return out, fmt.Errorf("handing QEMU the state file: %w", err)
	}
	if _, err := m.qmp.execute(ctx, "migrate", map[string]any{"uri": "fd:snapstate"}); err != nil {
		return out, fmt.Errorf("starting migration: %w", err)
	}
	if err := m.waitMigration(ctx); err != nil {
		return out, fmt.Errorf("saving device state: %w", err)
	}
	out.DeviceState = time.Since(start)
	sec := section{RAM: ramStream, VMGenID: m.vmgenid, Cmdline: m.cmdline, Display: m.display, NIC: m.nic != nil, RootImage: m.root, Disk: m.disk, CPU: m.cpu}
	if m.procLane != nil {
		sec.Lane = laneBytes
	}
	if ram != nil {
		sec.RAM = ramFile
		start = time.Now()
		n, err := CopySparse(ram, m.mem)
		if err != nil {
			return out, fmt.Errorf("copying guest memory: %w", err)
		}
		out.RAMInFile, out.RAMBytes, out.RAMCopy = true, n, time.Since(start)
	}
	if out.Section, err = sec.encode(); err != nil {
		return out, err
	}
	return out, nil
}

// LoadIncoming loads the device state of a machine started with an
// incoming artifact, leaving it paused.
func (m *Machine) LoadIncoming(ctx context.Context) error {
	if m.incoming == nil {
		return errors.New("machine was not started for an incoming state")
	}
	// A file artifact was captured with x-ignore-shared (its RAM is the
	// file); a stream artifact without it (its RAM is in the stream, and
	// QEMU refuses to load pages into a shared block while the capability
	// is on).
	if err := m.migrationTuning(ctx, m.ramIn == ramFile); err != nil {
		return fmt.Errorf("preparing incoming migration: %w", err)
	}
	// The state file is fd 3 in QEMU: the first of ExtraFiles.
	if _, err := m.qmp.execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:3"}); err != nil {
		return fmt.Errorf("loading device state: %w", err)
	}
	return m.waitMigration(ctx)
}

func (m *Machine) waitMigration(ctx context.Context) error {
	delay := 500 * time.Microsecond
	for {
		raw, err := m.qmp.execute(ctx, "query-migrate", nil)
		if err != nil {
			select {
			case <-m.done:
				return m.exitError("QEMU exited during migration")
			case <-time.After(time.Second):
			}
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		json.Unmarshal(raw, &st)
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			if st.ErrorDesc == "" {
				return fmt.Errorf("migration %s", st.Status)
			}
			return fmt.Errorf("migration failed: %s", st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return m.exitError("QEMU exited during migration")
		case <-time.After(delay):
		}
		if delay < 5*time.Millisecond {
			delay *= 2
		}
	}
}

// CopySparse copies src to dst leaving holes where src has holes or whole
// zero pages, so a 512 MiB guest that touched 100 MiB costs 100 MiB. It
// runs while the guest is paused, so it is built for speed: plain 1 MiB
// reads and writes of the data extents beat both a mapping of the source
// (page faults) and parallel writers (they queue on the file's lock) on
// tmpfs -> ext4, measured.
func CopySparse(dst, src *os.File) (int64, error) {
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	size := fi.Size()
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	pieces, err := dataPieces(src, size, 1<<20)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	var copied int64
	for _, pc := range pieces {
		chunk := buf[:pc[1]-pc[0]]
		if _, err := src.ReadAt(chunk, pc[0]); err != nil {
			return copied, fmt.Errorf("reading %s: %w", src.Name(), err)
		}
		n, err := writeNonZero(dst, chunk, pc[0])
		copied += n
		if err != nil {
			return copied, err
		}
	}
	return copied, nil
}

// dataPieces lists src's data extents (SEEK_DATA/SEEK_HOLE), cut into
// pieces of at most max bytes.
func dataPieces(src *os.File, size, max int64) ([][2]int64, error) {
	var out [][2]int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return nil, fmt.Errorf("finding data in %s: %w", src.Name(), err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("finding holes in %s: %w", src.Name(), err)
		}
		for p := data; p < hole; p += max {
			out = append(out, [2]int64{p, min(p+max, hole)})
		}
		off = hole
	}
	return out, nil
}

// writeNonZero writes the runs of non-zero pages of chunk to dst at off
// onwards; zero pages stay holes.
func writeNonZero(dst *os.File, chunk []byte, off int64) (int64, error) {
	const page = 4096
	end := int64(len(chunk))
	var n int64
	for p := int64(0); p < end; {
		if isZero(chunk[p:min(p+page, end)]) {
			p += page
			continue
		}
		q := p + page
		for q < end && !isZero(chunk[q:min(q+page, end)]) {
			q += page
		}
		q = min(q, end)
		if _, err := dst.WriteAt(chunk[p:q], off+p); err != nil {
			return n, fmt.Errorf("writing %s: %w", dst.Name(), err)
		}
		n += q - p
		p = q
	}
	return n, nil
}

var zeroPage [4096]byte

// isZero compares against a zero page: bytes.Equal is vectorised, a loop
// over bytes is not.
func isZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }
