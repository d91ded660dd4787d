package nexus

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/runner"
	"github.com/nethersandbox/nether/runner/fakerunner"
)

// TestFakeAuditChain: every operation on a sandbox goes on the chain, in
// order, with its outcome (a refusal's error too), and the chain
// verifies over all of them.
func TestFakeAuditChain(t *testing.T) {
	n, _ := fakeNexus(t)
	ctx := t.Context()
	sb := running(t, n, "a")
	snap, err := n.SnapshotCreate(ctx, "a", "s")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Pause(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Resume(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	kids, err := n.Fork(ctx, ForkRequest{From: "s", Names: []string{"kid"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.PoolSet(ctx, "s", 1); err != nil {
		t.Fatal(err)
	}
	claimed, err := n.Fork(ctx, ForkRequest{From: "s", Names: []string{"warm"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.SnapshotRemove(ctx, "s"); !errors.Is(err, ErrInUse) {
		t.Fatalf("rm of a snapshot in use: %v", err)
	}
	if err := n.Remove(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	// The sandbox's records, as the sandbox or as its children's parent,
	// found by its id after its removal.
	if got := strings.Join(events(t, n, sb.ID), " "); got != "create boot snapshot park wake stop fork restore claim rm" {
		t.Errorf("the chain for a: %s", got)
	}
	recs, _ := n.AuditList(ctx, "")
	byEvent := map[string][]string{}
	for _, r := range recs {
		if r.Node != n.NodeID() {
			t.Errorf("record %s names node %q, not %q", r.Event, r.Node, n.NodeID())
		}
		byEvent[r.Event] = append(byEvent[r.Event], r.Sandbox+" "+r.Snapshot+" "+r.Parent+" "+r.Outcome)
	}
	for ev, want := range map[string]string{
		evSnapshot:       sb.ID + " " + snap.ID + "  ok",
		evFork:           kids[0].ID + " " + snap.ID + " " + sb.ID + " ok",
		evClaim:          claimed[0].ID + " " + snap.ID + " " + sb.ID + " ok",
		evSnapshotRemove: " " + snap.ID + "  snapshot " + snap.Ref() + " is in use by 2 sandbox(es): " + kids[0].Ref() + ", " + claimed[0].Ref() + "; remove them first",
	} {
		if len(byEvent[ev]) == 0 || byEvent[ev][0] != want {
			t.Errorf("%s records %q, want first %q", ev, byEvent[ev], want)
		}
	}
	if len(byEvent[evRestore]) < 1 {
		t.Errorf("no restore recorded for the pool's member: %v", byEvent)
	}
	head, err := n.AuditVerify(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if head.Records != uint64(len(recs)) {
		t.Errorf("the chain verifies %d records, the list has %d", head.Records, len(recs))
	}
}

// TestFakeTree: the lineage runs from a created sandbox through its
// snapshots to the sandboxes forked from them, a pool member marked as
// such, and is drawn as a tree and as a graph.
func TestFakeTree(t *testing.T) {
	n, _ := fakeNexus(t)
	ctx := t.Context()
	base := running(t, n, "base")
	snap, _ := n.SnapshotCreate(ctx, "base", "s")
	kids, err := n.Fork(ctx, ForkRequest{From: "s", N: 2, Names: []string{"k"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.PoolSet(ctx, "s", 1); err != nil {
		t.Fatal(err)
	}
	other := running(t, n, "other")
	roots, err := n.Tree(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(roots) != 2 || roots[0].ID != base.ID || roots[1].ID != other.ID {
		t.Fatalf("roots %+v", roots)
	}
	s := roots[0].Children
	if len(s) != 1 || s[0].Kind != "snapshot" || s[0].ID != snap.ID || len(s[0].Children) != 3 {
		t.Fatalf("base's children %+v", s)
	}
	pooled := 0
	for _, c := range s[0].Children {
		if c.Pool {
			pooled++
		}
	}
	if pooled != 1 {
		t.Errorf("%d pool members in the tree, want 1", pooled)
	}
	var b bytes.Buffer
	WriteTree(&b, roots[:1])
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 || lines[0] != "base ("+base.ID[:16]+") running" || lines[1] != "└── snapshot s ("+snap.ID[:16]+")" ||
		!strings.HasPrefix(lines[2], "    ├── ") || !strings.HasPrefix(lines[4], "    └── ") {
		t.Fatalf("the tree:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "k-1 ("+kids[0].ID[:16]+") running") && !strings.Contains(b.String(), "k-1 ("+kids[1].ID[:16]+") running") {
		t.Errorf("the tree does not show k-1:\n%s", b.String())
	}
	if !strings.Contains(b.String(), " [pool]") {
		t.Errorf("the tree does not mark the pool member:\n%s", b.String())
	}
	one, err := n.Tree(ctx, "s")
	if err != nil || len(one) != 1 || one[0].ID != snap.ID || len(one[0].Children) != 3 {
		t.Fatalf("the tree of s: %+v, %v", one, err)
	}
	if _, err := n.Tree(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the tree of nothing: %v", err)
	}
	b.Reset()
	WriteDot(&b, roots)
	for _, want := range []string{"digraph lineage {", `"` + base.ID + `" -> "` + snap.ID + `";`, `"` + snap.ID + `" [label="snapshot s (` + snap.ID[:16] + `)" shape=cylinder];`} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the graph lacks %q:\n%s", want, b.String())
		}
	}
}

// TestFakeSnapshotRemove: a snapshot is not removed while sandboxes
// forked from it or its warm pool depend on it (each named); once they
// are gone it is, files and all; a damaged or altered one is refused
// before anything restores from it.
func TestFakeSnapshotRemove(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	running(t, n, "base")
	snap, _ := n.SnapshotCreate(ctx, "base", "s")
	kids, err := n.Fork(ctx, ForkRequest{From: "s", Names: []string{"kid"}})
	if err != nil {
		t.Fatal(err)
	}
	err = n.SnapshotRemove(ctx, "s")
	if !errors.Is(err, ErrInUse) || Kind(err) != KindInUse || !strings.Contains(err.Error(), "in use by 1 sandbox(es): "+kids[0].Ref()) {
		t.Fatalf("rm of a snapshot a child depends on: %v (kind %s)", err, Kind(err))
	}
	if err := n.Remove(ctx, "kid", true); err != nil {
		t.Fatal(err)
	}
	if _, err := n.PoolSet(ctx, "s", 2); err != nil {
		t.Fatal(err)
	}
	if err := n.SnapshotRemove(ctx, "s"); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "has a warm pool of 2; empty it first") {
		t.Fatalf("rm of a snapshot with a pool: %v", err)
	}
	if _, err := n.PoolSet(ctx, "s", 0); err != nil {
		t.Fatal(err)
	}
	if !exists(snap.Dir) {
		t.Fatal("refused removals took the artifact")
	}
	if err := n.SnapshotRemove(ctx, "s"); err != nil {
		t.Fatalf("rm of a snapshot nothing depends on: %v", err)
	}
	if _, err := n.SnapshotInspect(ctx, "s"); !errors.Is(err, ErrNotFound) || exists(snap.Dir) || f.Live() != 1 {
		t.Fatalf("after rm: %v, artifact there %v, %d nethers", err, exists(snap.Dir), f.Live())
	}
	// An artifact altered after its commit is refused by fork and pool.
	bad, _ := n.SnapshotCreate(ctx, "base", "bad")
	os.WriteFile(filepath.Join(bad.Dir, runner.ArtifactMeta), []byte(`{"kind":"base","ram_mb":4096}`), 0o600)
	restores := f.Launches("restore")
	if _, err := n.Fork(ctx, ForkRequest{From: "bad"}); err == nil || !strings.Contains(err.Error(), "is corrupted") {
		t.Fatalf("a fork of an altered snapshot: %v", err)
	}
	if _, err := n.PoolSet(ctx, "bad", 1); err == nil || !strings.Contains(err.Error(), "is corrupted") {
		t.Fatalf("a pool of an altered snapshot: %v", err)
	}
	os.Remove(filepath.Join(bad.Dir, runner.ArtifactMeta))
	if _, err := n.Fork(ctx, ForkRequest{From: "bad"}); err == nil || !strings.Contains(err.Error(), "is damaged") {
		t.Fatalf("a fork of a snapshot without its meta.json: %v", err)
	}
	if f.Launches("restore") != restores {
		t.Fatal("a refused snapshot was restored")
	}
}

// TestFakePoolSize: a pool grows and shrinks to its size (surplus
// members removed, nethers and all), reports its members and ready
// ones, and refuses a size out of range or a snapshot that is not there.
func TestFakePoolSize(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	running(t, n, "base")
	snap, _ := n.SnapshotCreate(ctx, "base", "s")
	for _, size := range []int{3, 1, 2, 0} {
		if _, err := n.PoolSet(ctx, "s", size); err != nil {
			t.Fatal(err)
		}
		ps, err := n.Pools(ctx)
		if err != nil || len(ps) != min(size, 1) {
			t.Fatalf("pool set to %d: pools %+v, %v", size, ps, err)
		}
		if size > 0 {
			if p := ps[0]; p.Snapshot != snap.ID || p.Size != size || p.Members != size || p.Ready != size {
				t.Fatalf("pool set to %d: %+v", size, p)
			}
		}
		if f.Live() != 1+size {
			t.Fatalf("pool set to %d: %d nethers, want %d", size, f.Live(), 1+size)
		}
		s, _ := n.SnapshotInspect(ctx, "s")
		if len(s.Refs) != size {
			t.Fatalf("pool set to %d: the snapshot has %d references", size, len(s.Refs))
		}
	}
	for _, tc := range []struct {
		ref  string
		size int
		want string
	}{{"s", -1, "want 0 to 256"}, {"s", 257, "want 0 to 256"}, {"nope", 1, "not found"}} {
		if _, err := n.PoolSet(ctx, tc.ref, tc.size); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pool set %s %d: %v, want %q", tc.ref, tc.size, err, tc.want)
		}
	}
	// A member whose nether died is no longer ready, and a fill replaces
	// it.
	if _, err := n.PoolSet(ctx, "s", 1); err != nil {
		t.Fatal(err)
	}
	var member *Sandbox
	list, _ := n.List(ctx)
	for _, sb := range list {
		if sb.Pool == snap.ID {
			member = sb
		}
	}
	f.Crash(n.sandboxDir(member.ID), "")
	if r := n.PoolReady(ctx, snap.ID); r != 0 {
		t.Fatalf("a dead member counts as ready")
	}
	m := reopen(t, n, f)
	if err := m.PoolFill(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if r := m.PoolReady(ctx, snap.ID); r != 1 {
		t.Errorf("after a fill the pool has %d ready, want 1", r)
	}
}

// TestFakeResumeFails: a wake whose park is gone, or whose nether dies
// after consuming it, leaves the sandbox in error saying why; one that
// fails before consuming it leaves it paused, to be woken again.
func TestFakeResumeFails(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name   string
		break_ func(p *Sandbox)
		want   string // "" = stays paused
	}{
		{"park gone", func(p *Sandbox) { os.RemoveAll(p.Park) }, "is gone"},
		{"spawn fails", func(p *Sandbox) {
			f.Fail = func(dir string, step fakerunner.Step) error {
				if step == fakerunner.Spawn {
					return errors.New("exec format error")
				}
				return nil
			}
		}, ""},
		{"dies after the park was consumed", func(p *Sandbox) {
			f.Fail = func(dir string, step fakerunner.Step) error {
				if step == fakerunner.Start {
					return errors.New("a chunk failed its digest")
				}
				return nil
			}
		}, "a chunk failed its digest"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.Fail = nil
			sb := running(t, n, "")
			p, err := n.Pause(ctx, sb.ID)
			if err != nil {
				t.Fatal(err)
			}
			tc.break_(p)
			_, err = n.Resume(ctx, sb.ID)
			f.Fail = nil
			got := state(t, n, sb.ID)
			if err == nil || got.Lease != nil {
				t.Fatalf("resume: %v, lease %v", err, got.Lease)
			}
			if tc.want == "" {
				if got.State != lifecycle.Paused || !exists(got.Park) {
					t.Fatalf("a wake that failed before its park was used: %s, park there %v", got.State, exists(got.Park))
				}
				if r, err := n.Resume(ctx, sb.ID); err != nil || r.State != lifecycle.Running {
					t.Fatalf("the next wake: %+v, %v", r, err)
				}
				return
			}
			if got.State != lifecycle.Error || !strings.Contains(got.Reason, tc.want) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%s (%q), %v; want error saying %q", got.State, got.Reason, err, tc.want)
			}
		})
	}
}

// TestFakeStopWedged: a nether whose control socket refuses the shutdown
// is stopped all the same, by SIGTERM, and its record says so.
func TestFakeStopWedged(t *testing.T) {
	n, f := fakeNexus(t)
	running(t, n, "w")
	f.Fail = func(dir string, step fakerunner.Step) error {
		if step == fakerunner.Shutdown {
			return errors.New("the agent does not answer")
		}
		return nil
	}
	sb, err := n.Stop(t.Context(), "w")
	if err != nil || sb.State != lifecycle.Stopped || ParseFinal(sb.Final).Reason != "sigterm" || f.Live() != 0 {
		t.Fatalf("stop of a wedged nether: %+v, %v, %d live", sb, err, f.Live())
	}
}

// TestFakeForkSource: a fork names what it starts from unambiguously,
// from a running sandbox only, and a run_as it may not take is refused
// before the sandbox is captured for nothing.
func TestFakeForkSource(t *testing.T) {
	n, _ := fakeNexus(t)
	ctx := t.Context()
	sb, _ := n.Create(ctx, CreateRequest{Name: "u", Config: Config{RunAs: "nether"}})
	if _, err := n.Fork(ctx, ForkRequest{From: "u"}); !IsIllegal(err) {
		t.Fatalf("a fork of a created sandbox: %v", err)
	}
	if _, err := n.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		req  ForkRequest
		want string
	}{
		{ForkRequest{From: "u", RunAs: "root"}, "never widen it"},
		{ForkRequest{From: "u", RunAs: "other"}, "never change it to another user"},
		{ForkRequest{From: "nope"}, "no sandbox or snapshot named"},
		{ForkRequest{From: "u", N: 2, Names: []string{"a", "b", "c"}}, "3 names for 2 children"},
	} {
		if _, err := n.Fork(ctx, tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fork %+v: %v, want %q", tc.req, err, tc.want)
		}
	}
	if snaps, _ := n.SnapshotList(ctx); len(snaps) != 0 {
		t.Fatalf("refused forks captured %d snapshots", len(snaps))
	}
	if _, err := n.SnapshotCreate(ctx, "u", "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Fork(ctx, ForkRequest{From: "u"}); err == nil || !strings.Contains(err.Error(), "names both sandbox") {
		t.Fatalf("a name both a sandbox and a snapshot go by: %v", err)
	}
	kids, err := n.Fork(ctx, ForkRequest{From: sb.ID, RunAs: "nether"})
	if err != nil || len(kids) != 1 || kids[0].Config.RunAs != "nether" {
		t.Fatalf("a fork keeping run_as: %+v, %v", kids, err)
	}
}

// TestFakeExecBufferedAndDetail: a buffered exec returns the output whole
// with its exit code; inspect's detail names the control socket only
// while the sandbox runs and fills in nether's defaults.
func TestFakeExecBufferedAndDetail(t *testing.T) {
	n, _ := fakeNexus(t)
	ctx := t.Context()
	sb := running(t, n, "d")
	r, err := n.ExecBuffered(ctx, "d", "hello")
	if err != nil || r != (ExecResult{Output: "hello\n", Encoding: "utf-8"}) {
		t.Fatalf("buffered exec: %+v, %v", r, err)
	}
	if r, _ := n.ExecBuffered(ctx, "d", "exit 4"); r.Exit != 4 {
		t.Fatalf("buffered exec's exit: %+v", r)
	}
	d, err := n.InspectDetail(ctx, "d")
	if err != nil || d.ControlSocket != filepath.Join(n.sandboxDir(sb.ID), runner.ControlSocket) || d.Settings.RAMMB != runner.Defaults.RAMMB || d.Settings.RunAs != "root" {
		t.Fatalf("detail of a running sandbox: %+v, %v", d, err)
	}
	n.Stop(ctx, "d")
	if d, _ := n.InspectDetail(ctx, "d"); d.ControlSocket != "" || d.LastStop.Reason != "shutdown" {
		t.Fatalf("detail of a stopped sandbox: socket %q, last stop %+v", d.ControlSocket, d.LastStop)
	}
	if _, err := n.ExecBuffered(ctx, "d", "true"); !IsIllegal(err) {
		t.Fatalf("exec in a stopped sandbox: %v", err)
	}
}
