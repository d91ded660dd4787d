package nexus

import (
	"context"
	"testing"
)

// The operations that need no guest leave their records in the chain, in
// order, linked, under the state directory's node id, which stays the
// same across opens.
func TestAuditRecordsOperations(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n, err := Open(ctx, Options{StateDir: dir, Nether: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := n.Create(ctx, CreateRequest{Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(ctx, "a", false); err != nil {
		t.Fatal(err)
	}
	n2, err := Open(ctx, Options{StateDir: dir, Nether: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	if n2.NodeID() != n.NodeID() || len(n.NodeID()) != 26 {
		t.Fatalf("node id %q, then %q: want one ULID for the state directory", n.NodeID(), n2.NodeID())
	}
	recs, err := n2.AuditList(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{evCreate, evRemove}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %v: %+v", len(recs), want, recs)
	}
	for i, r := range recs {
		if r.Event != want[i] || r.Outcome != "ok" || r.Sandbox != sb.ID || r.Node != n.NodeID() {
			t.Fatalf("record %d: %+v, want event %s for %s on node %s", i, r, want[i], sb.ID, n.NodeID())
		}
	}
	head, err := n2.AuditVerify(ctx)
	if err != nil || head.Records != 2 {
		t.Fatalf("AuditVerify = %+v, %v", head, err)
	}
}
