package nexus

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
)

// An artifact's meta.json pins the whole artifact (runner.ArtifactDigest):
// nexus records its digest when the snapshot is committed and checks it
// before each use; nether checks every chunk against meta.json as it
// restores.
func digestOf(dir string) (string, error) { return runner.ArtifactDigest(dir) }

// diskUsage is the bytes an artifact takes on disk (its RAM file is
// sparse).
func diskUsage(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// verify checks a snapshot before it is used: its files are there and
// its digest is the one recorded at commit.
func verify(s *Snapshot) error {
	got, err := digestOf(s.Dir)
	if err != nil {
		return fmt.Errorf("snapshot %s is damaged: %w", s.Ref(), err)
	}
	if got != s.Digest {
		return fmt.Errorf("snapshot %s is corrupted: its digest is %s, recorded %s; remove it (nexus snapshot rm) and take another", s.Ref(), got, s.Digest)
	}
	return nil
}

// SnapshotCreate captures a running sandbox into the snapshot store; the
// sandbox keeps running. name is optional and unique.
func (n *Nexus) SnapshotCreate(ctx context.Context, ref, name string) (*Snapshot, error) {
	return n.snapshotCreate(ctx, ref, name, false)
}

func (n *Nexus) snapshotCreate(ctx context.Context, ref, name string, clean bool) (*Snapshot, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if name != "" {
		if err := n.db.View(func(tx *store.Tx) error {
			if _, err := tx.FindSnapshot(name); err == nil {
				return fmt.Errorf("%w: a snapshot named %q already exists", store.ErrNameTaken, name)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	sb, err := n.acquire(ctx, ref, lifecycle.Snapshot)
	if err != nil {
		return nil, err
	}
	if clean {
		if err := n.checkClean(ctx, sb); err != nil {
			n.audit(evSnapshot, sb, "", err)
			return nil, n.finish(sb, "", err)
		}
	}
	snap, err := n.capture(ctx, sb, name, clean)
	return snap, n.finish(sb, sb.State, err)
}

// capture takes a base of a running sandbox (whose lease the caller
// holds) into the store. The record exists, leased, before the capture,
// so that a nexus that dies halfway leaves something its successor
// removes (Reconcile), never an artifact nobody knows.
func (n *Nexus) capture(ctx context.Context, sb *Sandbox, name string, clean bool) (*Snapshot, error) {
	snap, err := n.captureInto(ctx, sb, name, clean)
	id := ""
	if snap != nil {
		id = snap.ID
	}
	n.audit(evSnapshot, sb, id, err)
	return snap, err
}

func (n *Nexus) captureInto(ctx context.Context, sb *Sandbox, name string, clean bool) (*Snapshot, error) {
	id := newID()
	class := ClassDirty
	if clean {
		class = ClassClean
	}
	snap := &Snapshot{ID: id, Name: name, Source: sb.ID, Config: sb.Config, Plan: sb.Plan, Class: class, Dir: filepath.Join(n.dir, snapshotsDir, id), Created: time.Now().UTC(),
		Lease: &store.Lease{Op: "snapshot", Holder: os.Getpid(), Expires: time.Now().Add(leaseTTL)}}
	if err := n.db.Update(func(tx *store.Tx) error { return tx.PutSnapshot(snap) }); err != nil {
		return nil, err
	}
	undo := func(err error) (*Snapshot, error) {
		os.RemoveAll(snap.Dir)
		n.db.Update(func(tx *store.Tx) error { return tx.DeleteSnapshot(snap) })
		return nil, err
	}
	rel := captureRel(id)
	// nether writes artifacts inside its launch directory; the store is
	// on the same filesystem, so the move is a rename.
	if err := n.verb(ctx, sb, func(c runner.Conn) error { _, err := c.Snapshot(ctx, rel); return err }); err != nil {
		os.RemoveAll(filepath.Join(n.sandboxDir(sb.ID), rel))
		return undo(err)
	}
	if err := os.Rename(filepath.Join(n.sandboxDir(sb.ID), rel), snap.Dir); err != nil {
		os.RemoveAll(filepath.Join(n.sandboxDir(sb.ID), rel))
		return undo(fmt.Errorf("moving the snapshot into the store: %w", err))
	}
	d, err := digestOf(snap.Dir)
	if err != nil {
		return undo(err)
	}
	snap.Digest, snap.Size, snap.Lease = d, diskUsage(snap.Dir), nil
	if err := n.db.Update(func(tx *store.Tx) error { return tx.PutSnapshot(snap) }); err != nil {
		return undo(err)
	}
	return snap, nil
}

// captureRel is where, inside its sandbox's launch directory, nether
// writes snapshot id's artifact before nexus moves it into the store.
func captureRel(id string) string { return "snap-" + id }

// reconcileSnapshots removes what an interrupted capture left: records
// never committed, and artifact directories no record names.
func (n *Nexus) reconcileSnapshots(tx *store.Tx, now time.Time) error {
	snaps, err := tx.Snapshots()
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, s := range snaps {
		if s.Digest == "" && !s.Lease.Live(now) {
			n.log.Warn("removing a snapshot whose capture never finished", "snapshot", s.ID)
			os.RemoveAll(s.Dir)
			if s.Source != "" {
				// Where nether wrote it, when the nexus died before the
				// move into the store: a whole guest's memory, else
				// kept in the sandbox's directory for good.
				os.RemoveAll(filepath.Join(n.sandboxDir(s.Source), captureRel(s.ID)))
			}
			if err := tx.DeleteSnapshot(s); err != nil {
				return err
			}
			continue
		}
		known[filepath.Base(s.Dir)] = true
	}
	ents, _ := os.ReadDir(filepath.Join(n.dir, snapshotsDir))
	for _, e := range ents {
		if !known[e.Name()] {
			n.log.Warn("removing an artifact no snapshot record names", "dir", e.Name())
			os.RemoveAll(filepath.Join(n.dir, snapshotsDir, e.Name()))
		}
	}
	return nil
}

// SnapshotList returns the committed snapshots, oldest first.
func (n *Nexus) SnapshotList(ctx context.Context) ([]*Snapshot, error) {
	out := []*Snapshot{} // empty, not nil: JSON []
	err := n.db.View(func(tx *store.Tx) error {
		all, err := tx.Snapshots()
		for _, s := range all {
			if s.Digest != "" {
				out = append(out, s)
			}
		}
		return err
	})
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, err
}

// SnapshotInspect returns one snapshot.
func (n *Nexus) SnapshotInspect(ctx context.Context, ref string) (*Snapshot, error) {
	var s *Snapshot
	err := n.db.View(func(tx *store.Tx) error {
		var err error
		s, err = tx.FindSnapshot(ref)
		return err
	})
	return s, err
}

// SnapshotRemove deletes a snapshot nothing depends on. While sandboxes
// do (their memory is mapped from it), it is refused, naming them, and
// so is one with a warm pool.
func (n *Nexus) SnapshotRemove(ctx context.Context, ref string) error {
	var dir, id string
	err := n.db.Update(func(tx *store.Tx) error {
		s, err := tx.FindSnapshot(ref)
		if err != nil {
			return err
		}
		id = s.ID
		if s.Lease.Live(time.Now()) {
			return fmt.Errorf("%w: snapshot %s is being written", ErrBusy, s.Ref())
		}
		var users []string
		pooled := 0
		for _, id := range s.Refs {
			sb, err := tx.Sandbox(id)
			if err != nil {
				continue // a reference the store lost: not a user
			}
			if sb.Pool == s.ID {
				pooled++
				continue
			}
			users = append(users, sb.Ref())
		}
		if len(users) > 0 {
			return &inUseError{fmt.Sprintf("snapshot %s is in use by %d sandbox(es): %s; remove them first", s.Ref(), len(users), strings.Join(users, ", "))}
		}
		if pooled > 0 {
			return &inUseError{fmt.Sprintf("snapshot %s has a warm pool of %d; empty it first (nexus pool set %s --size 0)", s.Ref(), pooled, s.Ref())}
		}
		dir = s.Dir
		return tx.DeleteSnapshot(s)
	})
	if id != "" {
		n.audit(evSnapshotRemove, nil, id, err)
	}
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// inUseError is a refused removal: its message names the dependents, and
// it is ErrInUse to errors.Is.
type inUseError struct{ msg string }

func (e *inUseError) Error() string        { return e.msg }
func (e *inUseError) Is(target error) bool { return target == ErrInUse }
