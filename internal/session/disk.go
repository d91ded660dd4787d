package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/internal/agentclient"
	"github.com/nethersandbox/nether/internal/disk"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// The persistent disk across captures. A base carries the disk as it was
// at the instant of the capture, as its own file (the engine copies it
// while the guest runs on), so a fork's page cache and its disk agree; a
// fork writes into a copy-on-write layer of its own over it. A park keeps
// its disk where it is: the file the parked sandbox was writing is the one
// its wake continues, and the park records its size and checksums so a
// wake can tell nothing touched it in between.

// ForkDiskLayer is a fork's disk layer in its launch directory when
// nether.conf's disk = does not name one.
const ForkDiskLayer = "disk.qcow2"

const diskComponentName = "disk"

// diskSection is the disk's part of an artifact.
type diskSection struct {
	// Layer: the artifact's disk file is the disk at capture (a base).
	Layer bool `json:"layer,omitempty"`
	// Live (a park): the disk file the parked sandbox wrote, continued by
	// its wake, with its size and chunk checksums when the guest stopped.
	Live   string   `json:"live,omitempty"`
	Size   int64    `json:"size,omitempty"`
	Chunks []uint32 `json:"chunks,omitempty"`
	// Stamp (a park) is the live disk's stamp when its checksums were
	// taken: a wake that finds the same stamp knows the disk unchanged
	// without reading it. Absent in parks from before it was recorded.
	Stamp *snapshot.FileStamp `json:"stamp,omitempty"`
}

// maxStampWait is how long a park waits for its disk's stamp to be clear
// of the last write (FileStamp.ClearAt); a disk on a file system of whole
// seconds is not worth two of them, and its wake compares checksums.
const maxStampWait = 50 * time.Millisecond

// diskComponent saves the disk section. The capture tells it what kind
// of artifact it is writing (a base copies the disk, a park refers to
// it); the engine does the copying.
type diskComponent struct {
	s    *Session // nil: validation only
	kind snapshot.Kind
}

func (c *diskComponent) Name() string     { return diskComponentName }
func (c *diskComponent) Version() int     { return 1 }
func (c *diskComponent) Required() bool   { return false }
func (c *diskComponent) Quiescent() error { return nil }
func (c *diskComponent) Freeze()          {}
func (c *diskComponent) Thaw()            {}

// Save runs with the guest paused: the engine has flushed the disk, so a
// park's checksums are of what the guest wrote, all of it.
func (c *diskComponent) Save() (json.RawMessage, error) {
	if c.s == nil || c.s.diskPath == "" {
		return json.RawMessage(`{}`), nil
	}
	if c.kind != snapshot.KindPark {
		return json.Marshal(diskSection{Layer: true})
	}
	sec, err := parkedDisk(context.Background(), c.s.diskPath)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sec)
}

// parkedDisk records a parked sandbox's disk: its size and checksums, and
// its stamp if nothing changed it while they were taken (nothing should:
// the guest is paused and the disk locked).
func parkedDisk(ctx context.Context, path string) (diskSection, error) {
	before, err := snapshot.StatStamp(path)
	if err != nil {
		return diskSection{}, fmt.Errorf("the disk: %w", err)
	}
	wait := time.Until(before.ClearAt())
	if wait > 0 && wait <= maxStampWait {
		// The guest wrote within a clock tick: a change right after
		// the stamp could leave the same ctime behind.
		time.Sleep(wait)
	}
	size, chunks, err := fileChunks(ctx, path)
	if err != nil {
		return diskSection{}, fmt.Errorf("checksumming the disk: %w", err)
	}
	sec := diskSection{Live: path, Size: size, Chunks: chunks}
	after, err := snapshot.StatStamp(path)
	if err == nil && after == before && !time.Now().Before(before.ClearAt()) {
		sec.Stamp = &before
	}
	return sec, nil
}

// Restore checks the section; the disk itself is attached before the
// engine starts (restoreDisk).
func (c *diskComponent) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil
	}
	_, err := decodeDiskSection(data)
	return err
}

func decodeDiskSection(data json.RawMessage) (diskSection, error) {
	var sec diskSection
	if err := json.Unmarshal(data, &sec); err != nil {
		return sec, fmt.Errorf("the disk section: %w", err)
	}
	if sec.Layer && sec.Live != "" {
		return sec, errors.New("the disk section names both a layer and a live disk")
	}
	if sec.Live != "" && (!filepath.IsAbs(sec.Live) || int64(len(sec.Chunks)) != (sec.Size+snapshot.ChunkSize-1)/snapshot.ChunkSize) {
		return sec, errors.New("the disk section's live disk is malformed")
	}
	return sec, nil
}

// capturedDisk is the artifact's disk section; ok is false for an
// artifact of a sandbox without a disk.
func capturedDisk(art *snapshot.Artifact) (diskSection, bool, error) {
	raw, ok := art.Meta.Sections[diskComponentName]
	if !ok {
		return diskSection{}, false, nil
	}
	sec, err := decodeDiskSection(raw.Data)
	if err != nil {
		return sec, false, err
	}
	has := sec.Layer || sec.Live != ""
	if sec.Layer {
		if _, listed := art.Meta.Files[snapshot.FileDisk]; !listed {
			return sec, false, errors.New("the disk section names a layer the artifact does not list")
		}
	}
	return sec, has, nil
}

// fileChunks checksums a disk file the way artifacts do.
func fileChunks(ctx context.Context, path string) (int64, []uint32, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, nil, err
	}
	chunks, err := snapshot.ChunkSums(ctx, f, st.Size())
	return st.Size(), chunks, err
}

// checkLiveDisk compares a parked sandbox's disk with what the park
// recorded: its presence, size and checksums. With trustStamp, a disk
// whose stamp is the one the park recorded is known unchanged without
// being read (a wake: a multi-GiB disk took seconds to read);
// validate_snapshot reads it all the same.
func checkLiveDisk(ctx context.Context, sec diskSection, trustStamp bool) (stamped bool, err error) {
	if trustStamp && sec.Stamp != nil {
		if st, err := snapshot.StatStamp(sec.Live); err == nil && st == *sec.Stamp {
			return true, nil
		}
	}
	size, chunks, err := fileChunks(ctx, sec.Live)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, fmt.Errorf("the parked sandbox's disk %s is missing", sec.Live)
	case err != nil:
		return false, fmt.Errorf("the parked sandbox's disk: %w", err)
	case size != sec.Size:
		return false, fmt.Errorf("the parked sandbox's disk %s is %d bytes, the park recorded %d: it changed since the park", sec.Live, size, sec.Size)
	}
	for i := range chunks {
		if chunks[i] != sec.Chunks[i] {
			return false, fmt.Errorf("the parked sandbox's disk %s changed since the park (chunk %d, offset %d, differs); waking on it would hand the guest a disk its memory does not expect", sec.Live, i, int64(i)*snapshot.ChunkSize)
		}
	}
	return false, nil
}

// bootDisk prepares nether.conf's disk for a boot: created and
// formatted when new, checked when not, and locked.
func (s *Session) bootDisk(ctx context.Context, spec *engine.Spec) error {
	lock, info, err := disk.Prepare(ctx, s.cfg.Disk, s.cfg.DiskSizeMB)
	if err != nil {
		return err
	}
	s.holdDisk(lock, info.Path)
	if info.Fresh {
		s.log.Info("created the persistent disk", "path", info.Path, "size_mb", s.cfg.DiskSizeMB)
	}
	spec.Disk = &engine.Disk{Path: info.Path, QCOW2: info.Format == disk.QCOW2}
	return nil
}

// restoreDisk attaches the disk a restore's memory expects: a fork gets
// a new layer over the artifact's disk, a wake the disk it parked with,
// checked against the park's record and locked.
func (s *Session) restoreDisk(ctx context.Context, spec *engine.Spec, art *snapshot.Artifact) error {
	sec, has, err := capturedDisk(art)
	if err != nil {
		return err
	}
	if !has {
		if s.cfg.Disk != "" {
			return fmt.Errorf("disk = %s: the snapshot was captured without a persistent disk, and a restore cannot add one (its memory knows no such device)", s.cfg.Disk)
		}
		return nil
	}
	if sec.Layer {
		path := s.cfg.Disk
		if path == "" {
			path = filepath.Join(s.cfg.Dir, ForkDiskLayer)
		}
		if _, err := os.Lstat(path); err == nil {
			return fmt.Errorf("disk = %s exists: a fork writes into a new copy-on-write layer over its snapshot's disk; remove the file or name a new one", path)
		}
		lm, ok := s.opt.Engine.(engine.LayerMaker)
		if !ok {
			return errors.New("this engine cannot give a fork a disk layer")
		}
		// Made now, before the artifact's verification takes the CPUs:
		// the engine cannot start before its disk exists.
		if err := lm.CreateLayer(ctx, path, filepath.Join(art.Dir, snapshot.FileDisk)); err != nil {
			return err
		}
		lock, err := disk.LockLayer(path)
		if err != nil {
			os.Remove(path)
			return err
		}
		s.holdDisk(lock, path)
		s.forkLayer = path
		spec.Disk = &engine.Disk{Path: path, QCOW2: true}
		return nil
	}
	if s.cfg.Disk != "" && s.cfg.Disk != sec.Live {
		return fmt.Errorf("disk = %s: the park continues its own disk %s; leave disk unset or name that file", s.cfg.Disk, sec.Live)
	}
	lock, err := disk.LockLayer(sec.Live)
	if err != nil {
		return err
	}
	start := time.Now()
	stamped, err := checkLiveDisk(ctx, sec, true)
	if err != nil {
		lock.Close()
		return err
	}
	s.log.Debug("the parked disk is unchanged", "path", sec.Live, "by_stamp", stamped, "took_ms", time.Since(start).Milliseconds())
	format, err := disk.FormatOf(sec.Live)
	if err != nil {
		lock.Close()
		return err
	}
	s.holdDisk(lock, sec.Live)
	spec.Disk = &engine.Disk{Path: sec.Live, QCOW2: format == disk.QCOW2}
	return nil
}

// namedAgentErr puts the disk's host file into a refusal of a guest that
// could not mount it (the guest knows only its block device), with what
// the user can do; any other err is returned as it is.
func (s *Session) namedAgentErr(err error) error {
	var de *agentclient.DiskError
	if !errors.As(err, &de) {
		return err
	}
	return fmt.Errorf("the disk %s %s; %s", s.diskPath, de.Problem, disk.NeverRepairs)
}

// endOnDiskError ends the sandbox when err, the agent's refusal, is a
// guest that could not mount its disk.
func (s *Session) endOnDiskError(err error) {
	var de *agentclient.DiskError
	if !errors.As(err, &de) {
		return
	}
	// Run logs it as the session's end.
	s.fail(s.namedAgentErr(err))
}

func (s *Session) holdDisk(l *disk.Lock, path string) {
	s.diskPath = path
	if old := s.diskLock.Swap(l); old != nil {
		old.Close()
	}
}

// releaseDisk lets the disk go once the engine is gone.
func (s *Session) releaseDisk() {
	if l := s.diskLock.Swap(nil); l != nil {
		l.Close()
	}
}

// startDiskCapture starts the engine's copy of the disk for a base, with
// the guest paused; the returned wait ends when the copy is durable.
func (s *Session) startDiskCapture(ctx context.Context, kind snapshot.Kind, sink engine.Sink) (func(context.Context) error, error) {
	if s.diskPath == "" || kind == snapshot.KindPark {
		return func(context.Context) error { return nil }, nil
	}
	dc, ok := s.machine.(engine.DiskCapturer)
	if !ok {
		return nil, fmt.Errorf("the %s engine cannot capture a persistent disk", s.machine.Info().Backend)
	}
	return dc.CaptureDisk(ctx, sink)
}

// validateDisk is validate_snapshot's check of the disk: a base's layer
// is checked with the artifact's files; a park's live disk here.
func validateDisk(ctx context.Context, art *snapshot.Artifact) error {
	sec, has, err := capturedDisk(art)
	if err != nil || !has || sec.Layer {
		return err
	}
	_, err = checkLiveDisk(ctx, sec, false)
	return err
}
