package main

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The root image. With nether.root=<fstype> on the kernel command line the
// guest has a read-only root image on a block device (serial
// rootSerial); the agent, PID 1 in the initramfs, mounts it under a
// writable layer in the guest's own memory and makes that the root of
// every process, as an initramfs's switch_root does. The writable layer
// is a tmpfs, so a snapshot captures every change with the RAM, and the
// image itself is never written: any number of sandboxes, restores and
// forks share one file.
const (
	// rootSerial is engine.RootImageSerial.
	rootSerial = "nether-root"
	// diskModuleList is guestimage.DiskModuleListPath.
	diskModuleList = "/etc/nether/modules.disk"
	// ext4ModuleList is guestimage.Ext4ModuleListPath: loaded only by a
	// guest that mounts ext4 (a /data disk, an ext4 root image).
	ext4ModuleList = "/etc/nether/modules.ext4"
	// rootDeviceWait bounds the wait for the block device: virtio_blk
	// registers it while its module loads.
	rootDeviceWait = 5 * time.Second
	// stage is where the layers are put together before the switch.
	stage = "/.nether-root"
)

// prepareRoot loads what mounting the image needs and, for a guest with
// a network, the NIC's modules (their files are in the initramfs, which
// is gone after the switch), then switches to the image.
func prepareRoot(fstype string, params map[string]string, log *slog.Logger) error {
	if err := loadModules(diskModuleList, log); err != nil {
		return err
	}
	if fstype == "ext4" || params["nether.disk"] == "1" {
		// Now: the initramfs that holds them is gone after the switch.
		if err := loadModules(ext4ModuleList, log); err != nil {
			return err
		}
	}
	if params["nether.net"] == "1" {
		// As setupNetwork does, before the NIC exists: eth0 is born
		// without IPv6. setupNetwork finds the modules loaded.
		if err := writeSysctl("net/ipv6/conf/default/disable_ipv6", "1"); err != nil {
			return fmt.Errorf("disabling IPv6 for new interfaces: %w", err)
		}
		if err := loadModules(netModuleList, log); err != nil {
			return err
		}
	}
	dev, err := waitBlockDevice(rootSerial, rootDeviceWait)
	if err != nil {
		return err
	}
	return switchRoot(dev, fstype)
}

// waitBlockDevice finds the block device whose serial is serial. Without
// udev there are no /dev/disk/by-id links; sysfs has the serial.
func waitBlockDevice(serial string, wait time.Duration) (string, error) {
	deadline := time.Now().Add(wait)
	for {
		dirs, _ := filepath.Glob("/sys/block/*")
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "serial"))
			if err == nil && strings.TrimSpace(string(b)) == serial {
				return "/dev/" + filepath.Base(d), nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the block device with serial %s did not appear within %s", serial, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// switchRoot mounts dev (read-only) under a tmpfs overlay and makes it /,
// carrying /proc, /sys and /dev along. What the initramfs held is freed
// first: the agent keeps running from its mapped (deleted) binary, and
// nothing else in the guest needs the initramfs after this.
func switchRoot(dev, fstype string) error {
	lower, rw, root := stage+"/lower", stage+"/rw", stage+"/root"
	for _, d := range []string{lower, rw, root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := unix.Mount(dev, lower, fstype, unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mounting the root image %s (%s): %w", dev, fstype, err)
	}
	if err := unix.Mount("tmpfs", rw, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("mounting the root's writable layer: %w", err)
	}
	for _, d := range []string{rw + "/upper", rw + "/work"} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + rw + "/upper,workdir=" + rw + "/work"
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the root overlay: %w", err)
	}
	for _, m := range []string{"/proc", "/sys", "/dev"} {
		if err := os.MkdirAll(root+m, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m, root+m, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("moving %s into the root image: %w", m, err)
		}
	}
	freeInitramfs()
	if err := os.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switching to the root image: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switching to the root image: %w", err)
	}
	return os.Chdir("/")
}

// freeInitramfs deletes the initramfs's files, as switch_root does: they
// live in the guest's RAM, and a snapshot would carry them for nothing.
// It stays on the initramfs's own file system, so the mounts under stage
// are not touched.
func freeInitramfs() {
	var st unix.Stat_t
	if unix.Lstat("/", &st) != nil {
		return
	}
	removeOnDevice("/", uint64(st.Dev))
}

func removeOnDevice(dir string, dev uint64) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if unix.Lstat(p, &st) != nil || uint64(st.Dev) != dev {
			continue // a mount point: another file system
		}
		if e.IsDir() {
			removeOnDevice(p, dev)
			unix.Rmdir(p) // fails, harmlessly, on a directory holding a mount point
			continue
		}
		unix.Unlink(p)
	}
}
