package guestimage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestDigestsUseTheManifestOnlyForTheSameFile: the kernel's digest comes
// from setup's manifest while the file is the one the manifest stamped,
// and is computed afresh as soon as the file changed.
func TestDigestsUseTheManifestOnlyForTheSameFile(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinux")
	os.WriteFile(kernel, []byte("kernel bytes"), 0o644)
	fi, _ := os.Stat(kernel)
	st := FileStamp{Path: "build/guest/vmlinux", Size: fi.Size(), MTime: fi.ModTime().UnixNano(),
		Ino: fi.Sys().(*syscall.Stat_t).Ino, SHA256: "recorded-by-setup"}
	m := Manifest{Format: 1, Stamps: map[string]FileStamp{"out-vmlinux": st}}
	b, _ := json.Marshal(m)
	os.WriteFile(filepath.Join(dir, ManifestFile), b, 0o644)

	got, err := NewDigests(dir).Of(kernel)
	if err != nil || got != "recorded-by-setup" {
		t.Fatalf("unchanged file: got %q, %v; want the manifest's digest", got, err)
	}
	os.WriteFile(kernel, []byte("a different kernel"), 0o644)
	sum := sha256.Sum256([]byte("a different kernel"))
	got, err = NewDigests(dir).Of(kernel)
	if err != nil || got != hex.EncodeToString(sum[:]) {
		t.Fatalf("changed file: got %q, %v; want its real sha256", got, err)
	}
	if _, err := NewDigests(dir).Of(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file got a digest")
	}
}
