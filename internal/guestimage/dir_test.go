package guestimage

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDir(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "bin"), 0o755)
	os.MkdirAll(filepath.Join(root, "build", "guest"), 0o755)
	exe := filepath.Join(root, "bin", "nether")
	os.WriteFile(exe, nil, 0o755)
	link := filepath.Join(t.TempDir(), "nether")
	os.Symlink(exe, link)
	want := filepath.Join(root, "bin", "..", "build", "guest")
	t.Setenv("NETHER_GUEST_DIR", "")
	for _, c := range []struct{ name, exe, want string }{
		{"beside the binary", exe, want},
		{"beside the binary a symlink names", link, want},
		{"no checkout beside it", filepath.Join(t.TempDir(), "nether"), filepath.Join("build", "guest")},
		{"no binary", "", filepath.Join("build", "guest")},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Dir(c.exe); got != c.want {
				t.Fatalf("Dir(%q) = %q, want %q", c.exe, got, c.want)
			}
		})
	}
	t.Setenv("NETHER_GUEST_DIR", "/srv/guest")
	if got := Dir(exe); got != "/srv/guest" {
		t.Fatalf("with NETHER_GUEST_DIR: %q", got)
	}
}
