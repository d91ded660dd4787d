package session

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nethersandbox/nether/internal/conf"
)

// RootImageFile is the name of the default root image setup builds in the
// guest directory (nether-guest rootfs).
const RootImageFile = "rootfs.img"

// RootImage returns the root image a configuration boots: "" for a guest
// without one (rootfs = busybox), the image setup built for the default,
// else rootfs's path.
func RootImage(cfg *conf.Config, guestDir string) (string, error) {
	switch cfg.Rootfs {
	case conf.RootfsBusybox:
		return "", nil
	case "":
		p := filepath.Join(guestDir, RootImageFile)
		if _, err := os.Stat(p); err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return "", fmt.Errorf("the default guest's root image %s is missing: run scripts/setup.sh to build it, or set rootfs = busybox in nether.conf for the busybox-only guest", p)
			}
			return "", fmt.Errorf("the default guest's root image: %w", err)
		}
		return p, nil
	}
	return cfg.Rootfs, nil
}

// rootFSType names the file system of a root image from its superblock,
// the way the guest kernel will, so an image the guest cannot mount is
// refused here, naming the file, instead of failing inside the guest.
func rootFSType(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("root image: %w", err)
	}
	defer f.Close()
	var b [2048]byte
	n, err := io.ReadFull(f, b[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("root image %s: %w", path, err)
	}
	t := fsTypeOf(b[:n])
	if t == "" {
		return "", fmt.Errorf("root image %s is not an erofs, squashfs or ext4 file system image; build one with nether-guest rootfs, or set rootfs = busybox", path)
	}
	return t, nil
}

// fsTypeOf recognises the superblock magics of the file systems a guest
// can mount its root from.
func fsTypeOf(b []byte) string {
	switch {
	case len(b) >= 1028 && binary.LittleEndian.Uint32(b[1024:]) == 0xE0F5E1E2:
		return "erofs"
	case len(b) >= 4 && string(b[:4]) == "hsqs":
		return "squashfs"
	case len(b) >= 1082 && binary.LittleEndian.Uint16(b[1080:]) == 0xEF53:
		return "ext4"
	}
	return ""
}
