// Command fork measures snapshot, fork and park against baselines taken
// in the same run:
//
//   - fork (process start -> first command answered), p50/p95 over -n
//     forks, against QEMU's own restore of the same artifact (start,
//     -incoming with x-ignore-shared, cont) and against a cold boot;
//
//   - -fanout concurrent forks of one base: time until all answer, and the
//     host memory (sum of PSS) of the idle forks against the same number of
//     restores that copy guest memory (wakes of as many parks);
//
//   - the pause of __snapshot__ for a 512 MiB guest with ~100 MiB written;
//
//   - park -> wake -> first command.
//
//     go run ./bench/fork [-n 20] [-fanout 16]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/engine/qemu"
	"github.com/nethersandbox/nether/internal/session"
	"github.com/nethersandbox/nether/internal/snapshot"
	"github.com/nethersandbox/nether/internal/testharness"
)

var pauseRE = regexp.MustCompile(`pause_ms=(\d+)`)

func main() {
	n := flag.Int("n", 20, "sequential forks (and QEMU restores) to time")
	fanout := flag.Int("fanout", 16, "concurrent forks")
	snaps := flag.Int("snapshots", 5, "__snapshot__ pauses to time")
	fillMiB := flag.Int("fill", 100, "MiB the base guest writes before its snapshot")
	flag.Parse()
	repo := harness.Repo()

	// The base: a cold boot (timed: the cold-boot baseline), warmed with
	// written memory, then captured.
	base, err := harness.Start(repo, "ram_mb = 512\n")
	check(err)
	defer base.Close()
	c, err := base.Dial(30 * time.Second)
	check(err)
	check(harness.Run(c, "true"))
	cold := time.Since(base.Started)
	check(harness.Run(c, fmt.Sprintf("yes nether-benchmark-fill | head -c %d > /tmp/fill", *fillMiB<<20)))
	var pauses []time.Duration
	for i := 0; i < *snaps; i++ {
		body, err := harness.Exec(c, fmt.Sprintf("__snapshot__ snap%d", i))
		check(err)
		m := pauseRE.FindStringSubmatch(body)
		ms, _ := strconv.Atoi(m[1])
		pauses = append(pauses, time.Duration(ms)*time.Millisecond)
	}
	art := filepath.Join(base.Dir, "snap0")
	fmt.Printf("__snapshot__ of a 512 MiB guest with %d MiB written, %d captures:\n", *fillMiB, *snaps)
	ps := harness.Sorted(pauses)
	fmt.Printf("  pauses in order: %v\n", pauses)
	fmt.Printf("  pause first %s, p50 %s, max %s (target <= 150 ms)\n", harness.MS(pauses[0]), harness.MS(harness.Percentile(ps, 50)), harness.MS(ps[len(ps)-1]))
	fmt.Printf("  (each capture writes ~%d MiB of new page cache on the launch directory's disk; on this VM fresh page cache gets slower as more of it is touched, cp shows the same)\n\n", *fillMiB+70)

	// QEMU's own restore of the same artifact, and our forks, interleaved
	// so drift on a noisy machine hits both alike.
	var qemuTimes, replyTimes, forkTimes []time.Duration
	for i := 0; i < *n; i++ {
		q, r, err := qemuRestore(repo, art)
		check(err)
		f, err := forkOnce(repo, art)
		check(err)
		qemuTimes, replyTimes, forkTimes = append(qemuTimes, q), append(replyTimes, r), append(forkTimes, f)
	}
	qs, rs, fs := harness.Sorted(qemuTimes), harness.Sorted(replyTimes), harness.Sorted(forkTimes)
	fmt.Printf("fork from a cold process, %d each:\n", *n)
	fmt.Printf("  QEMU's own restore (start, incoming, cont):               p50 %s  p95 %s\n", harness.MS(harness.Percentile(qs, 50)), harness.MS(harness.Percentile(qs, 95)))
	fmt.Printf("  ... plus the guest's first reply (same QEMU, bare channel): p50 %s  p95 %s\n", harness.MS(harness.Percentile(rs, 50)), harness.MS(harness.Percentile(rs, 95)))
	fmt.Printf("  nether fork (process start -> first command answered):   p50 %s  p95 %s\n", harness.MS(harness.Percentile(fs, 50)), harness.MS(harness.Percentile(fs, 95)))
	fmt.Printf("  cold boot (process start -> first command):              %s\n", harness.MS(cold))
	fmt.Printf("  ratio fork / QEMU restore to cont: %.2f (target <= 1.2)\n", ratio(fs, qs))
	fmt.Printf("  ratio fork / QEMU restore + first guest reply: %.2f (what nether's process, control socket and handshake add)\n", ratio(fs, rs))
	fmt.Printf("  ratio fork / cold boot: %.2f\n", float64(harness.Percentile(fs, 50))/float64(cold))
	fmt.Printf("  fork on request (pre-started engine pool): not built yet\n\n")

	// Fan-out, then the same number of restores that copy memory: wakes
	// of parks, each its own (a park wakes once, into memory of its own).
	all, pss, err := fan(repo, repeat(art, *fanout))
	check(err)
	_, pss1, err := fan(repo, []string{art})
	check(err)
	parks, err := parkArtifacts(repo, art, *fanout)
	check(err)
	_, pssCopy, err := fan(repo, parks)
	check(err)
	fmt.Printf("%d concurrent forks of the 512 MiB base:\n", *fanout)
	fmt.Printf("  all answered after %s\n", harness.MS(all))
	fmt.Printf("  host memory of the idle forks (sum of PSS, QEMU + nether): %s; one fork alone: %s\n", harness.MiB(pss), harness.MiB(pss1))
	fmt.Printf("  marginal per additional fork: %s (target <= 64 MiB)\n", harness.MiB((pss-pss1)/int64(*fanout-1)))
	fmt.Printf("  the same number of restores that copy guest memory (wakes of parks): %s (%.1fx)\n\n", harness.MiB(pssCopy), float64(pssCopy)/float64(pss))

	// Park -> wake -> first command, repeatedly (each wake parks again).
	// The first park is of a fork (whose RAM is a private map); the
	// woken guests after it keep RAM in a shared memfd of their own.
	var wakes []time.Duration
	prev := art
	for i := 0; i < 5; i++ {
		sb, err := harness.Start(repo, "restore = 1\nrestore_from = "+prev+"\n")
		check(err)
		cc, err := sb.Dial(30 * time.Second)
		check(err)
		check(harness.Run(cc, "true"))
		if i > 0 {
			wakes = append(wakes, time.Since(sb.Started))
		}
		parkDir, err := os.MkdirTemp("", "nether-park-")
		check(err)
		_, err = harness.Exec(cc, "__park__ p")
		check(err)
		cc.Close()
		check(sb.Wait(30 * time.Second))
		// Keep the park outside the sandbox dir, which Close removes.
		check(os.Rename(filepath.Join(sb.Dir, "p"), filepath.Join(parkDir, "p")))
		sb.Close()
		prev = filepath.Join(parkDir, "p")
		defer os.RemoveAll(parkDir)
	}
	ws := harness.Sorted(wakes)
	fmt.Printf("park -> wake -> first command (%d wakes): p50 %s, max %s\n", len(ws), harness.MS(harness.Percentile(ws, 50)), harness.MS(ws[len(ws)-1]))
}

func ratio(a, b []time.Duration) float64 {
	return float64(harness.Percentile(a, 50)) / float64(harness.Percentile(b, 50))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench/fork:", err)
		harness.StopAll()
		os.Exit(1)
	}
}

// qemuRestore is the baseline: the engine alone restores the artifact
// (QEMU start, QMP, migrate-incoming, cont), with no nether process,
// control socket or handshake. It returns the time to cont, and the time
// until the guest answered a first request over a bare channel (which
// after a restore means the guest ran: under TCG its code is translated
// afresh, and that cost belongs to any restore, not to nether).
func qemuRestore(repo, art string) (time.Duration, time.Duration, error) {
	run, err := os.MkdirTemp("", "nether-bench-qemu-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(run)
	a, err := snapshot.Open(art)
	if err != nil {
		return 0, 0, err
	}
	st, err := channel.UnmarshalState(a.Meta.Sections["channel"].Data)
	if err != nil {
		return 0, 0, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	guest := filepath.Join(repo, "build", "guest")
	// The base booted the default guest, whose root image is a device
	// the restored machine must have too.
	rootImage, err := session.RootImage(&conf.Config{}, guest)
	if err != nil {
		return 0, 0, err
	}
	ctx := context.Background()
	start := time.Now()
	m, err := qemu.New(quiet).Start(ctx, engine.Spec{
		CPUs: 1, RAMMB: 512, Accel: engine.AccelTCG,
		Kernel: filepath.Join(guest, "vmlinux"), Initrd: filepath.Join(guest, "initramfs.cpio"),
		RootImage: rootImage,
		RunDir:    run,
		Incoming:  &engine.Incoming{Dir: art, Section: engine.Section(a.Meta.Sections[snapshot.SectionEngine])},
	})
	if err != nil {
		return 0, 0, err
	}
	defer m.Quit(ctx)
	if err := m.LoadIncoming(ctx); err != nil {
		return 0, 0, err
	}
	mux, err := channel.Restore(st, quiet)
	if err != nil {
		return 0, 0, err
	}
	defer mux.Close()
	mux.Attach(m.Channel(), false)
	if err := m.Resume(ctx); err != nil {
		return 0, 0, err
	}
	toCont := time.Since(start)
	// No handshake: the guest still serves the captured session's epoch,
	// which is 0 for a base captured from a boot.
	s, err := mux.Open(agentproto.Request{Op: agentproto.OpExec, Command: "true"}.Encode())
	if err != nil {
		return 0, 0, err
	}
	s.CloseWrite(nil)
	if _, err := io.Copy(io.Discard, s); err != nil {
		return 0, 0, err
	}
	return toCont, time.Since(start), nil
}

func forkOnce(repo, art string) (time.Duration, error) {
	return harness.FirstCommand(repo, "restore = 1\nrestore_from = "+art+"\n")
}

// fan starts k forks at once, returns when all answered and the sum of
// their PSS once idle.
func fan(repo string, arts []string) (time.Duration, int64, error) {
	start := time.Now()
	sbs := make([]*testharness.Sandbox, len(arts))
	errs := make([]error, len(arts))
	var wg sync.WaitGroup
	for i := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := harness.Start(repo, "restore = 1\nrestore_from = "+arts[i]+"\n")
			if err != nil {
				errs[i] = err
				return
			}
			sbs[i] = sb
			c, err := sb.Dial(120 * time.Second)
			if err != nil {
				errs[i] = err
				return
			}
			defer c.Close()
			errs[i] = harness.Run(c, "true")
		}()
	}
	wg.Wait()
	all := time.Since(start)
	defer func() {
		for _, sb := range sbs {
			if sb != nil {
				sb.Close()
			}
		}
	}()
	for _, err := range errs {
		if err != nil {
			return 0, 0, err
		}
	}
	time.Sleep(2 * time.Second) // idle
	var pss int64
	for _, sb := range sbs {
		q, _ := sb.Machine() // nether's QEMU child, from /proc
		pss += harness.PSS(q.Pid) + harness.PSS(sb.Pid())
	}
	return all, pss, nil
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// parkArtifacts parks k forks of art, one after another, and returns the
// parks: a wake takes its park's memory as its own (a copy), so k wakes
// are the baseline of k restores that share nothing.
func parkArtifacts(repo, art string, k int) ([]string, error) {
	dir, err := os.MkdirTemp("", "nether-bench-parks-")
	if err != nil {
		return nil, err
	}
	var parks []string
	for i := 0; i < k; i++ {
		sb, err := harness.Start(repo, "restore = 1\nrestore_from = "+art+"\n")
		if err != nil {
			return nil, err
		}
		c, err := sb.Dial(60 * time.Second)
		if err != nil {
			sb.Close()
			return nil, err
		}
		_, err = harness.Exec(c, "__park__ park")
		c.Close()
		if err == nil {
			sb.Wait(30 * time.Second)
			dst := filepath.Join(dir, fmt.Sprintf("park%d", i))
			err = os.Rename(filepath.Join(sb.Dir, "park"), dst)
			parks = append(parks, dst)
		}
		sb.Close()
		if err != nil {
			return nil, err
		}
	}
	return parks, nil
}
