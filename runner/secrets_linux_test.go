package runner

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/conf"
)

// TestSecretsFileSealed: the memory file the secrets travel in is sealed
// against every change (nether trusts what it reads there to be what
// nexus wrote) and holds their encoding, which nether's reader takes back
// to the same values, a NUL byte included.
func TestSecretsFileSealed(t *testing.T) {
	secrets := map[string][]byte{"API_KEY": []byte("v\x00w"), "DB": []byte("pw")}
	f, err := secretsFile(EncodeSecrets(secrets))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatalf("F_GET_SEALS: %v", err)
	}
	for name, seal := range map[string]int{"F_SEAL_WRITE": unix.F_SEAL_WRITE, "F_SEAL_GROW": unix.F_SEAL_GROW,
		"F_SEAL_SHRINK": unix.F_SEAL_SHRINK, "F_SEAL_SEAL": unix.F_SEAL_SEAL} {
		if seals&seal == 0 {
			t.Errorf("the secrets file lacks %s (seals %#x)", name, seals)
		}
	}
	got, err := agentproto.ReadSecrets(f)
	if err != nil || len(got) != 2 || string(got["API_KEY"]) != "v\x00w" || string(got["DB"]) != "pw" {
		t.Fatalf("nether would read %q, %v", got, err)
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Error("the sealed secrets file took a write")
	}
	if err := f.Truncate(0); err == nil {
		t.Error("the sealed secrets file could be truncated")
	}
}

// TestLaunchHandsSecretsOnFD3: Local.Launch writes secrets_fd = 3 into
// nether.conf and the child finds the encoding on its descriptor 3; the
// secrets' values are in no file of the launch directory.
func TestLaunchHandsSecretsOnFD3(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "nether")
	// A stand-in nether: copies what it inherited on fd 3 to a file.
	script := "#!/bin/sh\ncat <&3 > fd3.out\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	secrets := map[string][]byte{"TOKEN": []byte("s3cr3t-value")}
	l := &Local{Nether: bin}
	p, err := l.Launch(dir, Settings{SandboxID: "01JX", Hostname: "web"}, secrets)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Alive(p) {
		if time.Now().After(deadline) {
			l.Terminate(p, time.Second)
			t.Fatal("the stand-in nether did not exit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, err := os.ReadFile(filepath.Join(dir, "fd3.out"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := agentproto.ReadSecrets(strings.NewReader(string(out)))
	if err != nil || string(got["TOKEN"]) != "s3cr3t-value" {
		t.Fatalf("fd 3 held %q (%q, %v)", out, got, err)
	}
	c, err := conf.Load(dir)
	if err != nil || c.SecretsFD != 3 {
		t.Fatalf("nether.conf: secrets_fd %d, %v", c.SecretsFD, err)
	}
	os.Remove(filepath.Join(dir, "fd3.out"))
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, _ := os.ReadFile(filepath.Join(dir, e.Name()))
		if strings.Contains(string(b), "s3cr3t-value") {
			t.Errorf("%s holds a secret's value", e.Name())
		}
	}
}
