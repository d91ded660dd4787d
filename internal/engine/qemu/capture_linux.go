package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/engine"
)

// A live capture does the bulk of a capture while the guest runs, so the
// pause costs what changed since, not what the guest holds:
//
//   - QEMU migrates into nether (a socket pair, not a file) with the
//     guest running, and stops the guest itself once what is left is
//     small (pause-before-switchover holds it there, before the final
//     pass, until the session has frozen its side). streamFilter copies
//     the stream into "state" and takes guest RAM out of it: a restore
//     maps the "ram" file, the stream holds only devices;
//   - guest RAM QEMU maps privately (a fork, a restore) arrives in the
//     stream, page by page, and goes into "ram" at its offset: the first
//     pass while the guest runs, then the pages it wrote since;
//   - guest RAM in our shared memfd (a booted sandbox, a woken park) is
//     skipped by QEMU (x-ignore-shared) and copied by nether while the
//     guest runs; in the pause nether compares it with the copy and
//     writes only the pages that differ (sparseMirror);
//   - the channel's lane, which nether writes into QEMU's memory behind
//     QEMU's dirty tracking, is left out of the passes and written whole
//     at the end of the final one, when nothing can change it.
//
// Either way the artifact is what a stopped capture writes: "ram" whole
// and sparse, "state" with the devices, restored the same way.

// liveDowntime is the pause QEMU aims for when it decides the guest can
// stop: it stops the guest once what is left to send takes about this
// long at the rate it measured.
const liveDowntime = 5 // ms

// liveConverge bounds how long QEMU may chase a guest that writes faster
// than its passes send, per GiB of guest RAM (a first pass under TCG moves
// about 1 GiB/s); after that nether stops the guest itself and QEMU sends
// what is left in the pause.
const liveConverge = 2 * time.Second

// liveCapture is a capture begun by Precopy and finished by Capture.
type liveCapture struct {
	sink       engine.Sink
	state, ram *os.File
	conn       *os.File // nether's end of the migration socket
	// filtered closes when the stream filter is done, filterErr set.
	filtered  chan struct{}
	filterErr error
	ramBytes  int64         // bytes of guest memory written
	refreshed int64         // and in the pause, by the refresh
	mirror    *sparseMirror // shared guest memory and its copy
	private   *privateRAM   // privately mapped guest memory
	// lane carries the lane's bytes, read once the guest is stopped,
	// to the filter that puts them at the end of the final pass.
	lane chan laneRead
	// passesDone closes when the stream's passes are in "ram" and its
	// final pass begins.
	passesDone chan struct{}
	// stoppedBy: nether stopped the guest to end the passes (QEMU did
	// not converge); an abort must start it again.
	stoppedBy bool
}

// Precopy begins a capture into sink while the guest runs and returns
// once QEMU has stopped the guest for the final pass, or an error with
// the guest running as before (AbortPrecopy undoes the rest). pausedAt
// is when the guest stopped.
func (m *Machine) Precopy(ctx context.Context, sink engine.Sink) (pausedAt time.Time, err error) {
	m.AbortPrecopy()
	lc := &liveCapture{sink: sink, filtered: make(chan struct{}), lane: make(chan laneRead, 1), passesDone: make(chan struct{})}
	m.live = lc
	defer func() {
		if err != nil {
			m.AbortPrecopy()
		}
	}()
	if lc.state, err = sink.CreateFile("state"); err != nil {
		return time.Time{}, err
	}
	if lc.ram, err = sink.CreateFile("ram"); err != nil {
		return time.Time{}, err
	}
	if m.mem != nil {
		if lc.ramBytes, err = CopySparse(lc.ram, m.mem); err != nil {
			return time.Time{}, fmt.Errorf("copying guest memory: %w", err)
		}
		lc.mirror = &sparseMirror{src: m.mem, dst: lc.ram}
		if err := lc.mirror.prepare(); err != nil {
			return time.Time{}, fmt.Errorf("copying guest memory: %w", err)
		}
	}
	if m.mem == nil && m.incoming != nil && m.ramIn == ramFile {
		lc.private, err = openPrivateRAM(m.cmd.Process.Pid, filepath.Join(m.incoming.Dir, "ram"), m.ramBytesTotal())
		if err != nil {
			return time.Time{}, err
		}
	}
	if err := m.liveTuning(ctx); err != nil {
		return time.Time{}, fmt.Errorf("preparing migration: %w", err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return time.Time{}, fmt.Errorf("making the migration socket: %w", err)
	}
	qemuEnd := os.NewFile(uintptr(fds[1]), "migration-qemu")
	lc.conn = os.NewFile(uintptr(fds[0]), "migration")
	_, err = m.qmp.executeFD(ctx, "getfd", map[string]any{"fdname": "snapstate"}, qemuEnd)
	qemuEnd.Close()
	if err != nil {
		return time.Time{}, fmt.Errorf("handing QEMU the migration socket: %w", err)
	}
	go func() {
		lc.filterErr = m.filterStream(lc)
		close(lc.filtered)
	}()
	m.mu.Lock()
	m.stoppedAt = time.Time{}
	m.mu.Unlock()
	if _, err := m.qmp.execute(ctx, "migrate", map[string]any{"uri": "fd:snapstate"}); err != nil {
		return time.Time{}, fmt.Errorf("starting migration: %w", err)
	}
	limit := time.Now().Add(liveConverge * time.Duration(1+m.ramBytesTotal()>>30))
	for {
		st, err := m.migrationStatus(ctx)
		if err != nil {
			return time.Time{}, m.liveError(lc, err)
		}
		if st == "pre-switchover" {
			break
		}
		if !lc.stoppedBy && time.Now().After(limit) {
			// The guest writes faster than QEMU sends: stop it, and
			// QEMU's next pass is its last.
			if _, err := m.qmp.execute(ctx, "stop", nil); err != nil {
				return time.Time{}, fmt.Errorf("stopping the guest for the final pass: %w", err)
			}
			lc.stoppedBy = true
		}
		if err := m.migrationWait(ctx, time.Millisecond); err != nil {
			return time.Time{}, err
		}
	}
	m.mu.Lock()
	pausedAt = m.stoppedAt
	m.mu.Unlock()
	if pausedAt.IsZero() {
		pausedAt = time.Now()
	}
	return pausedAt, nil
}

// AbortPrecopy ends a capture Precopy began that no Capture finished:
// QEMU's migration is cancelled, the guest runs again, nether's files
// are closed (the sink removes them). It does nothing without one.
func (m *Machine) AbortPrecopy() {
	lc := m.live
	if lc == nil {
		return
	}
	m.live = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if lc.conn != nil {
		m.qmp.execute(ctx, "migrate_cancel", nil)
		lc.conn.Close() // the filter's read ends, QEMU's writes fail
		select {
		case <-lc.filtered:
		case <-ctx.Done():
		}
		// Cancelled, QEMU starts a guest it stopped itself once its
		// migration has ended; one nether stopped, nether starts. The
		// session resumes a guest it paused.
		for ctx.Err() == nil {
			st, err := m.migrationStatus(ctx)
			if err != nil || st == "completed" || st == "none" {
				break
			}
			m.migrationWait(ctx, time.Millisecond)
		}
		if lc.stoppedBy {
			m.qmp.execute(ctx, "cont", nil)
		}
	}
	if lc.mirror != nil {
		lc.mirror.close()
	}
	if lc.private != nil {
		lc.private.close()
	}
	for _, f := range []*os.File{lc.state, lc.ram} {
		if f != nil {
			f.Close()
		}
	}
}

// finishLive is Capture for a capture Precopy began: the final pass with
// the guest paused, and the compare of shared memory beside it.
func (m *Machine) finishLive(ctx context.Context, lc *liveCapture) (out engine.Captured, err error) {
	defer func() {
		if err != nil {
			m.AbortPrecopy()
		}
	}()
	start := time.Now()
	refreshed := make(chan error, 1)
	var refreshTime time.Duration
	if lc.mirror != nil {
		go func() {
			t := time.Now()
			n, err := lc.mirror.refresh()
			lc.refreshed = n
			refreshTime = time.Since(t)
			refreshed <- err
		}()
	} else if lc.private != nil {
		go func() {
			// The guest is stopped: the pages it owns are final, and
			// listing them needs nothing of QEMU's, so it starts now.
			t := time.Now()
			runs, err := lc.private.ownPages()
			listing := time.Since(t)
			if err != nil {
				refreshed <- err
				return
			}
			// The compare waits for the passes to be written (the final
			// pass writes what this does: the guest is stopped).
			select {
			case <-lc.passesDone:
			case <-lc.filtered:
				select {
				case <-lc.passesDone:
				default:
					refreshed <- nil // failed before the final pass: no capture to mend
					return
				}
			}
			t = time.Now()
			n, err := lc.private.refreshRuns(lc.ram, runs)
			lc.refreshed, refreshTime = n, listing+time.Since(t)
			refreshed <- err
		}()
	} else {
		refreshed <- nil
	}
	if m.procLane != nil {
		// The lane is final now (the guest is stopped, the host's
		// side frozen): read it while QEMU finishes, for the filter to
		// put at the end of the final pass.
		go func() {
			buf := make([]byte, laneBytes)
			_, err := m.procLane.ReadAt(buf, 0)
			lc.lane <- laneRead{buf, err}
		}()
	}
	if _, err := m.qmp.execute(ctx, "migrate-continue", map[string]any{"state": "pre-switchover"}); err != nil {
		lc.conn.Close() // the filter ends, and the refresh waiting on it
		<-refreshed
		return out, fmt.Errorf("finishing migration: %w", err)
	}
	// The filter ends when QEMU has written its last byte; QEMU then
	// reports the migration completed, or why it failed.
	var ferr error
	select {
	case <-lc.filtered:
		ferr = lc.filterErr
	case <-m.done:
	case <-ctx.Done():
	}
	werr := m.waitMigration(ctx)
	if werr == nil && ferr == nil && ctx.Err() != nil {
		ferr = fmt.Errorf("writing the artifact's device state: %w", ctx.Err())
	}
	select {
	case <-lc.filtered:
	default:
		lc.conn.Close() // QEMU is gone or the time is up: end the filter, and the refresh waiting on it
	}
	rerr := <-refreshed
	switch {
	case werr != nil:
		return out, m.liveError(lc, fmt.Errorf("saving device state: %w", werr))
	case ferr != nil:
		return out, ferr
	case rerr != nil:
		return out, fmt.Errorf("copying guest memory: %w", rerr)
	}
	if lc.private != nil {
		lc.private.close()
		lc.private = nil
	}
	out.DeviceState, out.RAMCopy = time.Since(start), refreshTime
	m.live = nil
	if lc.mirror != nil {
		// Unmapping hundreds of MiB takes tens of milliseconds of CPU:
		// not in the pause, nor beside the guest's resume.
		time.AfterFunc(time.Second, lc.mirror.close)
	}
	for _, f := range []*os.File{lc.conn, lc.state, lc.ram} {
		f.Close()
	}
	out.RAMInFile, out.RAMBytes = true, lc.ramBytes+lc.refreshed
	if out.Section, err = m.section(ramFile).encode(); err != nil {
		return out, err
	}
	return out, nil
}

// liveError prefers the stream filter's reason to QEMU's when the
// filter failed first (a full disk: QEMU then reports a broken pipe).
func (m *Machine) liveError(lc *liveCapture, err error) error {
	lc.conn.Close()
	select {
	case <-lc.filtered:
		if lc.filterErr != nil {
			return lc.filterErr
		}
	case <-time.After(time.Second):
	}
	return err
}

// filterStream reads QEMU's migration stream into the artifact.
func (m *Machine) filterStream(lc *liveCapture) (err error) {
	defer func() {
		if err != nil {
			// QEMU's next write fails: the migration ends with this error.
			lc.conn.Close()
		}
	}()
	out := bufio.NewWriterSize(lc.state, 1<<20)
	ram := &ramFileWriter{f: lc.ram}
	f := &streamFilter{
		in:    bufio.NewReaderSize(lc.conn, 1<<20),
		out:   out,
		addrs: true,
		take:  map[string]pageFunc{},
	}
	f.choose = func(block string, size int64) error {
		switch {
		case block == "ram0" && m.mem == nil:
			if err := lc.ram.Truncate(size); err != nil {
				return fmt.Errorf("sizing the artifact's guest memory: %w", err)
			}
			ram.size(size)
			f.take[block] = ram.page
		case m.procLane != nil && (block == "lane0" || strings.HasSuffix(block, "/lane0")):
			f.take[block] = nil
			f.atEnd = func(put func(string, int64, []byte) error) error {
				return m.putLane(lc, block, size, put)
			}
		}
		return nil
	}
	f.beforeEnd = func() error {
		// The passes are written: the private refresh may start beside
		// the final pass, whose pages are the ones it writes too.
		if err := ram.flush(); err != nil {
			return err
		}
		close(lc.passesDone)
		return nil
	}
	if err := f.run(); err != nil {
		return err
	}
	if err := ram.flush(); err != nil {
		return err
	}
	lc.ramBytes += ram.bytes
	if err := out.Flush(); err != nil {
		return fmt.Errorf("writing the artifact's device state: %w", err)
	}
	return nil
}

type laneRead struct {
	buf []byte
	err error
}

// putLane writes the lane whole into the stream's final pass, as
// finishLive read it.
func (m *Machine) putLane(lc *liveCapture, block string, size int64, put func(string, int64, []byte) error) error {
	r := <-lc.lane
	if r.err != nil {
		return fmt.Errorf("reading the channel's lane: %w", r.err)
	}
	if int64(len(r.buf)) != size {
		return fmt.Errorf("the stream's lane is %d bytes, the lane %d", size, len(r.buf))
	}
	for off := int64(0); off < size; off += streamPage {
		if err := put(block, off, r.buf[off:off+streamPage]); err != nil {
			return err
		}
	}
	return nil
}

// liveTuning sets QEMU's migration up for a live capture.
func (m *Machine) liveTuning(ctx context.Context) error {
	if _, err := m.qmp.execute(ctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{
			{"capability": "x-ignore-shared", "state": true},
			{"capability": "pause-before-switchover", "state": true},
		},
	}); err != nil {
		return err
	}
	_, err := m.qmp.execute(ctx, "migrate-set-parameters", map[string]any{
		"max-bandwidth": int64(1) << 40, "downtime-limit": liveDowntime,
	})
	return err
}

// migrationStatus is query-migrate's status, or the reason it failed.
func (m *Machine) migrationStatus(ctx context.Context) (string, error) {
	raw, err := m.qmp.execute(ctx, "query-migrate", nil)
	if err != nil {
		// QEMU may be on its way out: say so rather than that QMP broke.
		select {
		case <-m.done:
			return "", m.exitError("QEMU exited during migration")
		case <-time.After(time.Second):
		}
		return "", err
	}
	var st struct {
		Status    string `json:"status"`
		ErrorDesc string `json:"error-desc"`
	}
	json.Unmarshal(raw, &st)
	switch st.Status {
	case "failed", "cancelled":
		if st.ErrorDesc == "" {
			return "", fmt.Errorf("migration %s", st.Status)
		}
		return "", fmt.Errorf("migration failed: %s", st.ErrorDesc)
	}
	return st.Status, nil
}

// migrationWait waits delay between two looks at a migration, or until
// QEMU exits or ctx ends.
func (m *Machine) migrationWait(ctx context.Context, delay time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-m.done:
		return m.exitError("QEMU exited during migration")
	case <-time.After(delay):
		return nil
	}
}

// ramBytesTotal is the guest's RAM size as QEMU was told.
func (m *Machine) ramBytesTotal() int64 { return int64(m.ramMB) << 20 }

// ramFileWriter writes the pages of guest RAM a stream carries into the
// artifact's sparse "ram" file: runs of pages in one write, zero pages as
// holes (punched where a page an earlier pass sent became zero).
type ramFileWriter struct {
	f       *os.File
	pages   int64    // the guest memory's size in pages
	written []uint64 // a bit for each page holding data
	run     []byte
	runOff  int64
	bytes   int64
}

const ramRunMax = 1 << 20

// size sets the guest memory's size, before the first page.
func (w *ramFileWriter) size(bytes int64) {
	w.pages = bytes / streamPage
	w.written = make([]uint64, (w.pages+63)/64)
}

func (w *ramFileWriter) page(off int64, page []byte) error {
	n := off / streamPage
	if off < 0 || n >= w.pages {
		return fmt.Errorf("a page at %#x, past the guest memory's end", off)
	}
	if page == nil {
		if w.written[n/64]&(1<<(n%64)) == 0 {
			return nil
		}
		if err := w.flush(); err != nil {
			return err
		}
		w.written[n/64] &^= 1 << (n % 64)
		if err := punchHole(w.f, off, streamPage); err != nil {
			return fmt.Errorf("writing the artifact's guest memory: %w", err)
		}
		return nil
	}
	if len(w.run) > 0 && (w.runOff+int64(len(w.run)) != off || len(w.run) >= ramRunMax) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	if len(w.run) == 0 {
		w.runOff = off
	}
	w.run = append(w.run, page...)
	w.written[n/64] |= 1 << (n % 64)
	return nil
}

func (w *ramFileWriter) flush() error {
	if len(w.run) == 0 {
		return nil
	}
	if _, err := w.f.WriteAt(w.run, w.runOff); err != nil {
		return fmt.Errorf("writing the artifact's guest memory: %w", err)
	}
	w.bytes += int64(len(w.run))
	w.run = w.run[:0]
	return nil
}
