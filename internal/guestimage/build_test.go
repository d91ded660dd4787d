package guestimage

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/u-root/u-root/pkg/cpio"
)

// missingPrereq stops a test whose host prerequisite is absent. In CI
// (CI set to anything) scripts/setup.sh has installed every prerequisite,
// so an absent one is a broken setup and fails the test; elsewhere the
// test is skipped, and the skip says plainly that nothing was checked.
func missingPrereq(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("CI is set but %s; scripts/setup.sh must run before the tests", what)
	}
	t.Skipf("SKIPPED, nothing checked: %s (run scripts/setup.sh; with CI set this is a failure)", what)
}

// staticBusybox returns DefaultBusybox if it is the static build, else
// stops the test through missingPrereq.
func staticBusybox(t *testing.T) string {
	t.Helper()
	if err := checkStatic(DefaultBusybox, "busybox"); err != nil {
		missingPrereq(t, fmt.Sprintf("a static busybox is missing (install busybox-static): %v", err))
	}
	return DefaultBusybox
}

// haveXZ reports whether xz is installed, for the xz-compressed module
// case. Without it the rest of a test still runs, so outside CI this only
// logs what goes unchecked; in CI, where setup.sh installs xz-utils, its
// absence fails the test.
func haveXZ(t *testing.T) bool {
	t.Helper()
	if _, err := exec.LookPath("xz"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but xz is missing (install xz-utils): %v", err)
		}
		t.Logf("NOT CHECKED: xz-compressed modules, because xz is missing (install xz-utils; with CI set this is a failure)")
		return false
	}
	return true
}

// fakeKernel lays out a kernel-like tree: modules.dep, modules.builtin, plain
// and (if xz is installed) xz-compressed modules, and dummy kernel images.
func fakeKernel(t *testing.T) *Kernel {
	t.Helper()
	dir := t.TempDir()
	ver := "6.1.0-99-amd64"
	mods := filepath.Join(dir, "lib", "modules", ver)
	write := func(rel, content string) {
		p := filepath.Join(mods, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("kernel/drivers/virtio/virtio.ko", "\x7fELF virtio")
	write("kernel/drivers/char/virtio_console.ko", "\x7fELF console")
	write("kernel/net/core/failover.ko", "\x7fELF failover")
	write("kernel/drivers/net/net_failover.ko", "\x7fELF net_failover")
	write("kernel/drivers/net/virtio_net.ko", "\x7fELF virtio_net")
	write("kernel/crypto/crc32c_generic.ko", "\x7fELF crc32c")
	write("kernel/drivers/block/virtio_blk.ko", "\x7fELF virtio_blk")
	write("kernel/fs/erofs/erofs.ko", "\x7fELF erofs")
	write("kernel/fs/overlayfs/overlay.ko", "\x7fELF overlay")
	write("kernel/fs/jbd2/jbd2.ko", "\x7fELF jbd2")
	write("kernel/fs/ext4/ext4.ko", "\x7fELF ext4")
	dep := "kernel/drivers/virtio/virtio.ko:\nkernel/drivers/char/virtio_console.ko: kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko\n" +
		"kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko\n" +
		"kernel/net/core/failover.ko:\n" +
		"kernel/crypto/crc32c_generic.ko:\n" +
		"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko\n" +
		"kernel/fs/erofs/erofs.ko:\nkernel/fs/overlayfs/overlay.ko:\n" +
		"kernel/fs/ext4/ext4.ko: kernel/fs/jbd2/jbd2.ko\nkernel/fs/jbd2/jbd2.ko:\n"
	if haveXZ(t) {
		write("kernel/drivers/char/hw_random/virtio-rng.ko", "\x7fELF rng")
		if out, err := exec.Command("xz", filepath.Join(mods, "kernel/drivers/char/hw_random/virtio-rng.ko")).CombinedOutput(); err != nil {
			t.Fatalf("xz: %v %s", err, out)
		}
		dep += "kernel/drivers/char/hw_random/virtio-rng.ko.xz: kernel/drivers/virtio/virtio.ko\n"
	}
	write("modules.dep", dep)
	write("modules.builtin", "kernel/drivers/virt/vmgenid.ko\n")
	for _, f := range []string{"vmlinux", "vmlinuz"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("fake "+f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &Kernel{
		Version: ver, Package: "linux-image-" + ver, PackageVersion: "6.1.999-1",
		Vmlinux: filepath.Join(dir, "vmlinux"), Vmlinuz: filepath.Join(dir, "vmlinuz"), ModulesDir: mods, PVH: true,
	}
}

func readArchive(t *testing.T, p string) map[string]cpio.Record {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]cpio.Record{}
	for _, r := range recs {
		m[r.Name] = r
	}
	return m
}

func content(t *testing.T, r cpio.Record) string {
	t.Helper()
	b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBuild(t *testing.T) {
	bb := staticBusybox(t)
	k := fakeKernel(t)
	// busybox doubles as the stand-in agent: any static x86_64 ELF will do.
	opts := func(out string) BuildOptions {
		return BuildOptions{Kernel: k, Agent: bb, Busybox: bb, Modules: []string{"virtio-console", "virtio_rng", "vmgenid"}, Out: out}
	}
	// fakeKernel made the xz module only when xz is installed (haveXZ).
	if _, err := os.Stat(filepath.Join(k.ModulesDir, "kernel/drivers/char/hw_random/virtio-rng.ko.xz")); err != nil {
		opts = func(out string) BuildOptions {
			return BuildOptions{Kernel: k, Agent: bb, Busybox: bb, Modules: []string{"virtio-console", "vmgenid"}, Out: out}
		}
	}
	outA, outB := t.TempDir(), t.TempDir()
	mA, err := Build(opts(outA))
	if err != nil {
		t.Fatal(err)
	}
	mB, err := Build(opts(outB))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(outA, InitramfsFile))
	b, _ := os.ReadFile(filepath.Join(outB, InitramfsFile))
	if !bytes.Equal(a, b) || mA.SHA256.Initramfs != mB.SHA256.Initramfs {
		t.Fatalf("two builds from the same inputs differ (%d vs %d bytes)", len(a), len(b))
	}

	recs := readArchive(t, filepath.Join(outA, InitramfsFile))
	modRoot := "lib/modules/" + k.Version + "/"
	wantList := "/" + modRoot + "kernel/drivers/virtio/virtio.ko\n/" + modRoot + "kernel/drivers/char/virtio_console.ko\n"
	// The network's list loads virtio_net's dependencies first and leaves
	// out virtio, which the base list loads.
	wantNetList := "/" + modRoot + "kernel/net/core/failover.ko\n/" + modRoot + "kernel/drivers/net/net_failover.ko\n/" + modRoot + "kernel/drivers/net/virtio_net.ko\n"
	// The block devices' list likewise, in the order of its roots.
	wantDiskList := "/" + modRoot + "kernel/crypto/crc32c_generic.ko\n/" + modRoot + "kernel/drivers/block/virtio_blk.ko\n/" + modRoot + "kernel/fs/erofs/erofs.ko\n/" +
		modRoot + "kernel/fs/overlayfs/overlay.ko\n"
	// ext4's list: its dependencies first, nothing the disk list loads.
	wantExt4List := "/" + modRoot + "kernel/fs/jbd2/jbd2.ko\n/" + modRoot + "kernel/fs/ext4/ext4.ko\n"
	if len(mA.RootModules) == 3 {
		wantList += "/" + modRoot + "kernel/drivers/char/hw_random/virtio-rng.ko\n"
	}
	checks := []struct {
		name  string
		check func(r cpio.Record) string // returns a complaint or ""
	}{
		{"init", func(r cpio.Record) string {
			if r.Mode != cpio.S_IFREG|0o755 {
				return "mode not 0755 regular"
			}
			return ""
		}},
		{"bin/sh", func(r cpio.Record) string {
			if r.Mode&cpio.S_IFMT != cpio.S_IFLNK || content(t, r) != "busybox" {
				return "not a symlink to busybox"
			}
			return ""
		}},
		{"bin/busybox", func(r cpio.Record) string { return "" }},
		{"etc/nether/modules", func(r cpio.Record) string {
			if got := content(t, r); got != wantList {
				return "content " + got
			}
			return ""
		}},
		{"etc/nether/modules.net", func(r cpio.Record) string {
			if got := content(t, r); got != wantNetList {
				return "content " + got
			}
			return ""
		}},
		{"etc/nether/modules.disk", func(r cpio.Record) string {
			if got := content(t, r); got != wantDiskList {
				return "content " + got
			}
			return ""
		}},
		{"etc/nether/modules.ext4", func(r cpio.Record) string {
			if got := content(t, r); got != wantExt4List {
				return "content " + got
			}
			return ""
		}},
		{modRoot + "kernel/drivers/net/virtio_net.ko", func(r cpio.Record) string {
			if content(t, r) != "\x7fELF virtio_net" {
				return "wrong content"
			}
			return ""
		}},
		{modRoot + "kernel/drivers/char/virtio_console.ko", func(r cpio.Record) string {
			if content(t, r) != "\x7fELF console" {
				return "wrong content"
			}
			return ""
		}},
		{"tmp", func(r cpio.Record) string {
			if r.Mode != cpio.S_IFDIR|0o1777 {
				return "not 1777"
			}
			return ""
		}},
		{"home/nether", func(r cpio.Record) string {
			if r.UID != 1000 || r.GID != 1000 {
				return "not owned by 1000:1000"
			}
			return ""
		}},
		{"dev/console", func(r cpio.Record) string {
			if r.Mode&cpio.S_IFMT != cpio.S_IFCHR || r.Rmajor != 5 || r.Rminor != 1 {
				return "not char 5:1"
			}
			return ""
		}},
		{"etc/passwd", func(r cpio.Record) string {
			if !strings.Contains(content(t, r), "nether:x:1000:1000:nether:/home/nether:/bin/sh") {
				return "no nether user"
			}
			return ""
		}},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			r, ok := recs[c.name]
			if !ok {
				t.Fatalf("%s missing from the initramfs", c.name)
			}
			if r.MTime != 0 {
				t.Errorf("mtime %d, want 0", r.MTime)
			}
			if msg := c.check(r); msg != "" {
				t.Error(msg)
			}
		})
	}
	if len(mA.RootModules) == 3 {
		if r, ok := recs[modRoot+"kernel/drivers/char/hw_random/virtio-rng.ko"]; !ok || content(t, r) != "\x7fELF rng" {
			t.Error("xz module not stored decompressed as .ko")
		}
	}
	if len(mA.BuiltinModules) != 1 || mA.BuiltinModules[0] != "vmgenid" {
		t.Errorf("builtin = %q, want [vmgenid]", mA.BuiltinModules)
	}

	t.Run("rebuild skipped when inputs unchanged", func(t *testing.T) {
		m, err := Build(opts(outA))
		if err != nil {
			t.Fatal(err)
		}
		if !m.Reused || m.SHA256.Initramfs != mA.SHA256.Initramfs || len(m.Modules) != len(mA.Modules) {
			t.Fatalf("Reused=%v, sums %s vs %s", m.Reused, m.SHA256.Initramfs, mA.SHA256.Initramfs)
		}
	})
	t.Run("damaged output rebuilt", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(outA, InitramfsFile), []byte("junk"), 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := Build(opts(outA))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := os.ReadFile(filepath.Join(outA, InitramfsFile))
		if m.Reused || !bytes.Equal(got, a) {
			t.Fatalf("Reused=%v, initramfs restored=%v", m.Reused, bytes.Equal(got, a))
		}
	})
}

func TestBuildErrors(t *testing.T) {
	bb := staticBusybox(t)
	k := fakeKernel(t)
	dynamic := "/bin/ls" // coreutils is always dynamically linked on Debian
	tests := []struct {
		name    string
		opts    BuildOptions
		wantErr string
	}{
		{"dynamic busybox", BuildOptions{Kernel: k, Agent: bb, Busybox: dynamic, Out: t.TempDir()},
			"busybox at /bin/ls is dynamically linked; install busybox-static"},
		{"dynamic agent", BuildOptions{Kernel: k, Agent: dynamic, Busybox: bb, Out: t.TempDir()},
			"agent at /bin/ls is dynamically linked"},
		{"missing agent", BuildOptions{Kernel: k, Agent: "/nonexistent/agent", Busybox: bb, Out: t.TempDir()},
			"agent binary /nonexistent/agent does not exist"},
		{"unknown module", BuildOptions{Kernel: k, Agent: bb, Busybox: bb, Modules: []string{"nope"}, Out: t.TempDir()},
			"nope is neither in modules.dep nor in modules.builtin"},
		{"unknown network module", BuildOptions{Kernel: k, Agent: bb, Busybox: bb, Modules: []string{"virtio_console"}, NetModules: []string{"e1000"}, Out: t.TempDir()},
			"network modules: module e1000 is neither in modules.dep nor in modules.builtin"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Build(tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := Build(BuildOptions{Agent: bb}); err == nil || errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Build without kernel: err = %v", err)
	}
}
