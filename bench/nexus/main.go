// Command nexus measures the orchestrator against baselines taken in the
// same run:
//
//   - `nexus fork <snapshot> -n 16` (the CLI, then `true` in each child)
//     against sixteen bare nether forks of the same artifact started by a
//     script (until each answered `true`);
//
//   - fork on request from a warm pool -> first command answered, against
//     a cold-process fork -> first command (both through the nexus
//     package, alternating), and the same through the CLI (`nexus fork
//     warm` against `nexus fork --no-pool warm`, a whole process each);
//
//   - `nexus ls` (the CLI, a whole process) with 1,000 records.
//
//     go run ./bench/nexus [-n 16] [-claims 8] [-records 1000]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/nexus"
)

func main() {
	n := flag.Int("n", 16, "children in the fan-out")
	claims := flag.Int("claims", 8, "pool claims (and cold forks) timed")
	records := flag.Int("records", 1000, "records for nexus ls")
	flag.Parse()
	repo := harness.Repo()
	defer harness.StopAll()
	bin := filepath.Join(repo, "bin")
	ctx := context.Background()

	state, err := os.MkdirTemp("", "nxb-")
	check(err)
	defer os.RemoveAll(state)
	nx, err := nexus.Open(ctx, nexus.Options{StateDir: state, Nether: filepath.Join(bin, "nether")})
	check(err)
	defer cleanup(nx)
	base, err := nx.Create(ctx, nexus.CreateRequest{Name: "base", Config: nexus.Config{RAMMB: 256}})
	check(err)
	_, err = nx.Start(ctx, base.ID)
	check(err)
	snap, err := nx.SnapshotCreate(ctx, "base", "warm")
	check(err)

	// 1. Fan-out: the CLI against a script's bare nethers, twice each,
	// alternating.
	var viaNexus, bare []time.Duration
	for round := 0; round < 2; round++ {
		t0 := time.Now()
		cmd := exec.Command(filepath.Join(bin, "nexus"), "--state-dir", state, "fork", "warm", "-n", fmt.Sprint(*n))
		cmd.Env = append(os.Environ(), "NEXUS_NETHER="+filepath.Join(bin, "nether"))
		out, err := cmd.Output()
		if err != nil {
			fail(fmt.Errorf("nexus fork -n %d: %v\n%s", *n, err, out))
		}
		// Done as the script's are: each child answered `true`.
		var wg sync.WaitGroup
		kids := forkedIDs(out)
		for _, id := range kids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				check(harness.NexusTrue(state, id))
			}()
		}
		wg.Wait()
		viaNexus = append(viaNexus, time.Since(t0))
		for _, id := range kids {
			check(nx.Remove(ctx, id, true))
		}
		d, err := bareForks(repo, snap.Dir, *n)
		check(err)
		bare = append(bare, d)
	}
	fmt.Printf("fan-out of %d forks of a 256 MiB guest (two rounds):\n", *n)
	fmt.Printf("  nexus fork -n %d: %s / %s   %d bare nether forks from a script: %s / %s   (%.2fx, %.2fx; target <= 1.1x)\n",
		*n, ms(viaNexus[0]), ms(viaNexus[1]), *n, ms(bare[0]), ms(bare[1]),
		float64(viaNexus[0])/float64(bare[0]), float64(viaNexus[1])/float64(bare[1]))

	// 2. Warm pool claims against cold forks, alternating.
	_, err = nx.PoolSet(ctx, "warm", 2)
	check(err)
	var warm, cold []time.Duration
	for i := 0; i < *claims; i++ {
		waitPool(ctx, nx, snap.ID, 2)
		t0 := time.Now()
		kids, err := nx.Fork(ctx, nexus.ForkRequest{From: "warm"})
		check(err)
		if kids[0].Pool != "" || kids[0].Created.After(t0) {
			fail(fmt.Errorf("the fork restored a new child instead of claiming a pool member"))
		}
		check(harness.NexusTrue(state, kids[0].ID))
		warm = append(warm, time.Since(t0))
		t0 = time.Now()
		// A cold fork: from a snapshot with no pool.
		coldKids, err := coldFork(ctx, nx, snap)
		check(err)
		check(harness.NexusTrue(state, coldKids[0].ID))
		cold = append(cold, time.Since(t0))
		check(nx.Remove(ctx, kids[0].ID, true))
		check(nx.Remove(ctx, coldKids[0].ID, true))
	}
	// 2b. The same through the CLI, as a platform's script forks: one
	// whole nexus process per fork, then the child's first command.
	var warmCLI, coldCLI []time.Duration
	cli := func(args ...string) []string {
		cmd := exec.Command(filepath.Join(bin, "nexus"), append([]string{"--state-dir", state}, args...)...)
		cmd.Env = append(os.Environ(), "NEXUS_NETHER="+filepath.Join(bin, "nether"))
		out, err := cmd.Output()
		if err != nil {
			fail(fmt.Errorf("nexus %s: %v\n%s", strings.Join(args, " "), err, out))
		}
		return forkedIDs(out)
	}
	for i := 0; i < *claims; i++ {
		waitPool(ctx, nx, snap.ID, 2)
		t0 := time.Now()
		kid := cli("fork", "warm")[0]
		check(harness.NexusTrue(state, kid))
		warmCLI = append(warmCLI, time.Since(t0))
		t0 = time.Now()
		coldKid := cli("fork", "--no-pool", "warm")[0]
		check(harness.NexusTrue(state, coldKid))
		coldCLI = append(coldCLI, time.Since(t0))
		check(nx.Remove(ctx, kid, true))
		check(nx.Remove(ctx, coldKid, true))
	}
	_, err = nx.PoolSet(ctx, "warm", 0)
	check(err)
	wc, cc := harness.Sorted(warmCLI), harness.Sorted(coldCLI)
	fmt.Printf("through the CLI, nexus fork -> first command (%d each): warm pool p50 %s p99 %s   nexus fork --no-pool p50 %s   (%.3fx; target <= 0.1x)\n",
		len(wc), ms(harness.Percentile(wc, 50)), ms(harness.Percentile(wc, 99)), ms(harness.Percentile(cc, 50)),
		float64(harness.Percentile(wc, 50))/float64(harness.Percentile(cc, 50)))
	ws, cs := harness.Sorted(warm), harness.Sorted(cold)
	fmt.Printf("fork on request -> first command (%d each): warm pool p50 %s p99 %s   cold-process fork p50 %s   (%.3fx; target <= 0.1x)\n",
		len(ws), ms(harness.Percentile(ws, 50)), ms(harness.Percentile(ws, 99)), ms(harness.Percentile(cs, 50)),
		float64(harness.Percentile(ws, 50))/float64(harness.Percentile(cs, 50)))

	// 3. nexus ls with many records.
	for i := 0; i < *records; i++ {
		_, err := nx.Create(ctx, nexus.CreateRequest{})
		check(err)
	}
	var ls []time.Duration
	for i := 0; i < 10; i++ {
		t0 := time.Now()
		cmd := exec.Command(filepath.Join(bin, "nexus"), "--state-dir", state, "ls")
		cmd.Env = append(os.Environ(), "NEXUS_NETHER="+filepath.Join(bin, "nether"))
		out, err := cmd.Output()
		check(err)
		ls = append(ls, time.Since(t0))
		if lines := strings.Count(string(out), "\n"); lines < *records {
			fail(fmt.Errorf("nexus ls printed %d lines for %d records", lines, *records))
		}
	}
	lss := harness.Sorted(ls)
	fmt.Printf("nexus ls with %d records (the whole process, 10 runs): p50 %s max %s (target <= 100 ms)\n",
		*records+1, ms(harness.Percentile(lss, 50)), ms(lss[len(lss)-1]))
}

// coldFork forks the same snapshot without its pool: a new nether
// process restores it.
func coldFork(ctx context.Context, nx *nexus.Nexus, snap *nexus.Snapshot) ([]*nexus.Sandbox, error) {
	return nx.Fork(ctx, nexus.ForkRequest{From: snap.ID, NoPool: true})
}

func waitPool(ctx context.Context, nx *nexus.Nexus, snapID string, size int) {
	deadline := time.Now().Add(3 * time.Minute)
	for time.Now().Before(deadline) {
		if nx.PoolReady(ctx, snapID) >= size {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	fail(fmt.Errorf("the pool never reached %d ready members", size))
}

// bareForks starts n nethers restoring art, each in its own directory,
// as a platform's script would, and returns the time until all answered.
func bareForks(repo, art string, n int) (time.Duration, error) {
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sbs := make(chan interface{ Close() }, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := harness.Start(repo, "ram_mb = 256\nrestore = 1\nrestore_from = "+art+"\n")
			if err != nil {
				errs <- err
				return
			}
			sbs <- sb
			c, err := sb.Dial(3 * time.Minute)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			if err := harness.Run(c, "true"); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	close(sbs)
	for sb := range sbs {
		sb.Close()
	}
	close(errs)
	for err := range errs {
		return 0, err
	}
	return d, nil
}

func cleanup(nx *nexus.Nexus) {
	ctx := context.Background()
	nx.PoolSet(ctx, "warm", 0)
	sbs, _ := nx.List(ctx)
	for _, sb := range sbs {
		nx.Remove(ctx, sb.ID, true)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/nexus:", err)
	harness.StopAll()
	os.Exit(1)
}

// forkedIDs are the ids nexus fork prints, the first field of each line
// ("<id>  <name>").
func forkedIDs(out []byte) []string {
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			ids = append(ids, f[0])
		}
	}
	return ids
}
