package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
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

// migrationTuning sets a restore's incoming migration up: x-ignore-shared
// as the artifact was captured, and no bandwidth cap (QEMU's default
// would dominate the load).
func (m *Machine) migrationTuning(ctx context.Context, ignoreShared bool) error {
	if _, err := m.qmp.execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": ignoreShared}},
	}); err != nil {
		return err
	}
	_, err := m.qmp.execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": int64(1) << 40})
	return err
}

// errNoPrecopy: Capture was called without the Precopy that begins it.
var errNoPrecopy = errors.New("capture: no capture into this sink was begun (Precopy comes first)")

// Capture finishes the capture Precopy began into sink: QEMU's final
// pass and the rest of guest memory, with the guest paused. There is one
// way to capture: without a Precopy into the same sink it fails and
// touches nothing.
func (m *Machine) Capture(ctx context.Context, sink engine.Sink) (engine.Captured, error) {
	if lc := m.live; lc == nil || lc.sink != sink {
		return engine.Captured{}, errNoPrecopy
	}
	return m.finishLive(ctx, m.live)
}

// section describes the machine for a restore of a capture whose RAM is
// in mode.
func (m *Machine) section(mode ramMode) section {
	sec := section{RAM: mode, VMGenID: m.vmgenid, Cmdline: m.cmdline, Display: m.display, NIC: m.nic != nil, RootImage: m.root, Disk: m.disk, CPU: m.cpu}
	if m.procLane != nil {
		sec.Lane = laneBytes
	}
	return sec
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

// waitMigration waits until QEMU's migration completed, or says why not.
func (m *Machine) waitMigration(ctx context.Context) error {
	delay := 500 * time.Microsecond
	for {
		st, err := m.migrationStatus(ctx)
		if err != nil {
			return err
		}
		if st == "completed" {
			return nil
		}
		if err := m.migrationWait(ctx, delay); err != nil {
			return err
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
		n, err := mendPages(dst, pc[0], chunk, nil)
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

// mendPages makes dst, from off on, hold cur, where it holds old (nil:
// zeroes, a hole) now: the runs of pages that differ are written, one
// write a run; a page that became zero becomes a hole. It returns the
// bytes written. A fresh copy (old nil) thus writes only cur's non-zero
// pages, and a refresh only what changed.
func mendPages(dst *os.File, off int64, cur, old []byte) (int64, error) {
	const page = 4096
	end := int64(len(cur))
	var written int64
	run := int64(-1) // the start of the run of pages to write
	flush := func(to int64) error {
		if run < 0 {
			return nil
		}
		if _, err := dst.WriteAt(cur[run:to], off+run); err != nil {
			return fmt.Errorf("writing %s: %w", dst.Name(), err)
		}
		written += to - run
		run = -1
		return nil
	}
	for p := int64(0); p < end; p += page {
		q := min(p+page, end)
		c := cur[p:q]
		var same bool
		if old == nil {
			same = isZero(c)
		} else {
			same = bytes.Equal(c, old[p:q])
		}
		switch {
		case same:
			if err := flush(p); err != nil {
				return written, err
			}
		case isZero(c):
			if err := flush(p); err != nil {
				return written, err
			}
			if err := punchHole(dst, off+p, q-p); err != nil {
				return written, err
			}
		case run < 0:
			run = p
		}
	}
	return written, flush(end)
}

// punchHole makes n bytes of f from off a hole, f's size unchanged.
func punchHole(f *os.File, off, n int64) error {
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		return fmt.Errorf("punching a hole in %s: %w", f.Name(), err)
	}
	return nil
}

var zeroPage [4096]byte

// isZero compares against a zero page: bytes.Equal is vectorised, a loop
// over bytes is not.
func isZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

// sparseMirror keeps dst, a sparse copy of src taken while src changed,
// up to date with src, writing only what differs. Both are mapped once
// and their data pre-faulted (prepare, while the guest runs), so a
// refresh in the pause reads memory instead of taking page faults. Only
// data extents are touched: reading a memfd's hole through a map would
// allocate it.
type sparseMirror struct {
	src, dst       *os.File
	size           int64
	srcMap, dstMap []byte
	// srcExt and dstExt are the files' data extents as prepare found
	// them; a refresh uses them rather than asking again (finding the
	// data of a memfd walks each of its pages: several milliseconds for
	// 170 MiB, in the pause) and clears them, the next one asking anew.
	srcExt, dstExt [][2]int64
}

// prepare maps both files and faults their data in.
func (mr *sparseMirror) prepare() error {
	fi, err := mr.src.Stat()
	if err != nil {
		return err
	}
	mr.size = fi.Size()
	if mr.size == 0 {
		return nil
	}
	if err := mr.dst.Truncate(mr.size); err != nil {
		return err
	}
	if mr.srcMap, err = unix.Mmap(int(mr.src.Fd()), 0, int(mr.size), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fmt.Errorf("mapping %s: %w", mr.src.Name(), err)
	}
	if mr.dstMap, err = unix.Mmap(int(mr.dst.Fd()), 0, int(mr.size), unix.PROT_READ, unix.MAP_SHARED); err != nil {
		mr.close()
		return fmt.Errorf("mapping %s: %w", mr.dst.Name(), err)
	}
	for _, m := range []struct {
		f   *os.File
		mem []byte
		ext *[][2]int64
	}{{mr.src, mr.srcMap, &mr.srcExt}, {mr.dst, mr.dstMap, &mr.dstExt}} {
		ext, err := dataPieces(m.f, mr.size, mr.size)
		if err != nil {
			mr.close()
			return err
		}
		*m.ext = ext
		// A read of every page makes the map's page table entries: a
		// page's first read through a new map costs a fault (a
		// microsecond or more here, and MADV_POPULATE_READ did not
		// spare it), which the pause then does not pay.
		var sum byte
		for _, e := range ext {
			for p := e[0]; p < e[1]; p += 4096 {
				sum += m.mem[p]
			}
		}
		touched += int(sum)
	}
	return nil
}

// touched keeps prepare's reads from being optimised away.
var touched int

func (mr *sparseMirror) close() {
	if mr.srcMap != nil {
		unix.Munmap(mr.srcMap)
		mr.srcMap = nil
	}
	if mr.dstMap != nil {
		unix.Munmap(mr.dstMap)
		mr.dstMap = nil
	}
}

// refresh makes dst equal to src: the pages whose bytes differ (runs of
// them in one write), holes for pages that became zero and for ranges
// src no longer holds. It returns the bytes written.
func (mr *sparseMirror) refresh() (int64, error) {
	src, dst, size := mr.src, mr.dst, mr.size
	if size == 0 {
		return 0, nil
	}
	if fi, err := src.Stat(); err != nil || fi.Size() != size {
		return 0, fmt.Errorf("%s changed size during the capture (%v)", src.Name(), err)
	}
	// dst changes only here; src's data only grows, unless the guest's
	// memory is punched (nothing does that to ours), and a page read
	// where src has a hole reads zeroes, which the compare handles. So
	// what prepare found, with the data since put in src's holes, covers
	// src.
	srcExt, dstExt := mr.srcExt, mr.dstExt
	mr.srcExt, mr.dstExt = nil, nil
	var err error
	if srcExt == nil {
		srcExt, err = dataPieces(src, size, size)
	} else {
		srcExt, err = withNewData(src, srcExt, size)
	}
	if err != nil {
		return 0, err
	}
	if dstExt == nil {
		if dstExt, err = dataPieces(dst, size, size); err != nil {
			return 0, err
		}
	}
	// What dst holds that src does not: holes.
	for _, d := range subtractExtents(dstExt, srcExt) {
		if err := punchHole(dst, d[0], d[1]-d[0]); err != nil {
			return 0, err
		}
	}
	// Two halves at once: the pause has both cores (the vCPUs are
	// stopped) and the compare is bound by memory reads.
	halves := splitExtents(srcExt)
	var wg sync.WaitGroup
	written := make([]int64, len(halves))
	errs := make([]error, len(halves))
	for i, h := range halves {
		wg.Add(1)
		go func() {
			defer wg.Done()
			written[i], errs[i] = mr.refreshExtents(h, dstExt)
		}()
	}
	wg.Wait()
	var n int64
	for i := range halves {
		n += written[i]
		if errs[i] != nil {
			return n, errs[i]
		}
	}
	return n, nil
}

// withNewData adds to ext, f's data extents when they were listed (sorted,
// disjoint, within size), the data f has since gained in ext's holes.
// Each hole is asked once and costs what it now holds, where listing f
// again would walk all of its data.
func withNewData(f *os.File, ext [][2]int64, size int64) ([][2]int64, error) {
	var out [][2]int64
	fd := int(f.Fd())
	hole := int64(0) // the start of the hole before ext[i]
	for i := 0; i <= len(ext); i++ {
		end := size
		if i < len(ext) {
			end = ext[i][0]
		}
		for off := hole; off < end; {
			data, err := unix.Seek(fd, off, unix.SEEK_DATA)
			if errors.Is(err, unix.ENXIO) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("finding data in %s: %w", f.Name(), err)
			}
			if data >= end {
				break
			}
			next, err := unix.Seek(fd, data, unix.SEEK_HOLE)
			if err != nil {
				return nil, fmt.Errorf("finding holes in %s: %w", f.Name(), err)
			}
			out = appendExtent(out, [2]int64{data, min(next, end)}, 0)
			off = next
		}
		if i < len(ext) {
			out = appendExtent(out, ext[i], 0)
			hole = ext[i][1]
		}
	}
	return out, nil
}

// appendExtent appends e to sorted extents, merging it with the last one
// when they touch or overlap and the merged extent is at most limit
// bytes long (0: any length). With a limit, extents must not overlap:
// one that cannot be merged is appended as it is.
func appendExtent(ext [][2]int64, e [2]int64, limit int64) [][2]int64 {
	if n := len(ext); n > 0 && ext[n-1][1] >= e[0] {
		end := max(ext[n-1][1], e[1])
		if limit == 0 || end-ext[n-1][0] <= limit {
			ext[n-1][1] = end
			return ext
		}
	}
	return append(ext, e)
}

// splitExtents cuts sorted extents into two lists of about equal bytes.
func splitExtents(ext [][2]int64) [][][2]int64 {
	var total int64
	for _, e := range ext {
		total += e[1] - e[0]
	}
	half := (total / 2) &^ 4095
	var first, second [][2]int64
	var seen int64
	for _, e := range ext {
		switch {
		case seen >= half:
			second = append(second, e)
		case seen+e[1]-e[0] <= half:
			first = append(first, e)
		default:
			cut := e[0] + half - seen
			first = append(first, [2]int64{e[0], cut})
			second = append(second, [2]int64{cut, e[1]})
		}
		seen += e[1] - e[0]
	}
	return [][][2]int64{first, second}
}

// refreshExtents brings the src extents ext of dst up to date; dstExt
// are dst's data extents. Each extent is mended in pieces: against dst's
// bytes where dst holds data, against zeroes where it has a hole.
func (mr *sparseMirror) refreshExtents(ext, dstExt [][2]int64) (int64, error) {
	var written int64
	j := 0 // dstExt[j] is the first extent that ends after p
	for _, e := range ext {
		for p := e[0]; p < e[1]; {
			for j < len(dstExt) && dstExt[j][1] <= p {
				j++
			}
			var old []byte
			q := e[1]
			switch {
			case j < len(dstExt) && dstExt[j][0] <= p: // dst data
				q = min(q, dstExt[j][1])
				old = mr.dstMap[p:q]
			case j < len(dstExt): // a hole up to dst's next data
				q = min(q, dstExt[j][0])
			}
			n, err := mendPages(mr.dst, p, mr.srcMap[p:q], old)
			written += n
			if err != nil {
				return written, err
			}
			p = q
		}
	}
	return written, nil
}

// subtractExtents returns the parts of a (sorted, disjoint extents) that
// b (the same) does not cover.
func subtractExtents(a, b [][2]int64) [][2]int64 {
	var out [][2]int64
	j := 0
	for _, e := range a {
		start := e[0]
		for j < len(b) && b[j][1] <= start {
			j++
		}
		for k := j; k < len(b) && b[k][0] < e[1]; k++ {
			if b[k][0] > start {
				out = append(out, [2]int64{start, b[k][0]})
			}
			start = max(start, b[k][1])
		}
		if start < e[1] {
			out = append(out, [2]int64{start, e[1]})
		}
	}
	return out
}
