package nexus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
)

// opBirth is the lease of a sandbox being forked (or restored into a
// pool): its record exists so that no other nexus takes its nether for
// an orphan, but it is not shown until its guest answers.
const opBirth = "birth"

// ForkRequest is `nexus fork`.
type ForkRequest struct {
	// From names a snapshot, or a running sandbox (a snapshot of it is
	// taken first).
	From string
	// N children (default 1), named Names[i] when given: no names, one
	// per child, or one name that gets -1 ... -N when N > 1.
	N     int
	Names []string
	// Progress, when set, is told as each child comes up (or fails).
	Progress func(done, failed, total int)
	// NoPool forks cold even when the snapshot has a warm pool.
	NoPool bool
	// RunAs, when set, narrows the children's run_as: a snapshot that
	// runs commands as root may be forked with a user. A snapshot that
	// runs them as a user already can only keep it (naming the same user
	// changes nothing); nether refuses a widening or a change, and so
	// does Fork, before anything runs.
	RunAs string
}

// checkRunAs refuses a fork's run_as that nether would refuse for this
// snapshot: a widening of a user back to root, or a change to another
// user (nether's own rule, internal/session restoredRunAs; nether checks
// again, and its refusal reaches the caller too).
// what names the source ("snapshot warm", "sandbox web") and has is its
// run_as.
func checkRunAs(what, has, asked string) error {
	switch {
	case asked == "" || asked == has || has == "" || has == "root":
		return nil
	case asked == "root":
		return fmt.Errorf("%w: run_as = root: %s runs commands as %s, and a fork may narrow run_as (root to a user) but never widen it; leave --run-as out to inherit %s", ErrInvalid, what, has, has)
	default:
		return fmt.Errorf("%w: run_as = %s: %s runs commands as %s, and a fork may narrow run_as (root to a user) but never change it to another user", ErrInvalid, asked, what, has)
	}
}

// Fork makes N new sandboxes from a snapshot, each running on its own
// copy-on-write memory with its own identity: a new id and hostname, and
// from nether's restore a fresh machine-id, VM generation id (so its CRNG
// is reseeded) and session epoch. Each child has its own NAT, so every
// guest can keep the address 10.0.2.15. The parent is unchanged. The
// children start concurrently; Fork returns those that came up, and an
// error naming the ones that did not.
//
// A snapshot with a persistent disk gives each child a copy-on-write
// layer of its own over the snapshot's disk, in the child's directory:
// every child starts from the disk its memory expects, and no child, the
// parent or the snapshot sees another's writes.
func (n *Nexus) Fork(ctx context.Context, req ForkRequest) ([]*Sandbox, error) {
	if err := ValidateFork(req); err != nil {
		return nil, err
	}
	req.N = max(req.N, 1)
	names, err := childNames(req.Names, req.N)
	if err != nil {
		return nil, err
	}
	snap, parent, err := n.forkSource(ctx, req.From, req.RunAs)
	if err != nil {
		return nil, err
	}
	if err := verify(snap); err != nil {
		return nil, err
	}
	base := snap.Config
	if err := n.restoreSize(&base, snap.Dir); err != nil {
		return nil, err
	}
	cfg := base
	if req.RunAs != "" {
		cfg.RunAs = req.RunAs
	}
	// One plan admits the whole fork; its children share its digest.
	tmpl := &Sandbox{Name: "the children of snapshot " + snap.Ref(), Config: cfg, Parent: parent, Snapshot: snap.ID}
	// A dirty snapshot's fork descends from its lineage; a clean one's
	// may be admitted under any plan (whose image matches).
	var lineage *forkOf
	if classOf(snap) == ClassDirty {
		lineage = &forkOf{parent: snap.Plan, children: req.N}
	}
	plan, err := n.admit("fork", tmpl, func() (imageOf, error) { return n.restoreImage(snap.Dir) }, lineage)
	if err != nil {
		return nil, err
	}
	if plan != "" && lineage != nil && lineage.parent != "" {
		// The children's records count for themselves from here on (or
		// the fork failed): the place admission held is freed.
		defer n.db.Update(func(tx *store.Tx) error { return tx.DropReservation(plan) })
	}
	cfg = tmpl.Config
	// Warm children first, then cold ones for the rest. A pool member
	// runs with the snapshot's settings, which a claim cannot change: a
	// fork whose run_as or plan changes them restores cold.
	var kids []*Sandbox
	var claimed []*Sandbox
	// Nor does a fork given secrets: a claim hands over an identity, and
	// secrets travel only in a restore's handshake.
	if !req.NoPool && cfg == base && len(n.secrets) == 0 {
		if claimed, err = n.claimFromPool(ctx, snap, names, plan); err != nil {
			return nil, err
		}
	}
	kids = append(kids, claimed...)
	names = names[len(claimed):]
	if len(names) > 0 {
		cold, err := n.birth(ctx, snap, cfg, parent, names, "", plan, req.Progress)
		kids = append(kids, cold...)
		if err != nil {
			return kids, err
		}
	}
	if len(claimed) > 0 {
		n.topUp(snap.ID)
	}
	return kids, nil
}

// childNames spreads the requested names over n children.
func childNames(names []string, n int) ([]string, error) {
	out := make([]string, n)
	switch {
	case len(names) == 0:
	case len(names) == n:
		copy(out, names)
	case len(names) == 1:
		for i := range out {
			out[i] = names[0] + "-" + strconv.Itoa(i+1)
		}
		if n == 1 {
			out[0] = names[0]
		}
	default:
		return nil, fmt.Errorf("%d names for %d children: give none, one, or one per child", len(names), n)
	}
	for _, nm := range out {
		if err := checkName(nm); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// forkSource resolves what a fork starts from: a snapshot, or a running
// sandbox captured now. parent is the sandbox the children descend from.
// runAs is the fork's run_as, checked against the source's before a
// running sandbox is captured for nothing.
func (n *Nexus) forkSource(ctx context.Context, ref, runAs string) (*Snapshot, string, error) {
	var snap *Snapshot
	var sb *Sandbox
	err := n.db.View(func(tx *store.Tx) error {
		s, serr := tx.FindSnapshot(ref)
		b, berr := tx.FindSandbox(ref)
		switch {
		case serr == nil && berr == nil && s.ID != b.ID:
			return fmt.Errorf("%q names both sandbox %s and snapshot %s; give the id of the one you mean", ref, b.ID, s.ID)
		case serr == nil:
			snap = s
		case berr == nil:
			sb = b
		case errors.Is(serr, store.ErrNotFound) && errors.Is(berr, store.ErrNotFound):
			return fmt.Errorf("%w: no sandbox or snapshot named or with id %q", store.ErrNotFound, ref)
		case !errors.Is(serr, store.ErrNotFound):
			return serr
		default:
			return berr
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	if snap != nil {
		if snap.Digest == "" {
			return nil, "", fmt.Errorf("snapshot %s is still being written", snap.Ref())
		}
		if err := checkRunAs("snapshot "+snap.Ref(), snap.Config.RunAs, runAs); err != nil {
			return nil, "", err
		}
		return snap, snap.Source, nil
	}
	if sb.State != lifecycle.Running {
		return nil, "", &lifecycle.IllegalTransitionError{Sandbox: sb.Ref(), State: sb.State, Verb: lifecycle.Fork}
	}
	if err := checkRunAs("sandbox "+sb.Ref(), sb.Config.RunAs, runAs); err != nil {
		return nil, "", err
	}
	locked, err := n.acquire(ctx, sb.ID, lifecycle.Snapshot)
	if err != nil {
		return nil, "", err
	}
	snap, err = n.capture(ctx, locked, "", false)
	if err := n.finish(locked, locked.State, err); err != nil {
		return nil, "", err
	}
	return snap, sb.ID, nil
}

// birth restores len(names) children of snap at once. pool, when set,
// makes them members of snap's warm pool.
// cfg is the children's settings: the snapshot's, with a fork's own
// narrowing of run_as.
// plan is the digest of the plan that admitted them ("" unadmitted).
func (n *Nexus) birth(ctx context.Context, snap *Snapshot, cfg Config, parent string, names []string, pool, plan string, progress func(done, failed, total int)) ([]*Sandbox, error) {
	now := time.Now().UTC()
	kids := make([]*Sandbox, len(names))
	for i, nm := range names {
		sb := &Sandbox{ID: newID(), Name: nm, State: lifecycle.Running, Config: cfg, Parent: parent, Snapshot: snap.ID,
			Pool: pool, Plan: plan, Created: now, Lease: &store.Lease{Op: opBirth, Holder: os.Getpid(), Expires: now.Add(leaseTTL)}}
		sb.Hostname = hostnameFor(sb)
		if cfg.HasDisk() {
			// nether makes the child's layer over the snapshot's disk in
			// the child's own directory; a later boot (start after
			// stop) continues it.
			sb.Disk = filepath.Join(n.sandboxDir(sb.ID), forkDiskName)
		}
		kids[i] = sb
	}
	// The records and the snapshot's references land together: a
	// snapshot is never without the references of children that exist.
	err := n.db.Update(func(tx *store.Tx) error {
		s, err := tx.Snapshot(snap.ID)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", snap.Ref(), err)
		}
		for _, sb := range kids {
			if err := tx.PutSandbox(sb); err != nil {
				return err
			}
			s.Refs = append(s.Refs, sb.ID)
		}
		return tx.PutSnapshot(s)
	})
	if err != nil {
		return nil, err
	}
	var (
		mu           sync.Mutex
		done, failed int
		errs         []error
		wg           sync.WaitGroup
		born         []*Sandbox
	)
	for _, sb := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := os.MkdirAll(n.sandboxDir(sb.ID), 0o700)
			if err == nil {
				err = n.launch(ctx, sb, snap.Dir)
			}
			if err == nil && pool != "" {
				err = n.warm(ctx, sb)
			}
			if err == nil {
				err = n.release(sb)
			}
			ev := evFork
			if pool != "" {
				ev = evRestore
			}
			n.audit(ev, sb, "", err)
			mu.Lock()
			if err != nil {
				failed++
				errs = append(errs, err)
			} else {
				done++
				born = append(born, sb)
			}
			if progress != nil {
				progress(done, failed, len(kids))
			}
			mu.Unlock()
			if err != nil {
				n.db.Update(func(tx *store.Tx) error { return n.unbirth(tx, sb) })
			}
		}()
	}
	wg.Wait()
	return born, errors.Join(errs...)
}

// unbirth undoes a child that never came up: its nether, its record, its
// references, its directory.
func (n *Nexus) unbirth(tx *store.Tx, sb *Sandbox) error {
	n.terminate(sb, 10*time.Second)
	if err := n.dropRefs(tx, sb.ID); err != nil {
		return err
	}
	if err := tx.DeleteSandbox(sb); err != nil {
		return err
	}
	return os.RemoveAll(n.sandboxDir(sb.ID))
}

// warm runs a pool member's first commands before anyone claims it: a
// restored guest's memory comes in from the snapshot page by page as it
// is touched, and the first exec of a shell touches many pages (130 ms
// of a claim's first command on 2 cores under TCG, measured). The claim
// then finds a guest whose shell is already in memory.
func (n *Nexus) warm(ctx context.Context, sb *Sandbox) error {
	c, err := n.dial(ctx, sb)
	if err != nil {
		return err
	}
	defer c.Close()
	for range 2 {
		if code, err := c.Exec(ctx, "true", io.Discard); err != nil || code != 0 {
			return fmt.Errorf("sandbox %s: warming its shell: exit %d, %v", sb.Ref(), code, err)
		}
	}
	return nil
}
