package session

import (
	"log/slog"
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
