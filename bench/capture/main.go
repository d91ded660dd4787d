// Command capture measures captures as issue 12 asks, each against a
// baseline taken in the same run:
//
//   - the pause of five back-to-back __snapshot__ captures of a 512 MiB
//     guest with 100 MiB written, with 1 MiB and then 50 MiB written
//     before each, against `cp --sparse=always` of the artifact's RAM
//     file (the touched RAM the capture copied) right after it;
//   - __snapshot__ and __park__ of a fork against the same of its base;
//   - wake of the fork's park -> first command against wake of the
//     base's park -> first command;
//   - the bytes on disk of each artifact.
//
// A capture copies the bulk of the guest's memory while the guest runs
// and pauses it only for what changed since (internal/engine/qemu's
// capture_linux.go), so each line also gives the whole command's time:
// the pause is what the guest notices, the whole is what the caller
// waits for.
//
//	go run ./bench/capture [-fill 100]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/client"
)

var pauseRE = regexp.MustCompile(`pause_ms=(\d+)`)

func main() {
	fillMiB := flag.Int("fill", 100, "MiB the base guest writes before its first capture")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()

	base, err := harness.Start(repo, "ram_mb = 512\n")
	check(err)
	defer base.Close()
	c, err := base.Dial(60 * time.Second)
	check(err)
	check(harness.Run(c, fmt.Sprintf("yes nether-benchmark-fill | head -c %d > /tmp/fill", *fillMiB<<20)))

	n := 0
	var whole time.Duration // the last capture's command, start to reply
	capture := func(c *client.Client, dir, verb string) (pause time.Duration, art string) {
		n++
		name := fmt.Sprintf("cap%d", n)
		t := time.Now()
		body, err := harness.Exec(c, verb+" "+name)
		whole = time.Since(t)
		check(err)
		m := pauseRE.FindStringSubmatch(body)
		if m == nil {
			fail(fmt.Errorf("%s: no pause_ms in %q", verb, body))
		}
		ms, _ := strconv.Atoi(m[1])
		return time.Duration(ms) * time.Millisecond, filepath.Join(dir, name)
	}
	// cpRAM copies an artifact's RAM file as a user would copy the same
	// bytes, and says how long it took (false when it has none: a
	// stream). cpPart copies the file's first MiB only (dd), the
	// baseline for what changed since the previous capture.
	cpRAM := func(art string) (time.Duration, bool) {
		ram := filepath.Join(art, "ram")
		if _, err := os.Stat(ram); err != nil {
			return 0, false
		}
		dst := filepath.Join(os.TempDir(), "nether-bench-cp-ram")
		os.Remove(dst)
		syscall.Sync()
		t := time.Now()
		if out, err := exec.Command("cp", "--sparse=always", ram, dst).CombinedOutput(); err != nil {
			fail(fmt.Errorf("cp: %v: %s", err, out))
		}
		d := time.Since(t)
		os.Remove(dst)
		return d, true
	}
	cpPart := func(art string, mib int) time.Duration {
		dst := filepath.Join(os.TempDir(), "nether-bench-cp-part")
		os.Remove(dst)
		syscall.Sync()
		t := time.Now()
		if out, err := exec.Command("dd", "if="+filepath.Join(art, "ram"), "of="+dst, "bs=1M", fmt.Sprintf("count=%d", mib), "conv=sparse", "status=none").CombinedOutput(); err != nil {
			fail(fmt.Errorf("dd: %v: %s", err, out))
		}
		d := time.Since(t)
		os.Remove(dst)
		return d
	}

	series := func(title string, writeMiB int) {
		fmt.Printf("%s\n", title)
		for i := 0; i < 5; i++ {
			if i > 0 || writeMiB > 0 {
				// The same file each time: the bytes written change
				// that much RAM without the guest's tmpfs filling.
				check(harness.Run(c, fmt.Sprintf("head -c %d /dev/urandom > /tmp/w%d", writeMiB<<20, writeMiB)))
			}
			pause, art := capture(c, base.Dir, "__snapshot__")
			cp, ok := cpRAM(art)
			line := fmt.Sprintf("  capture %d: pause %s (command %s), artifact %s on disk", i+1, harness.MS(pause), harness.MS(whole), harness.MiB(diskBytes(art)))
			if ok {
				line += fmt.Sprintf("; cp --sparse=always of its RAM %s (%.2fx)", harness.MS(cp), float64(pause)/float64(cp))
				if writeMiB > 1 {
					part := cpPart(art, writeMiB)
					line += fmt.Sprintf("; copying %d MiB %s (%.2fx)", writeMiB, harness.MS(part), float64(pause)/float64(part))
				}
			}
			fmt.Println(line)
			os.RemoveAll(art)
		}
	}
	series(fmt.Sprintf("__snapshot__ of a 512 MiB guest with %d MiB written, five back to back, 1 MiB written before each (targets: <= 50 ms; the fifth within 1.2x of the second):", *fillMiB), 1)
	series("the same with 50 MiB written before each (target: <= 1.2x copying those 50 MiB):", 50)

	// A base artifact to fork, and the fork's own captures.
	_, baseArt := capture(c, base.Dir, "__snapshot__")
	basePause, _ := capture(c, base.Dir, "__snapshot__")
	fork, err := harness.Start(repo, "ram_mb = 512\nrestore = 1\nrestore_from = "+baseArt+"\n")
	check(err)
	defer fork.Close()
	fc, err := fork.Dial(60 * time.Second)
	check(err)
	check(harness.Run(fc, "head -c 1048576 /dev/urandom > /tmp/forkw"))
	check(harness.Run(c, "head -c 1048576 /dev/urandom > /tmp/basew"))
	forkPause, forkArt := capture(fc, fork.Dir, "__snapshot__")
	forkWhole := whole
	basePause2, baseArt2 := capture(c, base.Dir, "__snapshot__")
	fmt.Printf("\n__snapshot__ of a fork (1 MiB written since its restore) against its base (1 MiB written), target <= 1.2x:\n")
	fmt.Printf("  fork: pause %s (command %s), artifact %s; base: pause %s (command %s; before: %s), artifact %s (%.2fx)\n",
		harness.MS(forkPause), harness.MS(forkWhole), harness.MiB(diskBytes(forkArt)), harness.MS(basePause2), harness.MS(whole), harness.MS(basePause), harness.MiB(diskBytes(baseArt2)),
		float64(forkPause)/float64(basePause2))

	forkPark, forkParkArt := capture(fc, fork.Dir, "__park__")
	forkWhole = whole
	basePark, baseParkArt := capture(c, base.Dir, "__park__")
	fmt.Printf("__park__ of the fork against its base, target <= 1.2x:\n")
	fmt.Printf("  fork: pause %s (command %s), artifact %s; base: pause %s (command %s), artifact %s (%.2fx)\n",
		harness.MS(forkPark), harness.MS(forkWhole), harness.MiB(diskBytes(forkParkArt)), harness.MS(basePark), harness.MS(whole), harness.MiB(diskBytes(baseParkArt)), float64(forkPark)/float64(basePark))
	fork.Wait(30 * time.Second)
	base.Wait(30 * time.Second)

	wake := func(art string) time.Duration {
		d, err := harness.FirstCommand(repo, "ram_mb = 512\nrestore = 1\nrestore_from = "+art+"\n")
		check(err)
		return d
	}
	// Parks are consumed by their wake: each is woken once, the base's
	// first so the fork's finds no page cache the base's warmed for it.
	wb := wake(baseParkArt)
	wf := wake(forkParkArt)
	fmt.Printf("wake -> first command of the fork's park against its base's, target <= 1.2x:\n")
	fmt.Printf("  fork's park: %s; base's park: %s (%.2fx)\n", harness.MS(wf), harness.MS(wb), float64(wf)/float64(wb))
}

// diskBytes is what an artifact holds on disk (allocated blocks: its RAM
// file is sparse).
func diskBytes(dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/capture:", err)
	harness.StopAll()
	os.Exit(1)
}
