package nexus

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/runner"
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
