package rootimage

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// Output file names, in a cache entry and in the output directory alike.
const (
	ImageFile    = "rootfs.img"
	ManifestFile = "rootfs.json"
)

// Defaults of a Recipe.
const (
	DefaultSuite  = "bookworm"
	DefaultMirror = "http://deb.debian.org/debian"
	DefaultFormat = FormatErofs
)

// builderVersion is part of every cache key: bump it whenever Build changes
// an image in a way the recipe's arguments do not show (finishTree's edits),
// so an entry built by an older builder is not reused.
const builderVersion = 1

// DefaultPackages are installed on top of mmdebstrap's minbase variant.
// python3's sqlite3 module comes with libpython3.11-stdlib, a dependency.
// busybox (Debian's, 1 MiB) supplies the small tools minbase leaves out
// (wget, nc, netstat, httpd, ...): see busyboxHook.
var DefaultPackages = []string{
	"bash", "busybox", "ca-certificates", "coreutils", "curl", "e2fsprogs",
	"iproute2", "less", "procps", "python3", "sqlite3",
}

// busyboxHook links each busybox applet that no Debian package of the
// image provides into /usr/local/bin, so a sandbox has wget, nc, httpd and
// the like as commands, while every tool Debian does ship stays Debian's
// (a link never shadows one). It does nothing in an image without busybox.
const busyboxHook = `--customize-hook=chroot "$1" /bin/sh -c '` +
	`command -v busybox >/dev/null || exit 0; ` +
	`for a in $(busybox --list); do ` +
	`for d in /usr/sbin /usr/bin /sbin /bin; do [ -e "$d/$a" ] && continue 2; done; ` +
	`ln -s /usr/bin/busybox "/usr/local/bin/$a"; done'`

// Format is the file system of the image.
type Format string

// The formats Build can write.
const (
	FormatErofs    Format = "erofs"
	FormatSquashfs Format = "squashfs"
	FormatExt4     Format = "ext4"
)

// Formats lists every Format, the default first.
var Formats = []Format{FormatErofs, FormatSquashfs, FormatExt4}

// ParseFormat returns the Format named s.
func ParseFormat(s string) (Format, error) {
	if i := slices.Index(Formats, Format(s)); i >= 0 {
		return Formats[i], nil
	}
	names := make([]string, len(Formats))
	for i, f := range Formats {
		names[i] = string(f)
	}
	return "", fmt.Errorf("unknown root image format %q (want one of %s)", s, strings.Join(names, ", "))
}

// imageEpoch is the time recorded as the file system's creation time, so
// that it does not differ from build to build. Files keep their own mtimes:
// python's .pyc files are checked against their source's mtime, and a
// clamped mtime would make every import recompile.
const imageEpoch = 1700000000

// imageUUID is the file system UUID of every image, for the same reason;
// the guest finds its root by device, never by UUID.
const imageUUID = "6e657468-6572-4072-6f6f-746673000001"

// mkfsOptions are the options of each format's mkfs, without the paths (and,
// for ext4, without the size, which follows from the tree).
var mkfsOptions = map[Format][]string{
	// Uncompressed: under TCG the guest pays for every decompressed byte in
	// emulated instructions, and cold imports were fastest without it (see
	// the package comment).
	FormatErofs:    {"mkfs.erofs", "-U" + imageUUID},
	FormatSquashfs: {"mksquashfs", "-noappend", "-comp", "zstd", "-b", "131072", "-mkfs-time", fmt.Sprint(imageEpoch), "-quiet", "-no-progress"},
	FormatExt4: {"mkfs.ext4", "-F", "-q", "-t", "ext4", "-b", "4096", "-m", "0", "-O", "^has_journal",
		"-L", "nether-root", "-U", imageUUID, "-E", "hash_seed=" + imageUUID + ",lazy_itable_init=0,nodiscard"},
}

// bootstrapOptions are mmdebstrap's options before its positional
// arguments (suite, target, mirror). The paths under /usr/share/mmdebstrap
// are mmdebstrap's own hooks, from its Debian package.
func bootstrapOptions(packages []string) []string {
	return []string{
		"--mode=root",
		"--format=directory",
		"--variant=minbase",
		// Without it apt picks usrmerge (and perl with it, 40 MB) to
		// satisfy init-system-helpers; the hook merges /usr itself and
		// installs the empty usr-is-merged instead.
		"--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
		"--include=" + strings.Join(packages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/info/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		// Keep the licences: they are small and are the terms the
		// binaries are distributed under.
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-include=/usr/share/locale/locale.alias",
		"--dpkgopt=path-exclude=/usr/share/lintian/*",
		`--customize-hook=chroot "$1" groupadd --gid 1000 nether`,
		`--customize-hook=chroot "$1" useradd --create-home --uid 1000 --gid 1000 --shell /bin/bash nether`,
		busyboxHook,
	}
}

// Recipe is everything that determines an image. Build it with NewRecipe.
type Recipe struct {
	Suite    string
	Mirror   string
	Format   Format
	Packages []string // sorted, without duplicates, DefaultPackages included
}

// debName is Debian policy's package name syntax (5.6.1). Checking it keeps
// a name from being read as an option or splitting mmdebstrap's list.
var debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// NewRecipe returns the recipe of an image of suite from mirror in format,
// with DefaultPackages plus extra. Empty suite and mirror mean the defaults.
func NewRecipe(suite, mirror string, format Format, extra []string) (Recipe, error) {
	if suite == "" {
		suite = DefaultSuite
	}
	if mirror == "" {
		mirror = DefaultMirror
	}
	if _, err := ParseFormat(string(format)); err != nil {
		return Recipe{}, err
	}
	if !debName.MatchString(suite) {
		return Recipe{}, fmt.Errorf("suite %q is not a Debian suite name", suite)
	}
	if !strings.HasPrefix(mirror, "http://") && !strings.HasPrefix(mirror, "https://") {
		return Recipe{}, fmt.Errorf("mirror %q is not an http(s) URL", mirror)
	}
	pkgs := slices.Clone(DefaultPackages)
	for _, p := range extra {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !debName.MatchString(p) {
			return Recipe{}, fmt.Errorf("package %q is not a Debian package name", p)
		}
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	return Recipe{Suite: suite, Mirror: mirror, Format: format, Packages: slices.Compact(pkgs)}, nil
}

// BootstrapArgs returns mmdebstrap's arguments for building the userland
// into tree.
func (r Recipe) BootstrapArgs(tree string) []string {
	return append(bootstrapOptions(r.Packages), r.Suite, tree, r.Mirror)
}

// Key names the recipe's cache entry: the SHA-256 of everything that goes
// into the image, so two recipes share an entry only when they would build
// the same thing.
func (r Recipe) Key() string {
	in := struct {
		Builder   int      `json:"builder"`
		Suite     string   `json:"suite"`
		Mirror    string   `json:"mirror"`
		Packages  []string `json:"packages"`
		Format    Format   `json:"format"`
		Bootstrap []string `json:"bootstrap"`
		Mkfs      []string `json:"mkfs"`
	}{builderVersion, r.Suite, r.Mirror, r.Packages, r.Format, bootstrapOptions(r.Packages), mkfsOptions[r.Format]}
	b, err := json.Marshal(in)
	if err != nil {
		panic(err) // strings and ints always marshal
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// DefaultCacheDir is where images are cached when no directory is given:
// outside any work tree, so every clone on the machine shares them, beside
// guestimage's kernel cache.
func DefaultCacheDir() string {
	if d := os.Getenv("NETHER_CACHE"); d != "" {
		return filepath.Join(d, "rootfs")
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "nether", "rootfs")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "nether", "rootfs")
	}
	return filepath.Join(os.TempDir(), "nether-cache", "rootfs")
}
