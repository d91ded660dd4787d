package nexus

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner/fakerunner"
)

// A nexus that dies mid-operation is simulated in memory: the fake's
// hook holds the operation at one step for good (its goroutine never
// goes on, as a killed nexus never does), the leases it holds are handed
// to a pid that cannot exist (the holder is dead), and a new nexus opens
// the state directory, which reconciles it.

// deadPID is above any pid_max Linux allows (2^22).
const deadPID = 1 << 30

// freeze is an operation held at a step.
type freeze struct {
	reached chan struct{} // closed once the operation is held
	release chan struct{} // close to let it go on (a nexus that hung, not died)
}

// freezeAt holds the first step of a sandbox whose directory match
// accepts (any, when match is nil); later ones pass.
func freezeAt(f *fakerunner.Fake, step fakerunner.Step, match func(dir string) bool) *freeze {
	fz := &freeze{reached: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	f.Fail = func(dir string, s fakerunner.Step) error {
		if s != step || (match != nil && !match(dir)) {
			return nil
		}
		held := false
		once.Do(func() { held = true })
		if held {
			close(fz.reached)
			<-fz.release
		}
		return nil
	}
	return fz
}

func (fz *freeze) wait(t *testing.T) {
	t.Helper()
	select {
	case <-fz.reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the operation never reached the step it was to die at")
	}
}

// die hands every lease in n's store to a dead holder: the nexus that
// held them is gone.
func die(t *testing.T, n *Nexus) {
	t.Helper()
	err := n.db.Update(func(tx *store.Tx) error {
		sbs, err := tx.Sandboxes()
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if sb.Lease != nil {
				sb.Lease.Holder = deadPID
				if err := tx.PutSandbox(sb); err != nil {
					return err
				}
			}
		}
		snaps, err := tx.Snapshots()
		if err != nil {
			return err
		}
		for _, s := range snaps {
			if s.Lease != nil {
				s.Lease.Holder = deadPID
				if err := tx.PutSnapshot(s); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// reopen is the next nexus on n's state directory and fake.
func reopen(t *testing.T, n *Nexus, f *fakerunner.Fake) *Nexus {
	t.Helper()
	m, err := Open(t.Context(), Options{StateDir: n.dir, Runner: f, ReadyTimeout: 2 * time.Second, LeaseWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// dirOf matches the directory of sandbox id.
func dirOf(n *Nexus, id string) func(string) bool {
	return func(dir string) bool { return dir == n.sandboxDir(id) }
}

func leases(t *testing.T, n *Nexus) []string {
	t.Helper()
	var out []string
	n.db.View(func(tx *store.Tx) error {
		sbs, _ := tx.Sandboxes()
		for _, sb := range sbs {
			if sb.Lease != nil {
				out = append(out, "sandbox "+sb.ID+" "+sb.Lease.Op)
			}
		}
		snaps, _ := tx.Snapshots()
		for _, s := range snaps {
			if s.Lease != nil {
				out = append(out, "snapshot "+s.ID+" "+s.Lease.Op)
			}
		}
		return nil
	})
	return out
}

// TestCrashInPause: a nexus that dies before its park leaves a running
// sandbox running; one whose nether parked after it died leaves it
// paused with its park, which a resume wakes.
func TestCrashInPause(t *testing.T) {
	n, f := fakeNexus(t)
	sb := running(t, n, "p")
	fz := freezeAt(f, fakerunner.Park, nil)
	go n.Pause(context.Background(), "p")
	fz.wait(t)
	if got := state(t, n, "p"); got.Lease == nil || got.Lease.Op != string(lifecycle.Pause) {
		t.Fatalf("mid-pause the record holds lease %v", got.Lease)
	}
	die(t, n)
	m := reopen(t, n, f)
	got := state(t, m, "p")
	if got.State != lifecycle.Running || got.Lease != nil || got.PID != sb.PID || !f.Alive(procOf(got)) {
		t.Fatalf("after a pause that died before the park: %s, lease %v, pid %d (was %d)", got.State, got.Lease, got.PID, sb.PID)
	}
	// Its nether parks all the same (the verb was sent), and the nexus
	// that sent it is gone.
	c, err := f.Dial(t.Context(), m.sandboxDir(sb.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Park(t.Context(), parkName); err != nil {
		t.Fatal(err)
	}
	m = reopen(t, m, f)
	got = state(t, m, "p")
	if got.State != lifecycle.Paused || got.Park != filepath.Join(m.sandboxDir(sb.ID), parkName) || got.PID != 0 {
		t.Fatalf("a nether that parked after its nexus died: %s, park %q, pid %d", got.State, got.Park, got.PID)
	}
	if r, err := m.Resume(t.Context(), "p"); err != nil || r.State != lifecycle.Running {
		t.Fatalf("resume of the reconciled park: %+v, %v", r, err)
	}
}

// TestCrashInResume: a nexus that dies while the woken guest comes up
// leaves it running, its consumed park forgotten; one whose wake died
// too leaves it in error, saying the park is gone.
func TestCrashInResume(t *testing.T) {
	n, f := fakeNexus(t)
	for _, nether := range []string{"lives", "dies"} {
		t.Run(nether, func(t *testing.T) {
			sb := running(t, n, "r-"+nether)
			p, err := n.Pause(t.Context(), sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			fz := freezeAt(f, fakerunner.Ready, dirOf(n, sb.ID))
			go n.Resume(context.Background(), sb.ID)
			fz.wait(t)
			if exists(p.Park) {
				t.Fatal("the wake has not consumed the park yet")
			}
			if nether == "dies" {
				f.Crash(n.sandboxDir(sb.ID), "")
			}
			die(t, n)
			got := state(t, reopen(t, n, f), sb.ID)
			switch nether {
			case "lives":
				if got.State != lifecycle.Running || got.Lease != nil || got.Park != "" || !f.Alive(procOf(got)) {
					t.Fatalf("a wake whose nexus died: %s, lease %v, park %q", got.State, got.Lease, got.Park)
				}
			case "dies":
				if got.State != lifecycle.Error || !strings.Contains(got.Reason, "park was consumed") || got.Lease != nil {
					t.Fatalf("a wake whose nexus and nether died: %s (%q), lease %v", got.State, got.Reason, got.Lease)
				}
			}
		})
	}
}

// TestCrashInSnapshot: a capture whose nexus died is removed wherever it
// got to: its record never committed, the artifact nether wrote in the
// launch directory, or the one already moved into the store; the
// sandbox keeps running, unleased.
func TestCrashInSnapshot(t *testing.T) {
	for _, got := range []string{"nowhere", "the launch directory", "the store"} {
		t.Run(got, func(t *testing.T) {
			n, f := fakeNexus(t)
			sb := running(t, n, "s")
			fz := freezeAt(f, fakerunner.Snapshot, nil)
			go n.SnapshotCreate(context.Background(), "s", "snap")
			fz.wait(t)
			var snap *Snapshot
			n.db.View(func(tx *store.Tx) error {
				all, _ := tx.Snapshots()
				if len(all) == 1 {
					snap = all[0]
				}
				return nil
			})
			if snap == nil || snap.Digest != "" || snap.Lease == nil {
				t.Fatalf("mid-capture the store holds %+v", snap)
			}
			var leftover string
			switch got {
			case "the launch directory":
				leftover = filepath.Join(n.sandboxDir(sb.ID), captureRel(snap.ID))
			case "the store":
				leftover = snap.Dir
			}
			if leftover != "" {
				os.MkdirAll(leftover, 0o700)
				os.WriteFile(filepath.Join(leftover, "meta.json"), []byte(`{"kind":"base"}`), 0o600)
			}
			die(t, n)
			m := reopen(t, n, f)
			if snaps, _ := m.SnapshotList(t.Context()); len(snaps) != 0 {
				t.Fatalf("%d snapshots after the capture died", len(snaps))
			}
			if leftover != "" && exists(leftover) {
				t.Errorf("the capture's artifact remains at %s", leftover)
			}
			if _, err := m.SnapshotInspect(t.Context(), snap.ID); err == nil {
				t.Error("the uncommitted record remains")
			}
			if s := state(t, m, "s"); s.State != lifecycle.Running || s.Lease != nil {
				t.Fatalf("the sandbox: %s, lease %v", s.State, s.Lease)
			}
			if _, err := m.SnapshotCreate(t.Context(), "s", "snap"); err != nil {
				t.Fatalf("a capture under the dead one's name: %v", err)
			}
		})
	}
}

// TestCrashInFork: a fork whose nexus died keeps the children whose
// nethers run and undoes the rest (records, directories, the snapshot's
// references to them); a fork of a running sandbox that died in its
// capture leaves the sandbox running and no snapshot.
func TestCrashInFork(t *testing.T) {
	t.Run("children", func(t *testing.T) {
		n, f := fakeNexus(t)
		running(t, n, "base")
		snap, err := n.SnapshotCreate(t.Context(), "base", "s")
		if err != nil {
			t.Fatal(err)
		}
		// One child held before its nether starts, one held while its
		// guest comes up, the third born.
		var mu sync.Mutex
		held := map[fakerunner.Step]string{}
		reached := make(chan struct{}, 2)
		f.Fail = func(dir string, step fakerunner.Step) error {
			if step != fakerunner.Start && step != fakerunner.Ready {
				return nil
			}
			mu.Lock()
			_, taken := held[step]
			mine := !taken && (step == fakerunner.Start || held[fakerunner.Start] != dir)
			if mine {
				held[step] = dir
			}
			mu.Unlock()
			if mine {
				reached <- struct{}{}
				select {} // the nexus died here
			}
			return nil
		}
		go n.Fork(context.Background(), ForkRequest{From: "s", N: 3})
		for range 2 {
			select {
			case <-reached:
			case <-time.After(10 * time.Second):
				t.Fatal("the fork's children never reached their steps")
			}
		}
		// Wait for the third to be born (its lease released).
		deadline := time.Now().Add(10 * time.Second)
		for len(leases(t, n)) > 2 {
			if time.Now().After(deadline) {
				t.Fatalf("leases: %v", leases(t, n))
			}
			time.Sleep(10 * time.Millisecond)
		}
		mu.Lock()
		unborn, up := filepath.Base(held[fakerunner.Start]), filepath.Base(held[fakerunner.Ready])
		mu.Unlock()
		die(t, n)
		m := reopen(t, n, f)
		if _, err := m.Inspect(t.Context(), unborn); err == nil || exists(m.sandboxDir(unborn)) {
			t.Errorf("the child that never ran: %v, directory there %v", err, exists(m.sandboxDir(unborn)))
		}
		if got := state(t, m, up); got.State != lifecycle.Running || got.Lease != nil || !f.Alive(procOf(got)) {
			t.Errorf("the child whose nether runs: %s, lease %v", got.State, got.Lease)
		}
		list, _ := m.List(t.Context())
		s, _ := m.SnapshotInspect(t.Context(), snap.ID)
		if len(list) != 3 || len(s.Refs) != 2 || f.Live() != 3 {
			t.Fatalf("%d sandboxes, snapshot refs %v, %d nethers; want 3, 2, 3", len(list), s.Refs, f.Live())
		}
		for _, r := range s.Refs {
			if r == unborn {
				t.Error("the snapshot still refers to the undone child")
			}
		}
		if l := leases(t, m); len(l) != 0 {
			t.Errorf("leases left: %v", l)
		}
	})
	t.Run("capture", func(t *testing.T) {
		n, f := fakeNexus(t)
		running(t, n, "base")
		fz := freezeAt(f, fakerunner.Snapshot, nil)
		go n.Fork(context.Background(), ForkRequest{From: "base", N: 2})
		fz.wait(t)
		die(t, n)
		m := reopen(t, n, f)
		if got := state(t, m, "base"); got.State != lifecycle.Running || got.Lease != nil {
			t.Fatalf("the parent: %s, lease %v", got.State, got.Lease)
		}
		if snaps, _ := m.SnapshotList(t.Context()); len(snaps) != 0 || f.Live() != 1 {
			t.Fatalf("%d snapshots and %d nethers after a fork that died capturing", len(snaps), f.Live())
		}
		if kids, err := m.Fork(t.Context(), ForkRequest{From: "base"}); err != nil || len(kids) != 1 {
			t.Fatalf("a fork after the dead one: %v", err)
		}
	})
}

// TestCrashInClaim: a pool member whose claim's nexus died goes back to
// its pool, unleased and claimable; a member restored into the pool
// whose nexus died while warming it is kept.
func TestCrashInClaim(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	running(t, n, "base")
	snap, _ := n.SnapshotCreate(ctx, "base", "warm")
	fz := freezeAt(f, fakerunner.Exec, nil) // warm runs the member's first commands
	go n.PoolSet(context.Background(), "warm", 1)
	fz.wait(t)
	die(t, n)
	m := reopen(t, n, f)
	if r := m.PoolReady(ctx, snap.ID); r != 1 {
		t.Fatalf("a member whose nexus died warming it: %d ready, leases %v", r, leases(t, m))
	}
	fz = freezeAt(f, fakerunner.Claim, nil)
	go m.Fork(context.Background(), ForkRequest{From: "warm", Names: []string{"k"}})
	fz.wait(t)
	if r := m.PoolReady(ctx, snap.ID); r != 0 {
		t.Fatalf("a member being claimed counts as ready")
	}
	die(t, m)
	m = reopen(t, m, f)
	if r := m.PoolReady(ctx, snap.ID); r != 1 {
		t.Fatalf("after a claim that died: %d ready, leases %v", r, leases(t, m))
	}
	kids, err := m.Fork(ctx, ForkRequest{From: "warm", Names: []string{"k"}})
	if err != nil || len(kids) != 1 || kids[0].Name != "k" || kids[0].Pool != "" {
		t.Fatalf("a claim after the dead one: %+v, %v", kids, err)
	}
}

// TestLeaseLost: an operation that outlives its lease (a nexus that hung)
// loses the sandbox to the next, and says so when it comes back rather
// than write over the other's result.
func TestLeaseLost(t *testing.T) {
	n, f := fakeNexus(t)
	running(t, n, "l")
	fz := freezeAt(f, fakerunner.Shutdown, nil)
	errc := make(chan error, 1)
	go func() { _, err := n.Stop(context.Background(), "l"); errc <- err }()
	fz.wait(t)
	if _, err := n.Start(t.Context(), "l"); Kind(err) != KindBusy || !strings.Contains(err.Error(), "busy: stop by nexus pid") {
		t.Fatalf("a start under the stop's live lease: %v", err)
	}
	n.db.Update(func(tx *store.Tx) error {
		sb, _ := tx.FindSandbox("l")
		sb.Lease.Expires = time.Now().Add(-time.Second)
		return tx.PutSandbox(sb)
	})
	if got, err := n.Stop(t.Context(), "l"); err != nil || got.State != lifecycle.Stopped {
		t.Fatalf("a stop after the lease expired: %+v, %v", got, err)
	}
	if _, err := n.Start(t.Context(), "l"); err != nil {
		t.Fatal(err)
	}
	close(fz.release)
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "lost its lease") {
			t.Fatalf("the hung stop came back with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the hung stop never came back")
	}
	if got := state(t, n, "l"); got.State != lifecycle.Running || got.Lease != nil {
		t.Fatalf("the hung stop wrote over the start: %s, lease %v", got.State, got.Lease)
	}
}
