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
		put := timed(c, "__put__ big.bin /tmp/big.bin")
		get := timed(c, "__get__ /tmp/big.bin back.bin")
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

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/channel:", err)
	harness.StopAll()
	os.Exit(1)
}
