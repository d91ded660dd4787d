package session

import (
	"context"
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

// The persistent disk across captures: how a base, a fork and a park
// carry it, and its section of an artifact, are internal/disk's
// (disk.Component); attaching and holding it is the session's.

// ForkDiskLayer is a fork's disk layer in its launch directory when
// nether.conf's disk = does not name one.
const ForkDiskLayer = "disk.qcow2"

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
	sec, has, err := disk.Captured(art)
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
	stamped, err := disk.CheckLive(ctx, sec, true)
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
	sec, has, err := disk.Captured(art)
	if err != nil || !has || sec.Layer {
		return err
	}
	_, err = disk.CheckLive(ctx, sec, false)
	return err
}
