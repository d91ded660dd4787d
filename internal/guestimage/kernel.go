// Package guestimage fetches Debian's generic kernel and builds the guest's
// boot artefacts: an uncompressed vmlinux (booted through PVH), the bzImage,
// and a deterministic newc initramfs whose /init is the nether agent.
package guestimage

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// MetaPackage is the Debian metapackage that names the current generic kernel.
const MetaPackage = "linux-image-amd64"

// Kernel is an extracted Debian kernel package.
type Kernel struct {
	Version        string // uname -r, e.g. 6.1.0-28-amd64
	Package        string // e.g. linux-image-6.1.0-28-amd64
	PackageVersion string // Debian version, e.g. 6.1.119-1
	Vmlinuz        string // bzImage path
	Vmlinux        string // uncompressed ELF kernel, extracted from Vmlinuz
	ModulesDir     string // .../lib/modules/<Version>
	// PVH reports whether Vmlinux carries the Xen PHYS32_ENTRY note, i.e.
	// whether QEMU can boot it directly with -kernel.
	PVH bool
}

// DefaultCacheDir is where downloaded kernel packages are kept: outside
// any work tree, so every clone and every CI run on a machine reuses them
// ($NETHER_CACHE/kernel, else $XDG_CACHE_HOME/nether/kernel, else
// ~/.cache/nether/kernel). Entries are keyed by the package's name and
// version, and apt checks each .deb against its archive's digests.
func DefaultCacheDir() string {
	if d := os.Getenv("NETHER_CACHE"); d != "" {
		return filepath.Join(d, "kernel")
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "nether", "kernel")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "nether", "kernel")
	}
	return filepath.Join(os.TempDir(), "nether-cache", "kernel")
}

// FetchKernel makes sure the kernel package that linux-image-amd64 currently
// depends on is downloaded and extracted under cacheDir, and returns it. It
// never installs anything: the package is only unpacked with dpkg-deb.
// When the .deb and its extraction are already there it only asks apt which
// package is current (no network).
func FetchKernel(ctx context.Context, cacheDir string, log *slog.Logger) (*Kernel, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cacheDir, err := filepath.Abs(cacheDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, err
	}
	for _, tool := range []string{"apt-cache", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: fetching the kernel needs a Debian host with apt and dpkg", tool)
		}
	}

	pkg, ver, err := cachedKernelPackage(ctx, cacheDir)
	if err != nil {
		// Fresh machines (and containers) often have no apt lists at all.
		log.Info("apt metadata lacks the kernel package; running apt-get update", "err", err)
		if out, uerr := run(ctx, "", "apt-get", "update"); uerr != nil {
			return nil, fmt.Errorf("apt-get update: %v: %s", uerr, lastLines(out, 5))
		}
		if pkg, ver, err = cachedKernelPackage(ctx, cacheDir); err != nil {
			return nil, err
		}
	}

	k := &Kernel{Package: pkg, PackageVersion: ver, Version: strings.TrimPrefix(pkg, "linux-image-")}
	deb := filepath.Join(cacheDir, fmt.Sprintf("%s_%s_amd64.deb", pkg, strings.ReplaceAll(ver, ":", "%3a")))
	root := filepath.Join(cacheDir, pkg+"_"+ver)

	if _, err := os.Stat(deb); errors.Is(err, os.ErrNotExist) {
		if err := downloadDeb(ctx, cacheDir, pkg, ver, deb, log); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}

	// The extraction dir appears only by rename after it is complete, so its
	// presence means it is usable.
	if _, err := os.Stat(root); errors.Is(err, os.ErrNotExist) {
		if err := extractDeb(ctx, deb, root, k.Version, log); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}

	k.ModulesDir = filepath.Join(root, "lib", "modules", k.Version)
	if _, err := os.Stat(k.ModulesDir); err != nil {
		return nil, fmt.Errorf("%s has no modules for %s: %w", pkg, k.Version, err)
	}
	k.Vmlinuz = filepath.Join(root, "boot", "vmlinuz-"+k.Version)
	if _, err := os.Stat(k.Vmlinuz); err != nil {
		return nil, fmt.Errorf("%s has no kernel image: %w", pkg, err)
	}
	k.Vmlinux = filepath.Join(root, "vmlinux")
	if _, err := os.Stat(k.Vmlinux); errors.Is(err, os.ErrNotExist) {
		log.Info("extracting vmlinux from bzImage", "vmlinuz", k.Vmlinuz)
		if err := ExtractVmlinux(ctx, k.Vmlinuz, k.Vmlinux); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	entry, ok, err := PVHEntry(k.Vmlinux)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.Vmlinux, err)
	}
	k.PVH = ok
	if ok {
		log.Debug("vmlinux has a PVH entry point", "entry", fmt.Sprintf("%#x", entry))
	} else {
		log.Warn("vmlinux has no Xen PVH note (XEN_ELFNOTE_PHYS32_ENTRY): QEMU cannot boot it with -kernel; boot the bzImage instead", "vmlinux", k.Vmlinux)
	}
	return k, nil
}

// currentKernelPackage asks apt which versioned kernel package the
// metapackage depends on, and its version. The metapackage pins it exactly
// ("Depends: linux-image-6.1.0-NN-amd64 (= 6.1.x-y)"), so one apt-cache call
// answers both.
func currentKernelPackage(ctx context.Context) (pkg, ver string, err error) {
	out, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", MetaPackage)
	if err != nil {
		return "", "", fmt.Errorf("apt-cache show %s: %v: %s", MetaPackage, err, lastLines(out, 3))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		deps, ok := strings.CutPrefix(sc.Text(), "Depends: ")
		if !ok {
			continue
		}
		for _, d := range strings.Split(deps, ",") {
			name, rest, _ := strings.Cut(strings.TrimSpace(d), " ")
			if !strings.HasPrefix(name, "linux-image-") {
				continue
			}
			if v, ok := strings.CutPrefix(strings.TrimSpace(rest), "(= "); ok {
				return name, strings.TrimSuffix(v, ")"), nil
			}
			// Not pinned: ask for the package's own candidate version.
			out, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", name)
			if err != nil {
				return "", "", fmt.Errorf("apt-cache show %s: %v: %s", name, err, lastLines(out, 3))
			}
			for l := range strings.SplitSeq(string(out), "\n") {
				if v, ok := strings.CutPrefix(l, "Version: "); ok {
					return name, strings.TrimSpace(v), nil
				}
			}
			return "", "", fmt.Errorf("apt-cache show %s gives no version", name)
		}
	}
	return "", "", fmt.Errorf("apt-cache show %s names no linux-image-* dependency", MetaPackage)
}

// aptListsDir is where apt keeps its package lists; their names, sizes and
// mtimes change exactly when apt's answer can change.
const aptListsDir = "/var/lib/apt/lists"

// resolvedFile caches the last answer of currentKernelPackage in cacheDir.
// apt-cache takes 3-8 s per call on hosts whose apt config disables
// pkgcache.bin (Docker's docker-clean does), which would make every
// "already built" run slow.
const resolvedFile = "resolved.json"

type resolved struct {
	Lists   string `json:"apt_lists"`
	Package string `json:"package"`
	Version string `json:"version"`
}

func aptListsFingerprint() string {
	ents, err := os.ReadDir(aptListsDir)
	if err != nil {
		return ""
	}
	h := sha256.New()
	n := 0
	for _, e := range ents {
		if !e.Type().IsRegular() || e.Name() == "lock" {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return ""
		}
		fmt.Fprintf(h, "%s %d %d\n", e.Name(), fi.Size(), fi.ModTime().UnixNano())
		n++
	}
	if n == 0 {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}

// cachedKernelPackage returns currentKernelPackage's answer, from
// cacheDir/resolved.json while apt's lists are unchanged.
func cachedKernelPackage(ctx context.Context, cacheDir string) (pkg, ver string, err error) {
	fp := aptListsFingerprint()
	var r resolved
	if b, err := os.ReadFile(filepath.Join(cacheDir, resolvedFile)); err == nil && json.Unmarshal(b, &r) == nil &&
		fp != "" && r.Lists == fp && r.Package != "" && r.Version != "" {
		return r.Package, r.Version, nil
	}
	if pkg, ver, err = currentKernelPackage(ctx); err != nil {
		return "", "", err
	}
	if fp != "" {
		b, _ := json.Marshal(resolved{Lists: fp, Package: pkg, Version: ver})
		_ = writeFileAtomic(filepath.Join(cacheDir, resolvedFile), b, 0o644)
	}
	return pkg, ver, nil
}

// downloadDeb runs apt-get download in a private temp dir under cacheDir and
// renames the .deb into place, so an interrupted download leaves no
// half-written file that a later run would trust.
func downloadDeb(ctx context.Context, cacheDir, pkg, ver, deb string, log *slog.Logger) error {
	tmp, err := os.MkdirTemp(cacheDir, ".download-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	// apt drops privileges to _apt for downloads; let it write here.
	_ = os.Chmod(tmp, 0o777)
	log.Info("downloading kernel package", "package", pkg, "version", ver)
	if out, err := run(ctx, tmp, "apt-get", "download", pkg+"="+ver); err != nil {
		return fmt.Errorf("apt-get download %s=%s: %v: %s", pkg, ver, err, lastLines(out, 5))
	}
	got, err := filepath.Glob(filepath.Join(tmp, pkg+"_*.deb"))
	if err != nil || len(got) != 1 {
		return fmt.Errorf("apt-get download %s left %d .deb files in %s", pkg, len(got), tmp)
	}
	return os.Rename(got[0], deb)
}

// extractDeb unpacks deb into root (via a temp dir and rename) and makes sure
// the module tree has modules.dep: Debian generates it at install time, so
// the package doesn't ship it.
func extractDeb(ctx context.Context, deb, root, version string, log *slog.Logger) error {
	tmp, err := os.MkdirTemp(filepath.Dir(root), ".extract-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	log.Info("extracting kernel package", "deb", filepath.Base(deb))
	if out, err := run(ctx, "", "dpkg-deb", "-x", deb, tmp); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %v: %s", deb, err, lastLines(out, 5))
	}
	modDir := filepath.Join(tmp, "lib", "modules", version)
	if _, err := os.Stat(filepath.Join(modDir, "modules.dep")); errors.Is(err, os.ErrNotExist) {
		depmod, err := lookTool("depmod")
		if err != nil {
			return errors.New("depmod not found (needed to index the kernel's modules); install kmod")
		}
		// -b: operate on the extracted tree only, never the host's modules.
		if out, err := run(ctx, "", depmod, "-b", tmp, version); err != nil {
			return fmt.Errorf("depmod -b %s %s: %v: %s", tmp, version, err, lastLines(out, 5))
		}
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	return os.Rename(tmp, root)
}

// lookTool finds an admin tool that may live in an sbin dir missing from a
// non-root PATH.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// run runs a command with LC_ALL=C (we parse apt's output) and returns its
// combined output.
func run(ctx context.Context, dir, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
