// Command nether-guest builds the guest's images. build fetches Debian's
// generic kernel into a cache and writes vmlinux, vmlinuz, initramfs.cpio and
// manifest.json; rootfs builds the default guest's Debian root file system
// image, rootfs.img, and its manifest rootfs.json.
//
//	nether-guest build --agent bin/nether-agent [--cache ~/.cache/nether/kernel] --out build/guest [--busybox /bin/busybox]
//	nether-guest rootfs [--cache ~/.cache/nether/rootfs] [--out build/guest] [--format erofs|squashfs|ext4] [--packages a,b,c]
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
	"strings"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/rootimage"
)

const usage = `usage: nether-guest build --agent PATH [--cache DIR] [--out DIR] [--busybox PATH] [--modules a,b,c] [-v]
       nether-guest rootfs [--cache DIR] [--out DIR] [--format erofs|squashfs|ext4] [--packages a,b,c] [-v]
`

func main() {
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"build":  build,
		"rootfs": rootfs,
	}
	if len(os.Args) < 2 || cmds[os.Args[1]] == nil {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmds[os.Args[1]](ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "nether-guest: %v\n", err)
		os.Exit(1)
	}
}

func build(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	agent := fs.String("agent", "", "static agent binary, becomes /init (required)")
	cache := fs.String("cache", guestimage.DefaultCacheDir(), "kernel package cache directory (outside the work tree, shared by every clone)")
	out := fs.String("out", "build/guest", "output directory")
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
	out := fs.String("out", "build/guest", "output directory")
	format := fs.String("format", string(rootimage.DefaultFormat), "file system: erofs, squashfs or ext4")
	packages := fs.String("packages", "", "comma-separated Debian packages to install besides "+strings.Join(rootimage.DefaultPackages, ","))
	verbose := fs.Bool("v", false, "debug logging, and mmdebstrap's and mkfs's output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	f, err := rootimage.ParseFormat(*format)
	if err != nil {
		return err
	}
	recipe, err := rootimage.NewRecipe("", "", f, strings.Split(*packages, ","))
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	tools := rootimage.ExecTools{}
	if *verbose {
		level = slog.LevelDebug
		tools.Output = stderr
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

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
