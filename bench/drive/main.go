// Command drive measures a running sandbox: the round trip of `true`
// through the control socket (p50, p99) against the round trip of
// `__stats__` (answered by nether without the guest) in the same run, and
// __put__/__get__ throughput of a 64 MiB file.
//
//	go run ./bench/drive [-n 200] [-mib 64]
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
)

func main() {
	n := flag.Int("n", 200, "round trips")
	mib := flag.Int("mib", 64, "transfer size in MiB")
	flag.Parse()
	repo := harness.Repo()
	sb, err := harness.Start(repo, "")
	if err != nil {
		fail(err)
	}
	defer sb.Close()
	c, err := sb.Dial(30 * time.Second)
	if err != nil {
		fail(err)
	}
	defer c.Close()
	if err := harness.Run(c, "true"); err != nil {
		fail(err)
	}
	rt := func(line string) []time.Duration {
		var d []time.Duration
		for i := 0; i < *n; i++ {
			t0 := time.Now()
			if _, err := c.Run(context.Background(), line, nil); err != nil {
				fail(err)
			}
			d = append(d, time.Since(t0))
		}
		return harness.Sorted(d)
	}
	stats, cmd := rt("__stats__"), rt("true")
	fmt.Printf("round trip over %d calls:\n", *n)
	fmt.Printf("  __stats__ (nether only):        p50 %s  p99 %s\n", us(harness.Percentile(stats, 50)), us(harness.Percentile(stats, 99)))
	fmt.Printf("  true (through the guest agent): p50 %s  p99 %s\n", us(harness.Percentile(cmd, 50)), us(harness.Percentile(cmd, 99)))

	size := int64(*mib) << 20
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(sb.Dir, "big.bin"), data, 0o600); err != nil {
		fail(err)
	}
	put := timed(c, "__put__ big.bin /tmp/big.bin")
	get := timed(c, "__get__ /tmp/big.bin back.bin")
	// The same bytes through a plain shell pipeline inside the guest, as a
	// same-run yardstick for what the emulated CPU can move.
	local := timed(c, "cat /tmp/big.bin > /tmp/copy.bin")
	fmt.Printf("\ntransfer of %d MiB:\n", *mib)
	fmt.Printf("  __put__ %6.1f MiB/s (%s)\n", mibps(size, put), harness.MS(put))
	fmt.Printf("  __get__ %6.1f MiB/s (%s)\n", mibps(size, get), harness.MS(get))
	fmt.Printf("  in-guest cat of the same file: %6.1f MiB/s (%s)\n", mibps(size, local), harness.MS(local))
}

func timed(c *client.Client, line string) time.Duration {
	t0 := time.Now()
	if err := harness.Run(c, line); err != nil {
		fail(fmt.Errorf("%s: %w", line, err))
	}
	return time.Since(t0)
}

func us(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/drive:", err)
	harness.StopAll()
	os.Exit(1)
}
