package e2e

// nexus's tests restore from one base made per run, as nether's do
// (sharedBase): a cold boot under TCG costs seconds, a fork well under
// one. The base is a nexus state directory holding one committed
// snapshot of a booted 256 MiB guest and nothing else; a test that needs
// a running sandbox, not a cold boot, gets its own state directory
// cloned from it (newNexusFromBase) and forks nxBaseSnap there.
// TestNexusLifecycle, TestNexusDisk, TestNexusAdmission and
// TestForkTrustPracticalTest keep their cold boots: create, start, stop
// and start again, a disk across boots, a plan admitting a boot.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// nxBaseSnap names the base's snapshot in every clone. A clone's record
// of it points at the base's artifact (nexus keeps a snapshot's absolute
// directory), which forks only read: a test must never `snapshot rm` it.
const nxBaseSnap = "e2e-base"

var (
	nxBaseOnce   sync.Once
	nxBaseDir    string // the base state directory, under binDir
	nxBaseArt    string // its snapshot's artifact directory
	nxBaseAudits int    // records on the base's audit chain
	nxBaseErr    = "the shared nexus base was never built"
)

// nexusBase builds the base once per test binary: create and start (a
// cold boot), snapshot, rm. The chain must read create, boot, snapshot,
// rm (TestNexusFork's look at the chain starts after them), and no nether
// may run on. TestMain removes binDir, and the base with it.
func nexusBase(t *testing.T) {
	t.Helper()
	needGuest(t)
	nxBaseOnce.Do(func() {
		dir := filepath.Join(binDir, "nxb")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		x := &nx{t: t, dir: dir}
		x.must("create", "--name", "e2e-src", "--ram-mb", "256", "--start")
		x.must("exec", "e2e-src", "--", "echo base > /root/base")
		snap := ids1(x.must("snapshot", "create", "e2e-src", nxBaseSnap))
		x.must("rm", "--force", "e2e-src")
		if left := nethersIn(filepath.Join(dir, "sandboxes")); len(left) > 0 {
			t.Fatalf("the nexus base's nether outlived its rm: %v", left)
		}
		var recs []struct{ Event, Outcome string }
		if err := json.Unmarshal([]byte(x.must("audit", "ls", "--json")), &recs); err != nil {
			t.Fatal(err)
		}
		var events []string
		for _, r := range recs {
			if r.Outcome != "ok" {
				t.Fatalf("the base's audit record %+v is not ok", r)
			}
			events = append(events, r.Event)
		}
		if got := strings.Join(events, " "); got != "create boot snapshot rm" {
			t.Fatalf("the base's audit events: %s, want create boot snapshot rm", got)
		}
		nxBaseDir, nxBaseArt, nxBaseAudits = dir, filepath.Join(dir, "snapshots", snap), len(recs)
		nxBaseErr = ""
	})
	if nxBaseErr != "" {
		t.Fatalf("nexus base: %s", nxBaseErr)
	}
	if _, err := os.Stat(filepath.Join(nxBaseArt, "meta.json")); err != nil {
		t.Fatalf("the nexus base's artifact is gone (did a test snapshot rm %s?): %v", nxBaseSnap, err)
	}
}

// newNexusFromBase is newNexus in a clone of the base: its files at the
// top (the store, nexus's own key), empty sandboxes and snapshots
// directories. Its store already holds nxBaseSnap and the base's
// nxBaseAudits audit records.
func newNexusFromBase(t *testing.T) *nx {
	t.Helper()
	nexusBase(t)
	dir, err := os.MkdirTemp("", "nx-")
	if err != nil {
		t.Fatal(err)
	}
	x := watchNexus(t, dir)
	ents, err := os.ReadDir(nxBaseDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := os.Mkdir(filepath.Join(dir, e.Name()), 0o700); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(nxBaseDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return x
}
