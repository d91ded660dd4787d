package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// TestProvisionFiles: the identity file is written whole and readable by
// all; secrets are 0400 files of the run_as user in a 0500 directory; a
// fork's wipe leaves none of the previous secrets, and a new set replaces
// the old one whole.
func TestProvisionFiles(t *testing.T) {
	dir := t.TempDir()
	a := &agent{policy: &runAsPolicy{}, identityFile: filepath.Join(dir, "nether", "identity"), secretsDir: filepath.Join(dir, "secrets")}
	if err := a.prepareRunDirs(); err != nil {
		t.Fatal(err)
	}
	id := &agentproto.Identity{NodeID: "n", VMID: "vm", BootID: "b1", PlanDigest: "d", Token: "t.s"}
	if err := a.provisionFiles(id, agentproto.Secrets{"API_KEY": []byte("v1\x00"), "db.pass": []byte("v2")}, false); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(a.identityFile); err != nil || string(b) != "node_id=n\nvm_id=vm\nboot_id=b1\nplan_digest=d\ntoken=t.s\n" {
		t.Fatalf("identity file %q, %v", b, err)
	}
	if fi, _ := os.Stat(a.identityFile); fi.Mode().Perm() != 0o444 {
		t.Errorf("identity file mode %v", fi.Mode())
	}
	a.policy.user.Store(&account{name: "u", uid: 1234, gid: 5678})
	check := func(name, want string) {
		t.Helper()
		p := filepath.Join(a.secretsDir, name)
		b, err := os.ReadFile(p)
		if err != nil || string(b) != want {
			t.Fatalf("secret %s = %q, %v; want %q", name, b, err, want)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != 0o400 {
			t.Errorf("secret %s mode %v, want 0400", name, fi.Mode())
		}
	}
	check("API_KEY", "v1\x00")
	check("db.pass", "v2")

	// A fork's handshake without secrets: none left.
	if err := a.provisionFiles(nil, nil, true); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(a.secretsDir); len(entries) != 0 {
		t.Fatalf("after the wipe /run/secrets holds %v", entries)
	}
	// A fork's own secrets, owned by the run_as user.
	if err := a.provisionFiles(&agentproto.Identity{BootID: "b2"}, agentproto.Secrets{"CHILD": []byte("c")}, true); err != nil {
		t.Fatal(err)
	}
	check("CHILD", "c")
	if entries, _ := os.ReadDir(a.secretsDir); len(entries) != 1 {
		t.Fatalf("after the fork's provision /run/secrets holds %v, want CHILD only", entries)
	}
	fi, _ := os.Stat(filepath.Join(a.secretsDir, "CHILD"))
	if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && (st.Uid != 1234 || st.Gid != 5678) {
		t.Errorf("secret owned by %d:%d, want the run_as user's 1234:5678", st.Uid, st.Gid)
	}
	di, _ := os.Stat(a.secretsDir)
	if di.Mode().Perm() != 0o500 {
		t.Errorf("secrets directory mode %v, want 0500", di.Mode())
	}
	if b, _ := os.ReadFile(a.identityFile); string(b) != "boot_id=b2\n" {
		t.Errorf("the identity file after the fork: %q", b)
	}
}

// A guest captured by an agent that made no directories at boot (an
// older one) still gets its identity and secrets: the handshake makes
// them.
func TestProvisionWithoutPreparedDirs(t *testing.T) {
	dir := t.TempDir()
	a := &agent{policy: &runAsPolicy{}, identityFile: filepath.Join(dir, "nether", "identity"), secretsDir: filepath.Join(dir, "secrets")}
	if err := a.provisionFiles(&agentproto.Identity{BootID: "b"}, agentproto.Secrets{"K": []byte("v")}, true); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(a.secretsDir, "K")); err != nil || string(b) != "v" {
		t.Fatalf("secret %q, %v", b, err)
	}
	if di, _ := os.Stat(a.secretsDir); di.Mode().Perm() != 0o500 {
		t.Errorf("secrets directory mode %v", di.Mode())
	}
	if b, _ := os.ReadFile(a.identityFile); string(b) != "boot_id=b\n" {
		t.Errorf("identity %q", b)
	}
}
