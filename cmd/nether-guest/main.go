// Command nether-guest builds the guest boot image: it fetches Debian's
// generic kernel into a cache and writes vmlinux, vmlinuz, initramfs.cpio and
// manifest.json.
//
//	nether-guest build --agent bin/nether-agent [--cache ~/.cache/nether/kernel] --out build/guest [--busybox /bin/busybox]
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
)

const usage = `usage: nether-guest build --agent PATH [--cache DIR] [--out DIR] [--busybox PATH] [--modules a,b,c] [-v]
`

func main() {
	if len(os.Args) < 2 || os.Args[1] != "build" {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := build(ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
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
