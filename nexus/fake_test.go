package nexus

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
	"github.com/nethersandbox/nether/runner/fakerunner"
)

// A pool refills soon after a claim in these tests. Set once, before
// any test runs: a refill an earlier test started may still read it.
func init() { refillDelay = 10 * time.Millisecond }

// fakeNexus is a Nexus over a state directory of its own whose sandboxes
// are simulated in memory.
func fakeNexus(t *testing.T) (*Nexus, *fakerunner.Fake) {
	t.Helper()
	f := fakerunner.New()
	n, err := Open(t.Context(), Options{StateDir: t.TempDir(), Runner: f, ReadyTimeout: 2 * time.Second, LeaseWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return n, f
}

func running(t *testing.T, n *Nexus, name string) *Sandbox {
	t.Helper()
	sb, err := n.Create(t.Context(), CreateRequest{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if sb, err = n.Start(t.Context(), sb.ID); err != nil || sb.State != lifecycle.Running {
		t.Fatalf("start: %+v, %v", sb, err)
	}
	return sb
}

func state(t *testing.T, n *Nexus, ref string) *Sandbox {
	t.Helper()
	sb, err := n.Inspect(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestFakeLifecycle: create, start, stop, start again, pause, resume and
// remove move the record through the table, with a nether exactly while
// it runs, and the nether.conf of each run naming the sandbox.
func TestFakeLifecycle(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	sb := running(t, n, "web")
	dir := n.sandboxDir(sb.ID)
	if s, ok := f.Settings(dir); !ok || s.SandboxID != sb.ID || s.Hostname != "web" || s.BootID != sb.Boot || s.IdentityToken == "" {
		t.Fatalf("launched with %+v (%v)", s, ok)
	}
	if !f.Alive(procOf(sb)) || f.Live() != 1 {
		t.Fatal("no nether runs for a running sandbox")
	}
	if _, err := n.Start(ctx, "web"); !IsIllegal(err) {
		t.Fatalf("a second start: %v", err)
	}
	if sb, err := n.Stop(ctx, "web"); err != nil || sb.State != lifecycle.Stopped || sb.PID != 0 || ParseFinal(sb.Final).Reason != "shutdown" {
		t.Fatalf("stop: %+v, %v", sb, err)
	}
	if f.Live() != 0 {
		t.Fatal("a stopped sandbox's nether still runs")
	}
	if sb, err := n.Start(ctx, "web"); err != nil || sb.State != lifecycle.Running {
		t.Fatalf("start after stop: %+v, %v", sb, err)
	}
	p, err := n.Pause(ctx, "web")
	if err != nil || p.State != lifecycle.Paused || !exists(p.Park) || ParseFinal(p.Final).Reason != "park" {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	if _, err := n.Exec(ctx, "web", "true", &bytes.Buffer{}); !IsIllegal(err) {
		t.Fatalf("exec in a paused sandbox: %v", err)
	}
	r, err := n.Resume(ctx, "web")
	if err != nil || r.State != lifecycle.Running || r.Park != "" {
		t.Fatalf("resume: %+v, %v", r, err)
	}
	if s, _ := f.Settings(dir); s.RestoreFrom != p.Park {
		t.Fatalf("the wake restored %q, want the park %q", s.RestoreFrom, p.Park)
	}
	if exists(p.Park) {
		t.Error("the wake did not consume the park")
	}
	if err := n.Remove(ctx, "web", false); !IsIllegal(err) {
		t.Fatalf("rm of a running sandbox without force: %v", err)
	}
	if err := n.Remove(ctx, "web", true); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Inspect(ctx, "web"); !errors.Is(err, ErrNotFound) || exists(dir) || f.Live() != 0 {
		t.Fatalf("rm left the record (%v), the directory (%v) or %d nethers", err, exists(dir), f.Live())
	}
}

// TestFakeStartFails: a nether that cannot be spawned leaves the sandbox
// where it was; one that ends with a failure while starting puts it in
// error, saying why.
func TestFakeStartFails(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	sb, _ := n.Create(ctx, CreateRequest{Name: "a"})
	f.Fail = func(dir string, step fakerunner.Step) error {
		if step == fakerunner.Spawn {
			return errors.New("exec format error")
		}
		return nil
	}
	if _, err := n.Start(ctx, "a"); err == nil || !strings.Contains(err.Error(), "exec format error") {
		t.Fatalf("a failed spawn: %v", err)
	}
	if got := state(t, n, sb.ID); got.State != lifecycle.Created || got.Lease != nil {
		t.Fatalf("after a failed spawn: %s, lease %v", got.State, got.Lease)
	}
	f.Fail = func(dir string, step fakerunner.Step) error {
		if step == fakerunner.Start {
			return errors.New("the disk is not a usable ext4 file system")
		}
		return nil
	}
	_, err := n.Start(ctx, "a")
	var ended *EndedError
	if !errors.As(err, &ended) || !ended.Failed() || ended.Cause != "restore: x" && ended.Cause != "the disk is not a usable ext4 file system" {
		t.Fatalf("a nether that died starting: %v", err)
	}
	got := state(t, n, sb.ID)
	if got.State != lifecycle.Error || got.Reason != "the disk is not a usable ext4 file system" || got.PID != 0 {
		t.Fatalf("after it died: %s (%q) pid %d", got.State, got.Reason, got.PID)
	}
}

// TestFakeVerbsClassified: nether's refusals reach the caller as the
// kinds the CLI and the API map to exit codes and statuses.
func TestFakeVerbsClassified(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	sb := running(t, n, "a")
	refuse := map[fakerunner.Step]string{}
	f.Fail = func(dir string, step fakerunner.Step) error {
		if msg, ok := refuse[step]; ok {
			return errors.New(msg)
		}
		return nil
	}
	refuse[fakerunner.Snapshot] = "guest not quiescent (a vCPU is not parked)"
	if _, err := n.SnapshotCreate(ctx, "a", "s"); Kind(err) != KindBusy || !strings.Contains(err.Error(), "sandbox "+sb.Ref()+": __snapshot__: guest not quiescent") {
		t.Fatalf("a refused capture: %v (kind %s)", err, Kind(err))
	}
	if snaps, _ := n.SnapshotList(ctx); len(snaps) != 0 {
		t.Fatalf("a refused capture left %d snapshots", len(snaps))
	}
	if ents, _ := os.ReadDir(filepath.Join(n.dir, snapshotsDir)); len(ents) != 0 {
		t.Fatalf("a refused capture left %d artifacts", len(ents))
	}
	src := filepath.Join(t.TempDir(), "in")
	os.WriteFile(src, []byte("hello"), 0o600)
	for _, tc := range []struct {
		step fakerunner.Step
		msg  string
		kind string
	}{
		{fakerunner.Put, "open /ro/x: read-only file system", KindRefused},
		{fakerunner.Put, "/x: permission denied", KindRefused},
		{fakerunner.Put, "copying 2 GiB: over the transfer limit of 1 GiB", KindTooLarge},
		{fakerunner.Put, "/etc: is a directory", KindBadInput},
		{fakerunner.Put, "the agent went away", KindInternal},
	} {
		refuse = map[fakerunner.Step]string{tc.step: tc.msg}
		if err := n.CopyIn(ctx, "a", src, "/x"); Kind(err) != tc.kind || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("put refused with %q: %v (kind %s), want %s", tc.msg, err, Kind(err), tc.kind)
		}
	}
	refuse = nil
	if err := n.CopyIn(ctx, "a", src, "/a b"); Kind(err) != KindBadInput || !strings.Contains(err.Error(), "blank") {
		t.Errorf("a guest path with a blank: %v", err)
	}
	if err := n.CopyIn(ctx, "a", src, "/tmp/x"); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := n.CopyOut(ctx, "a", "/tmp/x", dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(dst); string(b) != "hello" {
		t.Fatalf("copied back %q", b)
	}
	if err := n.CopyOut(ctx, "a", "/nope", dst+"2"); Kind(err) != KindNotFound {
		t.Errorf("get of a missing file: %v (kind %s)", err, Kind(err))
	}
	if ents, _ := os.ReadDir(n.sandboxDir(sb.ID)); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".cp-") {
				t.Errorf("a transfer left %s in the sandbox's directory", e.Name())
			}
		}
	}
	var out bytes.Buffer
	if code, err := n.Exec(ctx, "a", "echo hi", &out); code != 0 || err != nil || out.String() != "echo hi\n" {
		t.Fatalf("exec: %d %v %q", code, err, out.String())
	}
	if code, _ := n.Exec(ctx, "a", "exit 3", &out); code != 3 {
		t.Fatalf("exec's exit code: %d", code)
	}
}

// TestFakeFork: a fork of a running sandbox captures it and restores N
// children with their own identities; a child that fails to come up is
// undone, the others are kept, and the error names the failure.
func TestFakeFork(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	parent := running(t, n, "base")
	var bad string
	f.Fail = func(dir string, step fakerunner.Step) error {
		if step == fakerunner.Start && filepath.Base(dir) == bad {
			return errors.New("restore failed")
		}
		return nil
	}
	kids, err := n.Fork(ctx, ForkRequest{From: "base", N: 3, Names: []string{"kid"}})
	if err != nil || len(kids) != 3 {
		t.Fatalf("fork: %d children, %v", len(kids), err)
	}
	snaps, _ := n.SnapshotList(ctx)
	if len(snaps) != 1 || snaps[0].Source != parent.ID || len(snaps[0].Refs) != 3 {
		t.Fatalf("snapshots after the fork: %+v", snaps)
	}
	names := map[string]bool{}
	for _, k := range kids {
		s, ok := f.Settings(n.sandboxDir(k.ID))
		if !ok || s.RestoreFrom != snaps[0].Dir || s.SandboxID != k.ID || k.Parent != parent.ID || k.State != lifecycle.Running {
			t.Fatalf("child %s: %+v (%v)", k.Ref(), s, ok)
		}
		names[k.Name] = true
	}
	if !names["kid-1"] || !names["kid-2"] || !names["kid-3"] {
		t.Fatalf("children named %v", names)
	}
	// A fork of the snapshot where one child fails: Fail picks the
	// first directory a launch asks about.
	var mu sync.Mutex
	f.Fail = func(dir string, step fakerunner.Step) error {
		mu.Lock()
		defer mu.Unlock()
		if step == fakerunner.Start && bad == "" {
			bad = filepath.Base(dir)
		}
		if step == fakerunner.Start && filepath.Base(dir) == bad {
			return errors.New("restore failed")
		}
		return nil
	}
	var progress []int
	more, err := n.Fork(ctx, ForkRequest{From: snaps[0].ID, N: 3, Progress: func(done, failed, total int) { progress = append(progress, done*10+failed) }})
	if err == nil || !strings.Contains(err.Error(), "restore failed") || len(more) != 2 {
		t.Fatalf("a fork with a failing child: %d children, %v", len(more), err)
	}
	if len(progress) != 3 || progress[2] != 21 {
		t.Errorf("progress %v, want the last to be 2 done 1 failed", progress)
	}
	if _, err := n.Inspect(ctx, bad); !errors.Is(err, ErrNotFound) || exists(n.sandboxDir(bad)) {
		t.Errorf("the failed child's record (%v) or directory remain", err)
	}
	s, _ := n.SnapshotInspect(ctx, snaps[0].ID)
	if len(s.Refs) != 5 {
		t.Errorf("the snapshot has %d references, want 5 (3 + 2 children)", len(s.Refs))
	}
	if err := n.SnapshotRemove(ctx, s.ID); !errors.Is(err, ErrInUse) {
		t.Errorf("removing a snapshot children depend on: %v", err)
	}
	list, _ := n.List(ctx)
	if len(list) != 6 || f.Live() != 6 {
		t.Errorf("%d sandboxes and %d nethers, want 6", len(list), f.Live())
	}
}

// TestFakePool: a pool fills with restored members, a fork claims one
// (no restore: the claimed child is the member, with the identity asked
// for), the pool refills behind it, and a member whose claim fails is
// removed and the fork goes cold.
func TestFakePool(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	running(t, n, "base")
	snap, err := n.SnapshotCreate(ctx, "base", "warm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.PoolSet(ctx, "warm", 2); err != nil {
		t.Fatal(err)
	}
	if r := n.PoolReady(ctx, snap.ID); r != 2 {
		t.Fatalf("%d ready members, want 2", r)
	}
	if list, _ := n.List(ctx); len(list) != 3 {
		t.Fatalf("%d sandboxes listed, want 3 (members are sandboxes)", len(list))
	}
	restores := f.Launches("restore")
	kids, err := n.Fork(ctx, ForkRequest{From: "warm", Names: []string{"claimed"}})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork from a pool: %v", err)
	}
	k := kids[0]
	if f.Launches("restore") != restores {
		t.Fatal("a fork with a ready pool member restored cold")
	}
	if id, host := f.Identity(n.sandboxDir(k.ID)); id != k.ID || host != "claimed" || k.Pool != "" {
		t.Fatalf("the claimed member runs as %s %s (pool %q)", id, host, k.Pool)
	}
	deadline := time.Now().Add(5 * time.Second)
	for n.PoolReady(ctx, snap.ID) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the pool was not topped up after the claim")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A claim that fails: the member is removed, the fork restores cold.
	f.Fail = func(dir string, step fakerunner.Step) error {
		if step == fakerunner.Claim {
			return errors.New("the guest did not take its new identity")
		}
		return nil
	}
	restores = f.Launches("restore")
	kids, err = n.Fork(ctx, ForkRequest{From: "warm", Names: []string{"cold"}})
	if err != nil || len(kids) != 1 || f.Launches("restore") <= restores {
		t.Fatalf("fork whose claims fail: %d children, %v, restores %d -> %d", len(kids), err, restores, f.Launches("restore"))
	}
	f.Fail = nil
	if _, err := n.PoolSet(ctx, "warm", 0); err != nil {
		t.Fatal(err)
	}
	if r := n.PoolReady(ctx, snap.ID); r != 0 {
		t.Fatalf("%d members after emptying the pool", r)
	}
}

// TestFakeReconcile: a nexus that opens the state directory again makes
// the records true: a running sandbox whose nether died takes the state
// its final record says, a nether no record knows is stopped, a child
// whose birth was interrupted is undone, a lease whose holder died is
// dropped.
func TestFakeReconcile(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	reopen := func() *Nexus {
		t.Helper()
		m, err := Open(ctx, Options{StateDir: n.dir, Runner: f, ReadyTimeout: 2 * time.Second, LeaseWait: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		reason string
		want   lifecycle.State
	}{{"shutdown", lifecycle.Stopped}, {"max_runtime", lifecycle.Stopped}, {"guest_panic", lifecycle.Error}, {"", lifecycle.Error}} {
		sb := running(t, n, "r"+strings.ReplaceAll(tc.reason, "_", ""))
		f.Crash(n.sandboxDir(sb.ID), tc.reason)
		got := state(t, reopen(), sb.ID)
		if got.State != tc.want || got.PID != 0 {
			t.Errorf("a nether that ended with %q: %s (%q), want %s", tc.reason, got.State, got.Reason, tc.want)
		}
	}
	// An orphan: a nether in a directory no record names (its nexus
	// died before it wrote the record).
	orphan := filepath.Join(n.dir, sandboxesDir, "01JORPHANORPHANORPHANORPHA")
	os.MkdirAll(orphan, 0o700)
	p, err := f.Launch(orphan, runner.Settings{SandboxID: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reopen()
	if f.Alive(p) || exists(orphan) {
		t.Errorf("the orphan runs (%v) or its directory remains (%v)", f.Alive(p), exists(orphan))
	}
	// A sandbox whose nexus died holding its lease: the lease expires,
	// and the record is mended from its nether.
	sb := running(t, n, "leased")
	n.db.Update(func(tx *store.Tx) error {
		s, _ := tx.Sandbox(sb.ID)
		s.Lease = &store.Lease{Op: "stop", Holder: 1, Expires: time.Now().Add(-time.Second)}
		s.State = lifecycle.Stopped // what an interrupted operation may have written
		return tx.PutSandbox(s)
	})
	if got := state(t, reopen(), sb.ID); got.State != lifecycle.Running || got.Lease != nil {
		t.Errorf("a lapsed lease over a live nether: %s, lease %v", got.State, got.Lease)
	}
	// A live lease: another operation waits, then fails busy.
	n.db.Update(func(tx *store.Tx) error {
		s, _ := tx.Sandbox(sb.ID)
		s.Lease = &store.Lease{Op: "stop", Holder: 1, Expires: time.Now().Add(time.Minute)}
		return tx.PutSandbox(s)
	})
	if _, err := n.Stop(ctx, sb.ID); Kind(err) != KindBusy {
		t.Errorf("stop under another's lease: %v", err)
	}
	// A child being born whose nexus died, and whose nether is gone.
	kid := &Sandbox{ID: newID(), State: lifecycle.Running, PID: 99999, Lease: &store.Lease{Op: opBirth, Holder: 1, Expires: time.Now().Add(-time.Second)}}
	n.db.Update(func(tx *store.Tx) error { return tx.PutSandbox(kid) })
	os.MkdirAll(n.sandboxDir(kid.ID), 0o700)
	reopen()
	if _, err := n.Inspect(ctx, kid.ID); !errors.Is(err, ErrNotFound) || exists(n.sandboxDir(kid.ID)) {
		t.Errorf("an interrupted birth was not undone: %v", err)
	}
	// A resume whose nether died after consuming the park.
	pz := running(t, n, "parked")
	pp, err := n.Pause(ctx, "parked")
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(pp.Park)
	if got := state(t, reopen(), pz.ID); got.State != lifecycle.Error || !strings.Contains(got.Reason, "park was consumed") {
		t.Errorf("a paused sandbox without its park: %s (%q)", got.State, got.Reason)
	}
}

// TestFakeCleanSnapshot: a clean capture is refused for a sandbox whose
// network carried traffic (nether's __stats__), and taken otherwise.
func TestFakeCleanSnapshot(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	sb := running(t, n, "c")
	f.SetStats(n.sandboxDir(sb.ID), runner.Stats{"net_tx": 5})
	if _, err := n.SnapshotCreateClean(ctx, "c", ""); Kind(err) != KindRefused || !strings.Contains(err.Error(), "net_tx=5") {
		t.Fatalf("a clean capture of a sandbox with traffic: %v", err)
	}
	f.SetStats(n.sandboxDir(sb.ID), runner.Stats{})
	s, err := n.SnapshotCreateClean(ctx, "c", "clean")
	if err != nil || SnapshotClass(s) != ClassClean || s.Digest == "" {
		t.Fatalf("a clean capture: %+v, %v", s, err)
	}
	if err := verify(s); err != nil {
		t.Fatal(err)
	}
}
