// nether supervises one sandbox: it reads nether.conf from the directory
// it is started in, boots the guest and serves its control socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/engine/qemu"
	"github.com/nethersandbox/nether/internal/guestimage"
	"github.com/nethersandbox/nether/internal/session"
	"github.com/nethersandbox/nether/internal/snapshot"
)

const usage = `nether: run one Linux sandbox.

Usage: cd <launch-dir> && nether [-log-level debug|info|warn|error]

nether reads nether.conf from the current directory (the launch
directory), boots a guest under QEMU and, with control_socket set,
serves the control protocol (v2) on that Unix socket. The launch
directory is also the transfer jail: host paths given to __put__ and
__get__ resolve beneath it and nowhere else. The serial console is
written to console.log there.

Without control_socket, nether runs in console mode: the guest's
console is on stdout, stdin goes to a shell in the guest, and nether
stops when the guest powers off (type exit, or send end-of-file).

Every stop ends with one line on stdout:
  [nether] final usage (reason=...): uptime_ms=... cpu_ms=... ...
(with x402=on: "[nether] x402 settlement (reason=...)").

nether.conf keys (key = value, # comments):
  control_socket    path of the control socket (enables control mode)
  cpus              vCPUs (default 1)
  ram_mb            guest RAM in MiB (default 512)
  max_output_bytes  per-command output cap, 0 = unlimited (default 1048576)
  max_transfer_bytes  largest __put__/__get__, 0 = unlimited (default 1 GiB)
  console_log_max_bytes  bound of console.log, 0 = unlimited (default 4 MiB)
  max_runtime_s, max_cpu_s, idle_timeout_s
                    budgets in seconds (0 = off): wall clock, guest CPU
                    time, no client and no command for that long
  x402              on|off: settlement framing of the final record (default off)
  accel             auto|kvm|tcg (default auto: KVM only on a CPU with vmx/svm)
  kernel, image     guest kernel and initramfs (default: what setup built)
  rootfs            the guest's root image: a path, or busybox for the
                    initramfs alone (default: the Debian image setup built)
  run_as            run every command and transfer as this guest user
                    (default root); a fork may narrow it, never widen it
  disk              persistent disk at /data: a host file, created and
                    formatted ext4 if absent, locked while the sandbox runs;
                    in a fork, where its own copy-on-write layer goes
                    (default disk.qcow2 in the launch directory)
  disk_size_mb      size of a new disk, 8-1048576 (default 64); an existing
                    one must be at least this large
  sandbox_id        1-128 printable ASCII bytes, no spaces (default: minted)
  hostname          guest hostname, one DNS label (default: minted)
  gpu               0|1: a display for __frame__/__framediff__ (default 0)
  net               0|1: eth0 behind nether's NAT and firewall (default 0)
  net_open          0|1: turn the firewall's default deny off (default 0)
  net_allow, net_block
                    comma-separated CIDR lists let through / always blocked:
                    net_allow = 10.0.0.0/8, 192.168.0.0/16
  net_rate_kbps     download cap in kbit/s, 0 = unlimited (default 0)
  app_port, data_socket
                    the data plane: each connection to data_socket (0600)
                    reaches the tenant's server on the guest's
                    127.0.0.1:app_port
  egress_port, egress_socket
                    the egress plane: each tenant connection to the
                    guest's 127.0.0.1:egress_port makes nether dial the
                    platform's egress_socket, writing first
                    "NETHER-EGRESS v1 conn=<id> resume=<0|1>"
  max_data_conns    data and egress connections at once, 1-48 (default 48)
  data_idle_ms      reap a data connection idle both ways, 0 = off (default 0)
  data_rate_kbps    guest -> platform cap in kbit/s, 0 = unlimited (default 0)

Snapshots (control mode): __snapshot__ [path] captures a base into the
launch directory and keeps running; __park__ [path] captures a one-shot
park and exits. A new nether restores either from its own directory:
  restore = 1
  restore_from = /absolute/path/of/the/artifact
  control_socket = ...
  snapshot_allow_dirty  snapshot or park with a command in flight (0)
  park_dirty        park even with bytes a plane holds undelivered (0)
  fork_reseed       new vmgenid generation per restore, so the guest
                    reseeds its CRNG (default 1)
Warm pools (control mode): __claim__ <sandbox_id> <hostname> hands a
restored fork to a user, once: the id and hostname handed in, a fresh
machine-id and session epoch, and a CRNG reseed (fork_reseed or not);
OK claimed <sandbox_id> <hostname>, or ERR claim: <why> for a boot, a
woken park, a second claim, a restore not finished or a command running.
validate_snapshot = <path> checks an artifact without booting and exits:
0 with a one-line summary (kind=base or kind=park), 1 with the problem.

Exit status: 0 after a clean stop (shutdown, guest power-off, SIGTERM,
park, a budget), 1 when the engine or a restore failed or the guest
crashed (reason=guest_panic, guest_crash), 2 for a bad configuration.

Environment: NETHER_GUEST_DIR overrides where the default guest image is
looked up (default: ../build/guest next to the nether binary).
NETHER_CACHE/verified (default ~/.cache/nether/verified) records the
snapshots a restore verified in full, so a restore of one unchanged
since is not read again; validate_snapshot always reads everything.
`

func main() {
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	level := flag.String("log-level", "info", "log level on stderr: debug, info, warn or error")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "nether: unexpected argument %q; nether takes its settings from nether.conf (see nether -help)\n", flag.Arg(0))
		os.Exit(2)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "nether: -log-level %q: want debug, info, warn or error\n", *level)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))

	dir, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nether: finding the launch directory: %v\n", err)
		os.Exit(2)
	}
	cfg, err := conf.Load(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nether: %v\n", err)
		os.Exit(2)
	}
	// The one place that picks an engine: everything else talks to the
	// engine seam.
	eng := qemu.New(log)
	if cfg.ValidateSnapshot != "" {
		os.Exit(validate(cfg, eng))
	}
	for _, l := range cfg.Report() {
		log.Debug("config", "setting", l)
	}
	secrets, err := readSecrets(cfg.SecretsFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nether: secrets_fd = %d: %v\n", cfg.SecretsFD, err)
		os.Exit(2)
	}
	os.Exit(session.Run(session.Options{
		Secrets:  secrets,
		Config:   cfg,
		Engine:   eng,
		Log:      log,
		Stdout:   os.Stdout,
		Stdin:    os.Stdin,
		GuestDir: guestDir(),
		Verified: verifiedCache(log),
		// Only a build for bench/observe turns observation off.
		Unobserved: unobserved,
	}))
}

// validate checks an artifact against this build and configuration
// without booting anything: exit 0 and a one-line summary, or exit 1 and
// the first problem found.
func validate(cfg *conf.Config, eng *qemu.Engine) int {
	summary, err := session.Validate(context.Background(), cfg, eng, guestDir())
	if err != nil {
		fmt.Fprintf(os.Stderr, "nether: validate_snapshot: %v\n", err)
		return 1
	}
	fmt.Println(summary)
	return 0
}

// verifiedCache is where restores remember the artifacts they verified
// in full; without a cache directory every restore verifies in full.
func verifiedCache(log *slog.Logger) *snapshot.VerifiedCache {
	dir, err := snapshot.DefaultVerifiedCacheDir()
	if err != nil {
		log.Warn("no cache directory: every restore verifies its snapshot in full", "err", err)
		return nil
	}
	return &snapshot.VerifiedCache{Dir: dir, Log: log}
}

func guestDir() string {
	exe, _ := os.Executable()
	return guestimage.Dir(exe)
}

// readSecrets reads the sandbox's secrets from the descriptor the
// orchestrator handed nether (0: none) and closes it: they live in this
// process's memory and the guest's, never in a file.
func readSecrets(fd int) (agentproto.Secrets, error) {
	if fd == 0 {
		return nil, nil
	}
	f := os.NewFile(uintptr(fd), "secrets")
	if f == nil {
		return nil, fmt.Errorf("not an open descriptor")
	}
	defer f.Close()
	if _, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("not an open descriptor: %w", err)
	}
	return agentproto.ReadSecrets(f)
}
