package guestimage

import (
	"errors"
	"os"
	"path/filepath"
)

// Dir is the guest directory a nether binary at exe boots from:
// NETHER_GUEST_DIR, else build/guest beside the binary's checkout (exe's
// symlinks resolved) when it exists, else build/guest under the working
// directory. nexus asks it too, for the nether it runs, to know what its
// sandboxes boot.
func Dir(exe string) string {
	if d := os.Getenv("NETHER_GUEST_DIR"); d != "" {
		return d
	}
	if exe != "" {
		if real, err := filepath.EvalSymlinks(exe); err == nil {
			exe = real
		}
		d := filepath.Join(filepath.Dir(exe), "..", "build", "guest")
		if _, err := os.Stat(d); err == nil || !errors.Is(err, os.ErrNotExist) {
			return d
		}
	}
	return filepath.Join("build", "guest")
}
