// Command disk measures what a persistent disk costs a sandbox: fork to
// first command of a base with a 1 GiB disk holding 100 MiB against the
// same base without a disk (alternating, same run), the host disk bytes
// each fork adds, what the capture of such a base costs, SQLite commits
// per second on the synchronous /data against the guest's tmpfs, and
// python3's start in a fresh boot and in a fork.
//
//	go run ./bench/disk [-n 5]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

func main() {
	n := flag.Int("n", 5, "forks of each base")
	fillMiB := flag.Int("fill", 100, "MiB the base writes (to /data with a disk, to /tmp without)")
	rows := flag.Int("rows", 200, "SQLite commits, one row each")
	flag.Parse()
	repo := harness.Repo()
	keep, err := os.MkdirTemp("", "nether-bench-disk-")
	check(err)
	defer os.RemoveAll(keep)

	// The two bases: the same guest, one with a 1 GiB disk.
	withDisk, coldBoot, pyFresh, capture := makeBase(repo, keep, "disk", fmt.Sprintf("disk = %s\ndisk_size_mb = 1024\n", filepath.Join(keep, "data.img")), "/data", *fillMiB)
	without, _, _, _ := makeBase(repo, keep, "nodisk", "", "/tmp", *fillMiB)
	fmt.Printf("cold boot to first command: %s; python3 -c pass as the first command after it: %s\n", harness.MS(coldBoot), harness.MS(pyFresh))
	fmt.Printf("__snapshot__ of the base with a 1 GiB disk holding %d MiB: %s\n", *fillMiB, capture)
	st, _ := os.Stat(filepath.Join(withDisk, "disk"))
	fmt.Printf("  its disk layer: %s allocated (%s apparent) for a 1024 MiB disk\n\n", harness.MiB(allocated(filepath.Join(withDisk, "disk"))), harness.MiB(st.Size()))

	var a, b []time.Duration
	var layers []int64
	var pyFork time.Duration
	for i := 0; i < *n; i++ {
		d, layer, py := fork(repo, withDisk, i == 0)
		a, layers = append(a, d), append(layers, layer)
		if i == 0 {
			pyFork = py
		}
		d, _, _ = fork(repo, without, false)
		b = append(b, d)
		fmt.Printf("run %d: fork with disk %s (layer %s on the host), without %s\n", i+1, harness.MS(a[i]), kib(layer), harness.MS(b[i]))
	}
	// The first fork of each base verifies the artifact in full; the
	// later ones find it unchanged since (snapshot.VerifiedCache) and
	// skip reading it: both are what a platform sees, so both are shown.
	fmt.Printf("\nfirst fork of each base (a full verification of the artifact): with disk %s, without %s (%.2f)\n",
		harness.MS(a[0]), harness.MS(b[0]), float64(a[0])/float64(b[0]))
	if *n > 1 {
		a, b = a[1:], b[1:]
	}
	am, bm := harness.Percentile(harness.Sorted(a), 50), harness.Percentile(harness.Sorted(b), 50)
	fmt.Printf("fork -> first command, median of the %d later forks (the artifact unchanged since it was verified):\n", len(a))
	fmt.Printf("  base with a 1 GiB disk holding %d MiB: %s\n", *fillMiB, harness.MS(am))
	fmt.Printf("  the same base without a disk:          %s\n", harness.MS(bm))
	fmt.Printf("  ratio with/without: %.2f (target <= 1.10)\n", float64(am)/float64(bm))
	var maxLayer int64
	for _, l := range layers {
		maxLayer = max(maxLayer, l)
	}
	fmt.Printf("  host disk bytes per fork (its layer after the first command): max %s (target <= 1 MiB plus what it writes)\n", kib(maxLayer))
	fmt.Printf("python3 -c pass as a fork's first command: %s (fresh boot: %s)\n\n", harness.MS(pyFork), harness.MS(pyFresh))

	// SQLite: commits of one row each, on the synchronous disk and on
	// tmpfs, in one fork of the disk base.
	sb, c := start(repo, "restore = 1\nrestore_from = "+withDisk+"\n")
	defer sb.Close()
	onDisk := sqliteRate(c, "/data/bench.db", *rows)
	onTmp := sqliteRate(c, "/tmp/bench.db", *rows)
	fmt.Printf("SQLite, %d commits of one row each (python3 sqlite3, default journal):\n", *rows)
	fmt.Printf("  /data (ext4, mounted sync, flushed to the host file): %.0f commits/s\n", onDisk)
	fmt.Printf("  /tmp (the guest's tmpfs):                              %.0f commits/s\n", onTmp)
	fmt.Printf("  ratio disk/tmpfs: %.2f\n", onDisk/onTmp)
}

// makeBase boots a guest with conf, fills dir with fill MiB, captures it
// and moves the artifact to keep.
func makeBase(repo, keep, name, conf, dir string, fill int) (art string, cold, py time.Duration, capture string) {
	sb, c := start(repo, conf)
	defer sb.Close()
	check(harness.Run(c, "true"))
	cold = time.Since(sb.Started)
	py = timed(c, "python3 -c pass")
	check(harness.Run(c, fmt.Sprintf("head -c %d /dev/urandom > %s/fill && sync", fill<<20, dir)))
	body, err := harness.Exec(c, "__snapshot__ base")
	check(err)
	art = filepath.Join(keep, name)
	check(os.Rename(filepath.Join(sb.Dir, "base"), art))
	return art, cold, py, strings.TrimSpace(body)
}

// fork restores art and returns process start to first command, the
// allocated size of its disk layer then, and (if py) how long python3's
// start takes as the next command.
func fork(repo, art string, py bool) (time.Duration, int64, time.Duration) {
	sb, c := start(repo, "restore = 1\nrestore_from = "+art+"\n")
	defer sb.Close()
	check(harness.Run(c, "true"))
	d := time.Since(sb.Started)
	layer := allocated(filepath.Join(sb.Dir, "disk.qcow2"))
	var p time.Duration
	if py {
		p = timed(c, "python3 -c pass")
	}
	return d, layer, p
}

func start(repo, conf string) (*testharness.Sandbox, *client.Client) {
	sb, err := harness.Start(repo, conf)
	check(err)
	c, err := sb.Dial(60 * time.Second)
	check(err)
	return sb, c
}

func timed(c *client.Client, line string) time.Duration {
	start := time.Now()
	check(harness.Run(c, line))
	return time.Since(start)
}

// sqliteRate is commits per second, timed inside the guest.
func sqliteRate(c *client.Client, db string, rows int) float64 {
	// One line (the control protocol carries no newline): the loop is
	// exec'd from a string.
	out, err := harness.Exec(c, fmt.Sprintf(`python3 -c 'import sqlite3, time; con = sqlite3.connect("%s"); `+
		`q = "insert into t values (?)"; con.execute("create table t(x)"); con.commit(); t0 = time.monotonic(); `+
		`exec("for i in range(%d):\n con.execute(q, (i,)); con.commit()"); print(%d / (time.monotonic() - t0))'`, db, rows, rows))
	check(err)
	r, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	check(err)
	return r
}

func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

func kib(n int64) string { return fmt.Sprintf("%d KiB", n>>10) }

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/disk:", err)
		harness.StopAll()
		os.Exit(1)
	}
}
