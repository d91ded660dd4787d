package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestForkTrustPracticalTest is fork-trust-model.md's practical test: a
// parent admitted under one plan with a secret, and a fork of its
// (dirty) snapshot admitted under a child plan with a secret of its own.
// What must differ differs: boot identity, plan (nonce), identity token,
// session epoch, network lease (the NIC's MAC), secrets, the audit
// stream's boot, the budget; what may match matches: the kernel, the root
// image, the checkpoint lineage. The child's secret reached it only after
// the restore: no file nexus or nether wrote holds it, the snapshot it
// restored from included; the parent's holds only in the dirty
// snapshot's guest memory. And --clean refuses the parent, which holds
// a secret.
func TestForkTrustPracticalTest(t *testing.T) {
	x := newNexus(t)
	x.must("trust", "add", strings.TrimSpace(x.must("key", "create", "ops")))
	n := 0
	var rootNotAfter any
	secrets := []string{"API_KEY"}
	plan := func(parent string) string {
		t.Helper()
		var p map[string]any
		if err := json.Unmarshal([]byte(x.must("plan", "new")), &p); err != nil {
			t.Fatal(err)
		}
		p["limits"].(map[string]any)["ram_mb"] = 256
		p["network"] = map[string]any{"net": true}
		p["secrets"] = secrets
		if parent == "" {
			rootNotAfter = p["not_after"]
			p["grants"] = map[string]any{"max_descendants": 2, "fork_budget": map[string]any{"ram_mb": 512}}
		} else {
			p["parent"], p["not_after"] = parent, rootNotAfter
		}
		n++
		raw := filepath.Join(x.dir, "plan"+string(rune('0'+n))+".json")
		b, _ := json.Marshal(p)
		os.WriteFile(raw, b, 0o600)
		x.must("plan", "sign", "--key", "ops", raw, "-o", raw+".signed")
		return raw + ".signed"
	}
	secret := func(name string) (value, file string) {
		b := make([]byte, 12)
		rand.Read(b)
		value = name + "-" + hex.EncodeToString(b)
		file = filepath.Join(x.dir, name+".secret")
		os.WriteFile(file, []byte(value), 0o600)
		return value, file
	}
	alpha, alphaFile := secret("alpha")
	beta, betaFile := secret("beta")

	x.must("--plan", plan(""), "--secret", "API_KEY=@"+alphaFile, "create", "--name", "parent", "--net", "--run-as", "nether", "--start")
	x.refused(7, []string{"snapshot", "create", "--clean", "parent", "c"}, "it holds secrets (API_KEY)")
	// The parent's state at the capture is the child's starting point.
	x.must("exec", "parent", "--", "echo warmed > /tmp/marker")
	x.must("snapshot", "create", "parent", "s")
	parent := x.inspect("parent")
	// A secret the child plan does not list is refused by name.
	x.refused(7, []string{"--plan", plan(parent.Plan), "--secret", "OTHER=x", "fork", "s"}, "secrets OTHER: the plan does not list them")
	// Nor does a child plan that lists none of the parent's: its memory
	// would be what the parent's tenant made of them.
	secrets = nil
	x.refused(7, []string{"--plan", plan(parent.Plan), "fork", "s"}, "the snapshot is dirty and its plan handed the sandbox API_KEY", "the child plan must list API_KEY too (it lists none)")
	secrets = []string{"API_KEY"}
	kidID := ids1(x.must("--plan", plan(parent.Plan), "--secret", "API_KEY=@"+betaFile, "fork", "s"))
	kid := x.inspect(kidID)

	type view struct {
		info               map[string]string
		identity           map[string]string
		secret, mode, mac  string
		kernel             string
		tokenVMID, tokenBt string
	}
	look := func(sb nxSandbox) view {
		t.Helper()
		var v view
		out, err := exec.Command(ctlBin, filepath.Join(x.dir, "sandboxes", sb.ID, "ctl.sock"), "__info__").Output()
		if err != nil {
			t.Fatalf("__info__ of %s: %v", sb.ID, err)
		}
		v.info = keyValues(string(out))
		v.identity = keyValues(x.must("exec", sb.ID, "--", "cat /run/nether/identity"))
		v.secret = x.must("exec", sb.ID, "--", "cat /run/secrets/API_KEY")
		v.mode = strings.TrimSpace(x.must("exec", sb.ID, "--", "stat -c '%a %U' /run/secrets/API_KEY"))
		v.mac = strings.TrimSpace(x.must("exec", sb.ID, "--", "cat /sys/class/net/eth0/address"))
		v.kernel = strings.TrimSpace(x.must("exec", sb.ID, "--", "uname -r"))
		var tok struct {
			VMID   string `json:"vm_id"`
			BootID string `json:"boot_id"`
		}
		cmd := exec.Command(nexusBin, "--state-dir", x.dir, "--json", "trust", "verify-token", "-")
		cmd.Stdin = strings.NewReader(v.identity["token"])
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("verify-token of %s's token: %v", sb.ID, err)
		}
		json.Unmarshal(b, &tok)
		v.tokenVMID, v.tokenBt = tok.VMID, tok.BootID
		return v
	}
	p, k := look(parent), look(kid)

	// What must differ.
	for _, d := range []struct{ what, a, b string }{
		{"boot_id (__info__)", p.info["boot_id"], k.info["boot_id"]},
		{"boot_id (/run/nether/identity)", p.identity["boot_id"], k.identity["boot_id"]},
		{"vm_id", p.identity["vm_id"], k.identity["vm_id"]},
		{"plan (its nonce)", parent.Plan, kid.Plan},
		{"identity token", p.identity["token"], k.identity["token"]},
		{"session epoch", p.info["session_epoch"], k.info["session_epoch"]},
		{"MAC (network lease)", p.mac, k.mac},
		{"secret", p.secret, k.secret},
	} {
		if d.a == "" || d.a == "-" || d.a == d.b {
			t.Errorf("%s: parent %q, fork %q: want two different values", d.what, d.a, d.b)
		}
	}
	// Each names itself, and its token says so under the admission key.
	for _, c := range []struct {
		who string
		sb  nxSandbox
		v   view
	}{{"parent", parent, p}, {"fork", kid, k}} {
		if c.v.identity["vm_id"] != c.sb.ID || c.v.info["boot_id"] != c.v.identity["boot_id"] || c.v.info["plan_digest"] != c.sb.Plan ||
			c.v.identity["plan_digest"] != c.sb.Plan || c.v.tokenVMID != c.sb.ID || c.v.tokenBt != c.v.identity["boot_id"] {
			t.Errorf("%s %s: __info__ %v, identity %v, token names %s/%s", c.who, c.sb.ID, c.v.info, c.v.identity, c.v.tokenVMID, c.v.tokenBt)
		}
		// Readable by the run_as user the commands run as, and by
		// nobody else.
		if c.v.mode != "400 nether" {
			t.Errorf("%s: /run/secrets/API_KEY is %q, want mode 400 owned by nether (the run_as user)", c.who, c.v.mode)
		}
	}
	if p.secret != alpha || k.secret != beta {
		t.Errorf("secrets: parent holds %q (want its own %q), fork %q (want its own %q)", p.secret, alpha, k.secret, beta)
	}
	// What may match: the node, the kernel, the computation, the lineage.
	if p.info["node_id"] != k.info["node_id"] || p.info["node_id"] == "-" || p.kernel != k.kernel {
		t.Errorf("node or kernel differ: %s/%s, %s/%s", p.info["node_id"], k.info["node_id"], p.kernel, k.kernel)
	}
	if got := x.must("exec", kidID, "--", "cat /tmp/marker"); got != "warmed\n" {
		t.Errorf("the fork's /tmp/marker: %q, want the parent's warmed state", got)
	}
	var snaps []struct{ ID, Name, Dir, Class string }
	json.Unmarshal([]byte(x.must("snapshot", "ls", "--json")), &snaps)
	var sID string
	for _, s := range snaps {
		if s.Name == "s" {
			sID = s.ID
			if s.Class != "dirty" {
				t.Errorf("snapshot s is %q, want dirty", s.Class)
			}
		}
	}
	if kid.Parent != parent.ID || kid.Snapshot != sID {
		t.Errorf("the fork's lineage: parent %s snapshot %s, want %s and %s", kid.Parent, kid.Snapshot, parent.ID, sID)
	}

	// The audit stream: each boot its own, the fork's causal edges, the
	// secret deliveries by name.
	var recs []struct{ Event, Sandbox, Boot, Plan, Parent, Snapshot, Detail string }
	raw := x.must("audit", "ls", "--json")
	json.Unmarshal([]byte(raw), &recs)
	boots := map[string]string{}
	delivered := 0
	for _, r := range recs {
		switch {
		case r.Event == "fork" && r.Sandbox == kidID:
			boots["fork"] = r.Boot
			if r.Parent != parent.ID || r.Snapshot != sID || r.Plan != kid.Plan {
				t.Errorf("the fork's record: %+v", r)
			}
		case r.Event == "boot" && r.Sandbox == parent.ID:
			boots["parent"] = r.Boot
		case r.Event == "secrets":
			delivered++
			if r.Detail != "API_KEY" {
				t.Errorf("a secrets record: %+v", r)
			}
		}
	}
	if boots["fork"] != k.info["boot_id"] || boots["parent"] != p.info["boot_id"] || delivered != 2 {
		t.Errorf("audit: boots %v (want parent %s, fork %s), %d secret deliveries (want 2)", boots, p.info["boot_id"], k.info["boot_id"], delivered)
	}
	if strings.Contains(raw, alpha) || strings.Contains(raw, beta) {
		t.Error("a secret's value is on the audit chain")
	}

	// No file holds the fork's secret; the parent's is only in the guest
	// memory of the dirty snapshot of it.
	sDir := ""
	for _, s := range snaps {
		if s.Name == "s" {
			sDir = s.Dir
		}
	}
	if sDir == "" {
		t.Fatal("snapshot s has no directory")
	}
	filepath.WalkDir(x.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || strings.HasSuffix(path, ".secret") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil // a socket, a file gone meanwhile
		}
		if bytes.Contains(b, []byte(beta)) {
			t.Errorf("%s holds the fork's secret", path)
		}
		if bytes.Contains(b, []byte(alpha)) && !(strings.HasPrefix(path, sDir+"/") && !strings.HasSuffix(path, ".json")) {
			t.Errorf("%s holds the parent's secret", path)
		}
		return nil
	})
	if out := x.must("audit", "verify"); !strings.HasPrefix(out, "audit chain intact") {
		t.Errorf("audit verify: %q", out)
	}
}

// keyValues reads key=value lines.
func keyValues(s string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), "="); ok {
			m[k] = v
		}
	}
	return m
}
