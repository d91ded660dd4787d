package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/testharness"
)

// TestSecretsLeaveNoCopies: a secret the agent delivered is nowhere in
// the guest memory a snapshot saves, nor in what a fork of it can read.
// The parent's tenant never reads it before the capture: every copy the
// scan could find would be one nether or its agent left. The scan looks
// for the secret's bytes and for their base64 (how they travel in the
// channel's JSON), in the artifact's ram and state on the host, and in
// a fork's physical memory (/proc/kcore, as root) from inside it.
func TestSecretsLeaveNoCopies(t *testing.T) {
	x := newNexus(t)
	scanner := filepath.Join(x.dir, "memscan")
	if err := testharness.Build(repoRoot, x.dir, nil, "./test/e2e/testdata/memscan"); err != nil {
		t.Fatal(err)
	}
	// 48 random bytes: a multiple of 3, so the base64 of the value alone
	// is also the base64 inside any longer encoding that starts with it.
	secret := make([]byte, 48)
	rand.Read(secret)
	file := filepath.Join(x.dir, "k.secret")
	os.WriteFile(file, secret, 0o600)
	needles := map[string][]byte{"raw": secret, "base64": []byte(base64.StdEncoding.EncodeToString(secret))}

	x.must("--secret", "API_KEY=@"+file, "create", "--name", "parent", "--ram-mb", "256", "--start")
	// Delivered (its size, not its bytes: the tenant never reads it).
	if got := strings.TrimSpace(x.must("exec", "parent", "--", "stat -c %s /run/secrets/API_KEY")); got != "48" {
		t.Fatalf("/run/secrets/API_KEY is %q bytes, want 48", got)
	}
	x.must("snapshot", "create", "parent", "s")
	var snaps []struct{ Name, Dir string }
	json.Unmarshal([]byte(x.must("snapshot", "ls", "--json")), &snaps)
	dir := ""
	for _, s := range snaps {
		if s.Name == "s" {
			dir = s.Dir
		}
	}
	if dir == "" {
		t.Fatal("snapshot s has no directory")
	}
	for _, f := range []string{"ram", "state"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for what, n := range needles {
			if c := countAt(b, n); len(c) > 0 {
				t.Errorf("the snapshot's %s holds %d copies of the secret (%s) at %#x", f, len(c), what, c)
			}
		}
	}
	// The parent goes on with its secret, whole.
	if got := strings.TrimSpace(x.must("exec", "parent", "--", "od -An -v -tx1 /run/secrets/API_KEY | tr -d ' \\n'")); got != hex.EncodeToString(secret) {
		t.Errorf("after the snapshot the parent's /run/secrets/API_KEY is %s, want %x", got, secret)
	}

	kid := strings.TrimSpace(x.must("fork", "s"))
	if got := x.must("exec", kid, "--", "ls -A /run/secrets"); got != "" {
		t.Errorf("the fork's /run/secrets holds %q", got)
	}
	x.must("cp", scanner, kid+":/tmp/memscan")
	args := []string{"chmod +x /tmp/memscan && /tmp/memscan"}
	order := []string{"raw", "base64"}
	for _, what := range order {
		args = append(args, masked(needles[what]))
	}
	out := x.must("exec", kid, "--", strings.Join(args, " "))
	t.Logf("memscan in the fork:\n%s", out)
	if !strings.Contains(out, "scanned ") {
		t.Fatalf("memscan: %q", out)
	}
	// The agent's own memory (PID 1), mapped or not: says whether a copy
	// the scan above finds is the agent's or the kernel's.
	agent := x.must("exec", kid, "--", strings.Replace(strings.Join(args, " "), "&& /tmp/memscan", "&& /tmp/memscan -pid 1", 1))
	t.Logf("memscan of the fork's agent:\n%s", agent)
	out += agent
	for i, what := range order {
		var idx, count int
		for _, l := range strings.Split(out, "\n") {
			if _, err := fmt.Sscanf(l, "%d %d", &idx, &count); err == nil && idx == i && count > 0 {
				t.Errorf("the fork's memory holds %d copies of its parent's secret (%s): %s", count, what, l)
			}
		}
	}
}

// countAt returns where n occurs in b.
func countAt(b, n []byte) []int {
	var at []int
	for off := 0; ; {
		i := bytes.Index(b[off:], n)
		if i < 0 {
			return at
		}
		at = append(at, off+i)
		off += i + 1
	}
}

// masked is memscan's form of a needle (testdata/memscan).
func masked(n []byte) string {
	m := make([]byte, len(n))
	for i, c := range n {
		m[i] = c ^ 0x5a
	}
	return hex.EncodeToString(m)
}
