package session

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

const testDigest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// TestIdentityAndSecrets: a boot hands its guest the identity nether.conf
// names and the secrets before the first command runs, and __info__
// reports the identity; a fork gets a boot id of its own and only the
// secrets its own start supplied; the secrets' values are never logged.
func TestIdentityAndSecrets(t *testing.T) {
	eng := fake.New(slog.Default())
	withSecrets := func(s agentproto.Secrets) func(*Options) {
		return func(o *Options) { o.Secrets = s }
	}
	parentSecrets := agentproto.Secrets{"API_KEY": []byte("parent-value-\x00\xff")}
	sb := start(t, eng, "", "sandbox_id = parent-1\nnode_id = node-7\nboot_id = boot-parent\nplan_digest = "+testDigest+"\nidentity_token = tok.parent\n",
		withSecrets(parentSecrets))
	c := sb.dial()
	mustRun(t, c, "echo up") // waits for the agent, which waits for the provision
	m := eng.Machines()[len(eng.Machines())-1]
	want := agentproto.Identity{NodeID: "node-7", VMID: "parent-1", BootID: "boot-parent", PlanDigest: testDigest, Token: "tok.parent"}
	if got := m.Identity(); got != want {
		t.Errorf("the booted guest holds identity %+v, want %+v", got, want)
	}
	if got := m.Secrets(); !reflect.DeepEqual(got, parentSecrets) {
		t.Errorf("the booted guest holds secrets %q, want %q", got, parentSecrets)
	}
	info := infoOf(t, c)
	for k, v := range map[string]string{"node_id": "node-7", "boot_id": "boot-parent", "plan_digest": testDigest, "session_epoch": "0000000000000000"} {
		if info[k] != v {
			t.Errorf("__info__ %s=%q, want %q", k, info[k], v)
		}
	}
	if strings.Contains(sb.logs.String(), "parent-value") {
		t.Error("a secret's value reached the log")
	}
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")

	base, _ := snapshotBase(t, eng, "base")
	childSecrets := agentproto.Secrets{"API_KEY": []byte("child-value")}
	_, fc, fm := restoreOf(t, eng, base, "node_id = node-7\nboot_id = boot-child\n", withSecrets(childSecrets))
	finfo := infoOf(t, fc)
	if finfo["boot_id"] != "boot-child" || fm.Identity().BootID != "boot-child" || fm.Identity().VMID != finfo["sandbox_id"] {
		t.Errorf("the fork: __info__ boot_id=%q sandbox_id=%q, guest identity %+v", finfo["boot_id"], finfo["sandbox_id"], fm.Identity())
	}
	if got := fm.Secrets(); !reflect.DeepEqual(got, childSecrets) {
		t.Errorf("the fork holds secrets %q, want only its own %q", got, childSecrets)
	}
	if finfo["plan_digest"] != "-" {
		t.Errorf("the fork's plan_digest = %q, want - (none handed in)", finfo["plan_digest"])
	}

	// Without boot_id in nether.conf nether mints one per boot.
	_, mc, _ := restoreOf(t, eng, base, "")
	if id := infoOf(t, mc)["boot_id"]; id == "-" || id == "boot-child" || len(id) != 26 {
		t.Errorf("a minted boot_id %q, want a new ULID", id)
	}
}

// TestBaseCaptureWithdrawsSecrets: a base of a sandbox given secrets
// holds none of them (the agent emptied /run/secrets first) and the
// sandbox has them back once its guest runs on; a park keeps them, for
// its wake is the same sandbox.
func TestBaseCaptureWithdrawsSecrets(t *testing.T) {
	eng := fake.New(slog.Default())
	secrets := agentproto.Secrets{"API_KEY": []byte("value-\x00\xff")}
	sb := start(t, eng, "", "", func(o *Options) { o.Secrets = secrets })
	c := sb.dial()
	mustRun(t, c, "echo up")
	m := eng.Machines()[len(eng.Machines())-1]
	captured := func(name string) agentproto.Secrets {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(sb.dir, name, "state"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Secrets agentproto.Secrets }
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return st.Secrets
	}
	if out := mustRun(t, c, "__snapshot__ base"); !strings.HasPrefix(out, "OK snapshot base kind=base") {
		t.Fatalf("snapshot reply %q", out)
	}
	if got := captured("base"); got != nil {
		t.Errorf("the base holds secrets %q", got)
	}
	if got := m.Secrets(); !reflect.DeepEqual(got, secrets) || m.Withdrawals() != 1 {
		t.Errorf("after the capture the guest holds %q (want %q given back), %d withdrawals (want 1)", got, secrets, m.Withdrawals())
	}
	if out := mustRun(t, c, "__park__ p"); !strings.HasPrefix(out, "OK parked p") {
		t.Fatalf("park reply %q", out)
	}
	sb.expectEnd(5*time.Second, 0, "park")
	if got := captured("p"); !reflect.DeepEqual(got, secrets) || m.Withdrawals() != 1 {
		t.Errorf("the park holds secrets %q (want %q), %d withdrawals (want 1)", got, secrets, m.Withdrawals())
	}
	if strings.Contains(sb.logs.String(), "value-") {
		t.Error("a secret's value reached the log")
	}
}
