// Command channel measures the channel's throughput (every host<->guest
// byte rides it) against what the guest itself can move, in the same run:
// __put__ of a random file into the guest, __get__ of it back, and an
// in-guest `cat` of the very file the put created.
//
// The file lives in the guest's root file system, the initramfs in RAM
// (rootfs), so every cat reads it from the page cache and never touches a
// disk; it is read once, untimed, before the cats are timed all the same.
// Three cats are timed, because busybox's cat moves a file with
// sendfile(2) and what that costs depends on the output:
//
//   - cat f > /dev/null: the pages are spliced to /dev/null, which drops
//     them unread; no byte is copied, so this is no yardstick for moving
//     bytes, only the ceiling of a command that reads nothing.
//   - cat f > /tmp/copy: every byte is copied once, into a new file in RAM:
//     what a put has to do with the bytes at the end.
//   - cat f | cat > /dev/null: every byte is copied into a process
//     through a pipe: what a get has to do with them at the start.
//
// The put is set against `cat > copy`, the get against `cat | cat`.
// Each figure is one timed command through the control socket, so each
// includes one command round trip (printed too: milliseconds against
// hundreds).
//
//	go run ./bench/channel [-mib 64] [-rounds 1] [-root DIR]
//
// -root takes bin/nether and build/guest from DIR instead of the
// repository, to compare another build against this one.
package main

import (
	"bytes"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
)

func main() {
	mib := flag.Int("mib", 64, "transfer size in MiB")
	rounds := flag.Int("rounds", 1, "times to repeat put, get and cat in the one sandbox")
	root := flag.String("root", "", "take bin/nether and build/guest from this directory instead of the repository")
	flag.Parse()
	repo := harness.Repo()
	if *root != "" {
		repo = *root
	}
	sb, err := harness.StartBin(repo, filepath.Join(repo, "bin", "nether"), "")
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
	rt := timed(c, "true")

	size := int64(*mib) << 20
	data := make([]byte, size)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(sb.Dir, "big.bin"), data, 0o600); err != nil {
		fail(err)
	}
	fmt.Printf("transfer of %d MiB (one command round trip: %s):\n", *mib, harness.MS(rt))
	for r := 0; r < *rounds; r++ {
		os.Remove(filepath.Join(sb.Dir, "back.bin"))
		// The put writes a new file, as the cat below writes into a
		// removed copy.bin: with the last round's file still there the
		// put needed 64 MiB more of the guest's memory than the cat did,
		// and its rounds after the first measured that (0.42-0.53x where
		// the first round, equal on this, measured 0.77x).
		timed(c, "rm -f /tmp/big.bin")
		before := guestCPU(c)
		put := timed(c, "__put__ big.bin /tmp/big.bin")
		mid := guestCPU(c)
		get := timed(c, "__get__ /tmp/big.bin back.bin")
		after := guestCPU(c)
		back, err := os.ReadFile(filepath.Join(sb.Dir, "back.bin"))
		if err != nil {
			fail(err)
		}
		if !bytes.Equal(back, data) {
			fail(fmt.Errorf("the file that came back differs from the one sent"))
		}
		// The same bytes, from the same file, moved by the guest alone.
		timed(c, "cat /tmp/big.bin > /dev/null")
		null := mibps(size, timed(c, "cat /tmp/big.bin > /dev/null"))
		timed(c, "rm -f /tmp/copy.bin")
		copied := mibps(size, timed(c, "cat /tmp/big.bin > /tmp/copy.bin"))
		timed(c, "rm -f /tmp/copy.bin")
		piped := mibps(size, timed(c, "cat /tmp/big.bin | cat > /dev/null"))
		fmt.Printf("  __put__ %6.1f MiB/s (%s): %.2fx `cat f > /tmp/copy`, %.2fx `cat f > /dev/null`\n",
			mibps(size, put), harness.MS(put), mibps(size, put)/copied, mibps(size, put)/null)
		fmt.Printf("  __get__ %6.1f MiB/s (%s): %.2fx `cat f | cat > /dev/null`, %.2fx `cat f > /dev/null`\n",
			mibps(size, get), harness.MS(get), mibps(size, get)/piped, mibps(size, get)/null)
		fmt.Printf("  guest CPU during __put__: %s\n  guest CPU during __get__: %s\n", mid.since(before), after.since(mid))
		fmt.Printf("  in the guest: cat f > /tmp/copy %.1f MiB/s, cat f | cat > /dev/null %.1f MiB/s, cat f > /dev/null %.1f MiB/s\n",
			copied, piped, null)
	}
}

func timed(c *client.Client, line string) time.Duration {
	t0 := time.Now()
	if err := harness.Run(c, line); err != nil {
		fail(fmt.Errorf("%s: %w", line, err))
	}
	return time.Since(t0)
}

// cpuTimes are the guest's CPU counters from /proc/stat (all CPUs, in
// clock ticks) and the agent's own user and system time, so a transfer's
// figure comes with where the guest spent it: a busy guest CPU points at
// work per byte, an idle one at waiting (round trips, credit).
type cpuTimes struct {
	user, sys, irq, softirq, idle, agentUser, agentSys float64
}

func guestCPU(c *client.Client) cpuTimes {
	out, err := harness.Exec(c, "head -1 /proc/stat; cut -d' ' -f14,15 /proc/1/stat")
	if err != nil {
		fail(fmt.Errorf("reading the guest's CPU counters: %w", err))
	}
	var t cpuTimes
	var nice, iowait float64
	if _, err := fmt.Sscanf(out, "cpu %g %g %g %g %g %g %g", &t.user, &nice, &t.sys, &t.idle, &iowait, &t.irq, &t.softirq); err != nil {
		fail(fmt.Errorf("parsing the guest's /proc/stat %q: %w", out, err))
	}
	t.user += nice
	t.idle += iowait
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if _, err := fmt.Sscanf(lines[len(lines)-1], "%g %g", &t.agentUser, &t.agentSys); err != nil {
		fail(fmt.Errorf("parsing the agent's /proc/1/stat %q: %w", out, err))
	}
	return t
}

// since is the share of the guest's CPU time each kind took between b and t.
func (t cpuTimes) since(b cpuTimes) string {
	user, sys, irq, soft, idle := t.user-b.user, t.sys-b.sys, t.irq-b.irq, t.softirq-b.softirq, t.idle-b.idle
	all := user + sys + irq + soft + idle
	if all == 0 {
		return "no ticks counted"
	}
	pct := func(x float64) float64 { return 100 * x / all }
	return fmt.Sprintf("user %.0f%%, system %.0f%%, irq %.0f%%, softirq %.0f%%, idle %.0f%% (the agent: user %.0f%%, system %.0f%%)",
		pct(user), pct(sys), pct(irq), pct(soft), pct(idle), pct(t.agentUser-b.agentUser), pct(t.agentSys-b.agentSys))
}

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/channel:", err)
	harness.StopAll()
	os.Exit(1)
}
