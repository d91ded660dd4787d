package main

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// initSystem does what an init does before anything else can run: the
// kernel gives PID 1 an empty rootfs with no mounts.
//
// probs are what the host must hear about in hello: what was asked for
// and could not be set up.
func initSystem(log *slog.Logger) (params map[string]string, probs problems, err error) {
	var errs []error
	// /proc, /sys and /dev first: the command line, the modules and the
	// root image's device need them; a root switch carries them along.
	errs = append(errs, mountAll(earlyMounts)...)
	params = kernelParams()
	if err := loadModules("/etc/nether/modules", log); err != nil {
		errs = append(errs, err)
	}
	if fstype := params["nether.root"]; fstype != "" {
		if err := prepareRoot(fstype, params, log); err != nil {
			// Without its root the guest has only the initramfs's
			// busybox: say so loudly; commands will show it too.
			errs = append(errs, fmt.Errorf("mounting the root image: %w", err))
		}
	}
	errs = append(errs, mountAll(lateMounts)...)
	if params["nether.disk"] == "1" {
		if params["nether.root"] == "" {
			// The busybox guest: the modules are still in the
			// initramfs (prepareRoot loads them for a root image).
			if err := loadModules(diskModuleList, log); err != nil {
				errs = append(errs, err)
			}
			if err := loadModules(ext4ModuleList, log); err != nil {
				errs = append(errs, err)
			}
		}
		if err := mountData(); err != nil {
			errs = append(errs, err)
			probs.disk = err.what
		}
	}
	if err := linkUp("lo"); err != nil {
		errs = append(errs, fmt.Errorf("bringing up lo: %w", err))
	}
	host := params["nether.hostname"]
	if host == "" {
		host = "sandbox"
	}
	if err := setHostname(host); err != nil {
		errs = append(errs, fmt.Errorf("setting hostname: %w", err))
	}
	if params["nether.net"] == "1" {
		// Before hello, so the first command finds the network up.
		if err := setupNetwork(log); err != nil {
			errs = append(errs, fmt.Errorf("setting up the network: %w", err))
		}
	}
	os.Setenv("PATH", "/bin:/sbin:/usr/bin:/usr/sbin")
	os.Setenv("HOME", "/root")
	return params, probs, errors.Join(errs...)
}

// problems are what the guest could not set up as the host asked, for
// hello: disk (DiskProblem) ends the sandbox; setup (Problem) refuses
// every command.
type problems struct {
	setup []string
	disk  string
}

type mount struct {
	src, dst, fstype string
	flags            uintptr
	data             string
	mode             os.FileMode
}

var (
	earlyMounts = []mount{
		{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", 0o555},
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", 0o755},
	}
	lateMounts = []mount{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=620,ptmxmode=666", 0o755},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
	}
)

func mountAll(ms []mount) []error {
	var errs []error
	for _, m := range ms {
		if err := os.MkdirAll(m.dst, m.mode); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, fmt.Errorf("mounting %s on %s: %w", m.fstype, m.dst, err))
		}
	}
	return errs
}

// loadModules loads the kernel modules the image builder listed, in the
// order it resolved from modules.dep (dependencies first).
func loadModules(list string, log *slog.Logger) error {
	f, err := os.Open(list)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" || strings.HasPrefix(path, "#") {
			continue
		}
		if err := loadModule(path); err != nil {
			errs = append(errs, fmt.Errorf("loading %s: %w", filepath.Base(path), err))
		}
	}
	return errors.Join(errs...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// openPort finds the virtio-serial port by name. Without udev there are no
// /dev/virtio-ports links, so we read the names from sysfs. The port shows
// up once virtio_console has probed, which may be after we start.
func openPort(name string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		dirs, _ := filepath.Glob("/sys/class/virtio-ports/*")
		for _, d := range dirs {
			b, err := os.ReadFile(filepath.Join(d, "name"))
			if err == nil && strings.TrimSpace(string(b)) == name {
				return os.OpenFile(filepath.Join("/dev", filepath.Base(d)), os.O_RDWR, 0)
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("virtio-serial port %q did not appear within %s", name, wait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// powerOff ends the guest. QEMU exits when the guest powers off.
func powerOff(log *slog.Logger) {
	unix.Sync()
	if os.Getpid() != 1 {
		os.Exit(0)
	}
	// Let other processes go first so nothing is mid-write.
	unix.Kill(-1, unix.SIGTERM)
	time.Sleep(50 * time.Millisecond)
	unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.Error("agent: power off failed", "err", err)
	}
	select {}
}

// setHostname sets the kernel's hostname, and /etc/hostname and
// /etc/hosts to match (a fork renames itself here too).
func setHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return err
	}
	if err := os.WriteFile("/etc/hostname", []byte(name+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile("/etc/hosts", []byte(hostsFile(name)), 0o644)
}
