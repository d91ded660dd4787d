// Command boot measures a cold boot to the first answered command, of the
// default Debian guest and of the busybox-only guest, against a plain QEMU
// direct-kernel boot of the same kernel to its first console line,
// alternating the three in one run.
//
//	go run ./bench/boot [-n 5]
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
)

func main() {
	n := flag.Int("n", 5, "boots of each kind")
	flag.Parse()
	repo := harness.Repo()
	guest := filepath.Join(repo, "build", "guest")
	var plain, ours, small []time.Duration
	for i := 0; i < *n; i++ {
		p, err := plainBoot(guest)
		if err != nil {
			fail(err)
		}
		o, err := netherBoot(repo, "")
		if err != nil {
			fail(err)
		}
		b, err := netherBoot(repo, "rootfs = busybox\n")
		if err != nil {
			fail(err)
		}
		plain, ours, small = append(plain, p), append(ours, o), append(small, b)
		fmt.Printf("run %d: plain qemu to first console line %s, nether (Debian) to first answered command %s, nether (busybox) %s\n",
			i+1, harness.MS(p), harness.MS(o), harness.MS(b))
	}
	ps, os_ := harness.Sorted(plain), harness.Sorted(ours)
	pm, om := harness.Percentile(ps, 50), harness.Percentile(os_, 50)
	fmt.Printf("\ncold boot, median of %d (same kernel, same machine, same run):\n", *n)
	fmt.Printf("  plain qemu-system-x86_64 -kernel vmlinuz (defaults) to first console line: %s\n", harness.MS(pm))
	bm := harness.Percentile(harness.Sorted(small), 50)
	fmt.Printf("  nether, Debian guest: process start to first command answered:             %s\n", harness.MS(om))
	fmt.Printf("  nether, busybox guest (rootfs = busybox):                                   %s\n", harness.MS(bm))
	fmt.Printf("  ratio nether (Debian)/plain: %.2f (target <= 0.60); busybox/plain: %.2f\n", float64(om)/float64(pm), float64(bm)/float64(pm))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/boot:", err)
	harness.StopAll()
	os.Exit(1)
}

// plainBoot is what a user gets from QEMU's defaults: SeaBIOS, the default
// NIC and its option ROM, the compressed bzImage.
func plainBoot(guest string) (time.Duration, error) {
	cmd := exec.Command("qemu-system-x86_64", "-accel", "tcg", "-m", "512M", "-nographic",
		"-kernel", filepath.Join(guest, "vmlinuz"), "-initrd", filepath.Join(guest, "initramfs.cpio"),
		"-append", "console=ttyS0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	r := bufio.NewReader(out)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("plain qemu: %w", err)
		}
		// SeaBIOS and iPXE print to the serial port too; the kernel's
		// first line is what we time.
		if len(line) > 2 && line[0] == '[' {
			return time.Since(start), nil
		}
	}
}

func netherBoot(repo, conf string) (time.Duration, error) { return harness.FirstCommand(repo, conf) }
