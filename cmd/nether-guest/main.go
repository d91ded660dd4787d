// Command nether-guest builds the guest's images. build fetches Debian's
// generic kernel into a cache and writes vmlinux, vmlinuz, initramfs.cpio and
// manifest.json; rootfs builds the default guest's Debian root file system
// image, rootfs.img, and its manifest rootfs.json; import makes a root
// image from a root file system tarball or an OCI image instead.
//
//	nether-guest build --agent bin/nether-agent [--cache ~/.cache/nether/kernel] --out build/guest [--busybox /bin/busybox]
//	nether-guest rootfs [--cache ~/.cache/nether/rootfs] --out build/guest [--format erofs|squashfs|ext4] [--packages a,b,c]
//	nether-guest import (--tar FILE | --oci-layout DIR | --docker-archive FILE | --image REF) --out DIR [--format erofs|squashfs|ext4] [--name NAME] [--max-size 8G]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/rootimage"
)

const usage = `usage: nether-guest build --agent PATH [--cache DIR] --out DIR [--busybox PATH] [--modules a,b,c] [-v]
       nether-guest rootfs [--cache DIR] --out DIR [--format erofs|squashfs|ext4] [--packages a,b,c] [-v]
       nether-guest import (--tar FILE | --oci-layout DIR | --docker-archive FILE | --image REF)
                           --out DIR [--format erofs|squashfs|ext4] [--name NAME] [--max-size SIZE] [-v]

Each writes into --out; rootfs and import write rootfs.img and its manifest
rootfs.json, which nether.conf selects with rootfs = DIR/rootfs.img.
nether-guest COMMAND -h describes a command's flags.
`

const importUsage = `usage: nether-guest import SOURCE --out DIR [--format erofs|squashfs|ext4] [--name NAME] [--max-size SIZE] [-v]

Makes a guest root image from another system's root file system, writing
DIR/rootfs.img and DIR/rootfs.json (boot it with rootfs = DIR/rootfs.img in
nether.conf). SOURCE is one of:

  --tar FILE             a root file system tarball (docker export, podman export,
                         tar -C ROOT -c .), plain or gzip, zstd, xz or bzip2 compressed
  --oci-layout DIR       an OCI image layout directory (skopeo copy ... oci:DIR)
  --docker-archive FILE  a docker save / podman save archive of one image
  --image REF            an image in a registry (debian:12, ghcr.io/o/i@sha256:...),
                         with docker login's credentials if any

An OCI image's layers are flattened in order with their whiteouts applied;
from an index the linux/amd64 image is taken. The image keeps its own
users, owners and modes (run as root to keep owners); device nodes are left
out; mount points, /tmp and /etc/hosts are made as the guest needs them.
It must have a /bin/sh for x86-64: the guest runs every command with it.

Every blob of an OCI image (index, manifest, config, layer) is checked
against its digest as it is read, and each layer's tar stream against its
config's diff ID; a manifest that is no image's (a Helm chart) is refused.
Metadata files are read up to 4 MiB. --max-size bounds the bytes the
import writes (every file's declared size, summed over the layers; the
uncompressed tar streams are bounded at twice it).

An archive entry that is absolute, has a .. component, is a link out of the
root or would be written through a symlink, a whiteout naming no file or
one outside its directory, an image for another platform, one without
/bin/sh, a blob that is not what its digest names, an import past its
bound and a truncated archive are refused, naming the cause; nothing is
written to DIR then.

Flags:
`

func main() {
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"build":  build,
		"rootfs": rootfs,
		"import": importImage,
	}
	if len(os.Args) == 2 && (os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help") {
		fmt.Print(usage)
		return
	}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmds[os.Args[1]](ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // the flag set printed it
		}
		fmt.Fprintf(os.Stderr, "nether-guest: %v\n", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agent := fs.String("agent", "", "static agent binary, becomes /init (required)")
	cache := fs.String("cache", guestimage.DefaultCacheDir(), "kernel package cache directory (outside the work tree, shared by every clone)")
	out := fs.String("out", "", "output directory (required; scripts/setup.sh gives build/guest)")
	busybox := fs.String("busybox", guestimage.DefaultBusybox, "statically linked busybox")
	modules := fs.String("modules", strings.Join(guestimage.DefaultModules, ","), "comma-separated root kernel modules")
	verbose := fs.Bool("v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *agent == "" {
		return errors.New("--agent is required (build it with CGO_ENABLED=0 go build -o bin/nether-agent ./cmd/nether-agent)")
	}
	if *out == "" {
		return errors.New("--out is required: the directory for the kernel and initramfs (scripts/setup.sh gives build/guest)")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	start := time.Now()
	k, err := guestimage.FetchKernel(ctx, *cache, log)
	if err != nil {
		return fmt.Errorf("fetching kernel: %w", err)
	}
	var roots []string
	for _, m := range strings.Split(*modules, ",") {
		if m = strings.TrimSpace(m); m != "" {
			roots = append(roots, m)
		}
	}
	m, err := guestimage.Build(guestimage.BuildOptions{
		Kernel: k, Agent: *agent, Busybox: *busybox, Modules: roots, Out: *out,
	})
	if err != nil {
		return fmt.Errorf("building image: %w", err)
	}
	if len(m.BuiltinModules) > 0 {
		log.Info("built into the kernel, not loaded", "modules", m.BuiltinModules)
	}
	state := "built"
	if m.Reused {
		state = "up to date"
	}
	pvh := "vmlinux boots via PVH"
	if !m.PVH {
		pvh = "vmlinux has NO PVH note, boot vmlinuz"
	}
	fmt.Fprintf(stdout, "guest image %s in %s: kernel %s (%s %s), initramfs %.1f MiB, %d modules, %s (%.2fs)\n",
		state, *out, m.KernelVersion, m.KernelPackage, m.KernelPackageVersion,
		float64(m.InitramfsSize)/(1<<20), len(m.Modules), pvh, time.Since(start).Seconds())
	return nil
}

func rootfs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rootfs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cache := fs.String("cache", rootimage.DefaultCacheDir(), "image cache directory (outside the work tree, shared by every clone)")
	out := fs.String("out", "", "output directory (required; scripts/setup.sh gives build/guest): rootfs.img and rootfs.json go there")
	format := fs.String("format", string(rootimage.DefaultFormat), "file system: erofs, squashfs or ext4")
	packages := fs.String("packages", "", "comma-separated Debian packages to install besides "+strings.Join(rootimage.DefaultPackages, ","))
	verbose := fs.Bool("v", false, "debug logging, and mmdebstrap's and mkfs's output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if *out == "" {
		// Never a default: one relative to where it runs would replace
		// a checkout's default image when run inside it.
		return errors.New("--out is required: the directory for rootfs.img and rootfs.json (scripts/setup.sh gives build/guest)")
	}
	f, err := rootimage.ParseFormat(*format)
	if err != nil {
		return err
	}
	recipe, err := rootimage.NewRecipe("", "", f, strings.Split(*packages, ","))
	if err != nil {
		return err
	}
	tools, log := imageTools(*verbose, stderr)

	start := time.Now()
	res, err := rootimage.Build(ctx, rootimage.Options{Recipe: recipe, Cache: *cache, Out: *out, Log: log, Tools: tools})
	if err != nil {
		return fmt.Errorf("building the root image: %w", err)
	}
	m := res.Manifest
	fmt.Fprintf(stdout, "root image %s in %s: %s, %.1f MiB, %s, %d packages, cache %s (%.2fs",
		res.State, *out, m.Format, float64(m.Bytes)/(1<<20), m.Suite, len(m.Packages), res.Entry, time.Since(start).Seconds())
	if res.State == rootimage.StateBuilt {
		fmt.Fprintf(stdout, "; mmdebstrap %.1fs, mkfs %.1fs", res.Bootstrap.Seconds(), res.MakeFS.Seconds())
	}
	fmt.Fprintln(stdout, ")")
	return nil
}

func importImage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("import", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, importUsage)
		fs.PrintDefaults()
	}
	tarFile := fs.String("tar", "", "root file system tarball")
	layoutDir := fs.String("oci-layout", "", "OCI image layout directory")
	archive := fs.String("docker-archive", "", "docker save / podman save archive")
	ref := fs.String("image", "", "registry image reference")
	out := fs.String("out", "", "output directory (required): rootfs.img and rootfs.json go there")
	format := fs.String("format", string(rootimage.DefaultFormat), "file system: erofs, squashfs or ext4")
	name := fs.String("name", "", "the image's name in its manifest (default: the source's)")
	maxSize := sizeFlag(rootimage.DefaultMaxSize)
	fs.Var(&maxSize, "max-size", "the most the import may write: the sizes of its files, summed over the layers (bytes, or with K, M, G, T)")
	verbose := fs.Bool("v", false, "debug logging, and mkfs's output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var srcs []rootimage.Source
	for _, c := range []struct {
		kind rootimage.SourceKind
		val  string
	}{
		{rootimage.SourceTar, *tarFile}, {rootimage.SourceOCILayout, *layoutDir},
		{rootimage.SourceDockerArchive, *archive}, {rootimage.SourceImage, *ref},
	} {
		if c.val == "" {
			continue
		}
		s := rootimage.Source{Kind: c.kind, Path: c.val}
		if c.kind == rootimage.SourceImage {
			s = rootimage.Source{Kind: c.kind, Ref: c.val}
		}
		srcs = append(srcs, s)
	}
	if len(srcs) != 1 {
		return errors.New("give exactly one of --tar, --oci-layout, --docker-archive and --image")
	}
	if *out == "" {
		return errors.New("--out is required: the directory for rootfs.img and rootfs.json")
	}
	f, err := rootimage.ParseFormat(*format)
	if err != nil {
		return err
	}
	tools, log := imageTools(*verbose, stderr)

	start := time.Now()
	res, err := rootimage.Import(ctx, rootimage.ImportOptions{Source: srcs[0], Out: *out, Format: f, Name: *name, Log: log, Tools: tools, MaxSize: int64(maxSize)})
	if err != nil {
		return fmt.Errorf("importing %s: %w", srcs[0], err)
	}
	m, st := res.Manifest, res.Stats
	fmt.Fprintf(stdout, "root image %q imported into %s: %s, %.1f MiB, %s, %d entries from %d layer(s)",
		m.Name, *out, m.Format, float64(m.Bytes)/(1<<20), m.Platform, st.Entries, res.Layers)
	if st.Whiteouts > 0 {
		fmt.Fprintf(stdout, ", %d whiteouts", st.Whiteouts)
	}
	if st.Devices > 0 {
		fmt.Fprintf(stdout, ", %d device nodes left out", st.Devices)
	}
	fmt.Fprintf(stdout, " (extract %.1fs, mkfs %.1fs, %.2fs)\nboot it with rootfs = %s\n", res.Extract.Seconds(), res.MakeFS.Seconds(), time.Since(start).Seconds(), res.Image)
	return nil
}

// sizeFlag is a byte count: 8G, 512M, 1.5G, 4096; K, M, G and T are
// binary (KiB, MiB, ...), with or without "iB" or "B".
type sizeFlag int64

func (s *sizeFlag) String() string { return strconv.FormatInt(int64(*s), 10) }

func (s *sizeFlag) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(v string) (int64, error) {
	num := strings.TrimSpace(v)
	upper := strings.ToUpper(num)
	shift := 0
	for _, suf := range []string{"IB", "B"} {
		if strings.HasSuffix(upper, suf) && len(upper) > len(suf) {
			upper = strings.TrimSuffix(upper, suf)
			break
		}
	}
	if i := strings.IndexAny(upper, "KMGT"); i >= 0 && i == len(upper)-1 {
		shift = 10 * (1 + strings.IndexByte("KMGT", upper[i]))
		upper = upper[:i]
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(upper), 64)
	if err != nil || f <= 0 || f != f {
		return 0, fmt.Errorf("size %q is not a positive number of bytes, K, M, G or T", v)
	}
	n := f * float64(int64(1)<<shift)
	if n >= 1<<62 || n < 1 {
		return 0, fmt.Errorf("size %q is out of range", v)
	}
	return int64(n), nil
}

// imageTools are the image builders' tools and logger: with -v, debug
// logging and the tools' own output on stderr.
func imageTools(verbose bool, stderr io.Writer) (rootimage.ExecTools, *slog.Logger) {
	level := slog.LevelInfo
	tools := rootimage.ExecTools{}
	if verbose {
		level = slog.LevelDebug
		tools.Output = stderr
	}
	return tools, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}
