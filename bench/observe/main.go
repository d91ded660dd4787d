// Command observe measures what observation costs: the round trip of
// `true` through a nether that keeps the event timeline and the command
// log (bin/nether) against one built without them (-tags
// nether_unobserved), both booted in this run and driven call by call in
// turn so the machine's noise falls on both alike; then the latency of
// __events__, __cmdlog__, __screen__ and, with gpu = 1, __frame__.
//
//	go run ./bench/observe [-n 300] [-rounds 6]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

func main() {
	n := flag.Int("n", 300, "round trips of `true` per sandbox per round")
	rounds := flag.Int("rounds", 6, "rounds of n calls (interleaved call by call)")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()

	tmp, err := os.MkdirTemp("", "nether-bench-observe-")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(tmp)
	if err := testharness.Build(repo, tmp, []string{"-tags", "nether_unobserved"}, "./cmd/nether"); err != nil {
		fail(err)
	}
	on, onC := boot(repo, filepath.Join(repo, "bin", "nether"), "gpu = 1")
	defer on.Close()
	off, offC := boot(repo, filepath.Join(tmp, "nether"), "gpu = 1")
	defer off.Close()

	// Both have the same machine (gpu = 1 included); only observation
	// differs. The calls interleave one by one, each pair in alternating
	// order, so the machine's noise (two TCG guests and this process on
	// two cores) falls on both alike rather than on their ratio.
	var onD, offD []time.Duration
	for i := range *n * *rounds {
		if i%2 == 0 {
			offD = append(offD, roundTrips(offC, "true", 1)...)
			onD = append(onD, roundTrips(onC, "true", 1)...)
		} else {
			onD = append(onD, roundTrips(onC, "true", 1)...)
			offD = append(offD, roundTrips(offC, "true", 1)...)
		}
	}
	onD, offD = harness.Sorted(onD), harness.Sorted(offD)
	p50on, p50off := harness.Percentile(onD, 50), harness.Percentile(offD, 50)
	fmt.Printf("round trip of `true`, %d calls each, interleaved:\n", len(onD))
	fmt.Printf("  without observation (baseline): p50 %s  p99 %s\n", us(p50off), us(harness.Percentile(offD, 99)))
	fmt.Printf("  with timeline + command log:    p50 %s  p99 %s\n", us(p50on), us(harness.Percentile(onD, 99)))
	fmt.Printf("  cost: %+.1f%% at p50 (target <= 5%%)\n", 100*(float64(p50on)/float64(p50off)-1))

	fmt.Printf("\nlatency of the observe commands (sandbox with %d commands logged), 50 calls each:\n", len(onD)+1)
	for _, line := range []string{"__stats__", "__events__", "__cmdlog__", "__screen__", "__screendiff__", "__frame__", "__framediff__"} {
		d := harness.Sorted(roundTrips(onC, line, 50))
		fmt.Printf("  %-15s p50 %s  p99 %s\n", line, us(harness.Percentile(d, 50)), us(harness.Percentile(d, 99)))
	}
}

func boot(repo, bin, conf string) (*testharness.Sandbox, *client.Client) {
	sb, err := harness.StartBin(repo, bin, conf)
	if err != nil {
		fail(err)
	}
	c, err := sb.Dial(60 * time.Second)
	if err != nil {
		fail(err)
	}
	if err := harness.Run(c, "true"); err != nil {
		fail(err)
	}
	return sb, c
}

// roundTrips times n calls of line; a reply that fails ends the run.
func roundTrips(c *client.Client, line string, n int) []time.Duration {
	d := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := c.Run(context.Background(), line, io.Discard); err != nil {
			fail(fmt.Errorf("%s: %w", line, err))
		}
		d = append(d, time.Since(t0))
	}
	return d
}

func us(d time.Duration) string { return fmt.Sprintf("%7.0f µs", float64(d)/1e3) }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/observe:", err)
	harness.StopAll()
	os.Exit(1)
}
