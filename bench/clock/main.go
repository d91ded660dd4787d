// Command clock measures the guest's wall clock against the host's after
// each kind of restore, at the first command and then for -minutes:
//
//   - a fork of a base captured -age before;
//   - the wake of a park that lay for -age;
//   - the claim of a fork restored -age before.
//
// Each offset is read with `date +%s.%N` in the guest against the midpoint
// of the command's round trip on the host, measured in the same exchange:
// the round trip (printed beside each offset) bounds the reading's error
// at half of it.
//
//	go run ./bench/clock [-age 20s] [-minutes 10] [-every 30s]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

func main() {
	age := flag.Duration("age", 20*time.Second, "how old the base, the park and the pool member are when restored or claimed")
	minutes := flag.Int("minutes", 10, "how long the three sandboxes run on, sampled")
	every := flag.Duration("every", 30*time.Second, "sampling interval")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()

	base, err := harness.Start(repo, "ram_mb = 256\n")
	check(err)
	defer base.Close()
	bc, err := base.Dial(60 * time.Second)
	check(err)
	check(harness.Run(bc, "true"))
	_, err = harness.Exec(bc, "__snapshot__ base")
	check(err)
	art := filepath.Join(base.Dir, "base")
	time.Sleep(*age)

	type watched struct {
		name string
		sb   *testharness.Sandbox
		c    *client.Client
	}
	var all []watched
	restore := func(name, from string) watched {
		sb, err := harness.Start(repo, "ram_mb = 256\nrestore = 1\nrestore_from = "+from+"\n")
		check(err)
		c, err := sb.Dial(60 * time.Second)
		if err != nil {
			check(fmt.Errorf("%s: %w\n%s", name, err, sb.Stderr.String()))
		}
		return watched{name, sb, c}
	}

	fork := restore("fork", art)
	report(fork.name+", first command", fork.c)
	all = append(all, fork)

	parked := restore("parked", art)
	check(harness.Run(parked.c, "true"))
	_, err = harness.Exec(parked.c, "__park__ p")
	check(err)
	parked.sb.Wait(30 * time.Second)
	keep, err := os.MkdirTemp("", "nether-bench-clock-")
	check(err)
	defer os.RemoveAll(keep)
	parkPath := filepath.Join(keep, "p")
	check(os.Rename(filepath.Join(parked.sb.Dir, "p"), parkPath))
	parked.sb.Close()
	member := restore("claimed", art)
	check(harness.Run(member.c, "true"))
	time.Sleep(*age)
	wake := restore("woken", parkPath)
	report(wake.name+", first command", wake.c)
	all = append(all, wake)
	_, err = harness.Exec(member.c, "__claim__ clock-user clock-host")
	check(err)
	report(member.name+", first command", member.c)
	all = append(all, member)

	worst := map[string]time.Duration{}
	end := time.Now().Add(time.Duration(*minutes) * time.Minute)
	for time.Now().Before(end) {
		time.Sleep(*every)
		for _, w := range all {
			off, _ := offset(w.c)
			if abs(off) > abs(worst[w.name]) {
				worst[w.name] = off
			}
		}
	}
	for _, w := range all {
		off, rtt := offset(w.c)
		fmt.Printf("%-8s after %d min: guest - host %7.1f ms (round trip %.1f ms); the worst sample %7.1f ms (target within 1 s)\n",
			w.name, *minutes, ms(off), ms(rtt), ms(worst[w.name]))
		w.c.Close()
		w.sb.Close()
	}
}

// report prints one offset reading.
func report(what string, c *client.Client) {
	off, rtt := offset(c)
	fmt.Printf("%-24s guest - host %7.1f ms (round trip %.1f ms; target within 1 s)\n", what, ms(off), ms(rtt))
}

// offset is the guest's wall clock less the host's at the midpoint of the
// command's round trip, and that round trip.
func offset(c *client.Client) (time.Duration, time.Duration) {
	h0 := time.Now()
	out, err := harness.Exec(c, "date +%s.%N")
	h1 := time.Now()
	check(err)
	g, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	check(err)
	mid := h0.Add(h1.Sub(h0) / 2)
	return time.Unix(0, int64(g*1e9)).Sub(mid), h1.Sub(h0)
}

func abs(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func check(err error) {
	if err != nil {
		_, file, line, _ := runtime.Caller(1)
		fmt.Fprintf(os.Stderr, "bench/clock: %s:%d: %v\n", filepath.Base(file), line, err)
		harness.StopAll()
		os.Exit(1)
	}
}
