package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNexusAdmission: once the state directory trusts a plan authority,
// a create, start and fork each need a signed plan that allows them; a
// replayed plan, a missing one, one narrower than the sandbox, a fork's
// plan that does not descend from its snapshot's, one wider than its
// parent and one past its parent's descendants are refused (exit 7)
// before any nether starts, and the chain records each admission and
// refusal.
func TestNexusAdmission(t *testing.T) {
	t.Parallel()
	x := newNexus(t)
	// Unadmitted, while nothing is trusted, with nether's default RAM.
	x.must("create", "--name", "before", "--start")
	if sb := x.inspect("before"); sb.Plan != "" || sb.Admission != "unadmitted" {
		t.Fatalf("a sandbox created before any authority: %+v", sb)
	}
	x.must("snapshot", "create", "before", "old")
	x.must("trust", "add", strings.TrimSpace(x.must("key", "create", "ops")))
	n := 0
	// plan signs a skeleton with ram_mb set, for a parent plan's child
	// when parent is set; a plan without a parent may fork once.
	var parentNotAfter any // a child plan may not outlive its parent
	plan := func(ramMB int, parent string) string {
		t.Helper()
		var p map[string]any
		if err := json.Unmarshal([]byte(x.must("plan", "new")), &p); err != nil {
			t.Fatal(err)
		}
		p["limits"].(map[string]any)["ram_mb"] = ramMB
		if parent != "" {
			p["parent"], p["not_after"] = parent, parentNotAfter
		} else if parentNotAfter == nil {
			parentNotAfter = p["not_after"] // the first plan's: the parent
			p["grants"] = map[string]any{"max_descendants": 1, "fork_budget": map[string]any{"ram_mb": 256}}
		}
		n++
		raw := filepath.Join(x.dir, "plan"+string(rune('0'+n))+".json")
		b, _ := json.Marshal(p)
		os.WriteFile(raw, b, 0o600)
		signed := raw + ".signed"
		x.must("plan", "sign", "--key", "ops", raw, "-o", signed)
		return signed
	}

	x.refused(7, []string{"create", "--name", "nope"}, "needs a signed plan")
	p1 := plan(256, "")
	x.must("--plan", p1, "create", "--name", "adm", "--start") // one plan admits the create and its start
	sb := x.inspect("adm")
	if sb.State != "running" || len(sb.Plan) != 64 || !strings.HasPrefix(sb.Plan, sb.Admission) {
		t.Fatalf("an admitted sandbox: %+v", sb)
	}
	// The plan filled in the RAM the create left open (nether's default
	// is 512 MiB), and nether booted with it.
	out := strings.TrimSpace(x.must("exec", "adm", "--", "free -m | awk '/Mem:/{print $2}'"))
	if mb, err := strconv.Atoi(out); err != nil || mb > 256 || mb < 128 {
		t.Fatalf("the guest has %q MiB; the plan allows 256", out)
	}
	x.refused(7, []string{"--plan", p1, "create", "--name", "again"}, "nonce was used before")
	x.must("snapshot", "create", "adm", "s")
	x.refused(7, []string{"fork", "s"}, "needs a signed plan")
	x.refused(7, []string{"--plan", plan(128, sb.Plan), "fork", "s"}, "ram_mb 256: the plan allows at most 128")
	x.refused(7, []string{"--plan", plan(256, ""), "fork", "s"}, "a fork's plan must name it as its parent")
	// A restore runs with its artifact's RAM (512 MiB, nether's default,
	// here): a plan of 256 cannot admit it by filling in 256.
	x.refused(7, []string{"--plan", plan(256, ""), "fork", "old"}, "ram_mb 512: the plan allows at most 256")
	x.refused(7, []string{"--plan", plan(512, sb.Plan), "fork", "s"}, "limits.ram_mb: the child plan asks for 512, its parent allows 256")
	kid := ids1(x.must("--plan", plan(256, sb.Plan), "fork", "s"))
	if k := x.inspect(kid); k.State != "running" || len(k.Plan) != 64 || k.Plan == sb.Plan {
		t.Fatalf("an admitted fork: %+v (its parent's plan %s)", k, sb.Plan)
	}
	// The parent plan allows one descendant: a second fork is refused.
	x.refused(7, []string{"--plan", plan(256, sb.Plan), "fork", "s"}, "grants.max_descendants", "it has 1, and the fork adds 1")
	// A clean snapshot of it (its plan hands it no secrets or planes, its
	// NIC and planes carried nothing) forks under a plan of its own.
	x.must("snapshot", "create", "--clean", "adm", "c")
	var snaps []struct{ Name, Class string }
	json.Unmarshal([]byte(x.must("snapshot", "ls", "--json")), &snaps)
	classes := map[string]string{}
	for _, sn := range snaps {
		classes[sn.Name] = sn.Class
	}
	if classes["c"] != "clean" || classes["s"] != "dirty" {
		t.Errorf("snapshot classes %v, want c clean and s dirty", classes)
	}
	x.must("--plan", plan(256, ""), "fork", "c")

	var recs []struct{ Event, Outcome, Plan, Detail string }
	if err := json.Unmarshal([]byte(x.must("audit", "ls", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	admits, refusals := 0, 0
	for _, r := range recs {
		switch r.Event {
		case "admit":
			admits++
			if len(r.Plan) != 64 || r.Outcome != "ok" {
				t.Errorf("an admission record: %+v", r)
			}
		case "refuse":
			refusals++
		}
	}
	if admits != 3 || refusals != 8 {
		t.Errorf("%d admissions and %d refusals on the chain, want 3 and 8", admits, refusals)
	}
	if out := x.must("audit", "verify"); !strings.HasPrefix(out, "audit chain intact") {
		t.Errorf("audit verify: %q", out)
	}
}
