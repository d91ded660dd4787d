// Command audit measures `nexus audit verify` over a chain of 100,000
// records (issue target: at most 2 s), against a baseline taken in the
// same run: the same command's process reading the same store without
// checking anything (`nexus audit ls --sandbox none`, which decodes every
// record and prints none). Both are whole nexus processes, as a user
// runs them.
//
//	go run ./bench/audit [-records 100000] [-runs 3]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/nethersandbox/nether/bench/internal/harness"
	"github.com/nethersandbox/nether/nexus/store"
)

func main() {
	records := flag.Int("records", 100000, "records in the chain")
	runs := flag.Int("runs", 3, "timed runs of each command")
	flag.Parse()
	repo := harness.Repo()
	bin := filepath.Join(repo, "bin", "nexus")
	if _, err := os.Stat(bin); err != nil {
		fail(fmt.Errorf("%s: run scripts/setup.sh first: %w", bin, err))
	}
	state, err := os.MkdirTemp("", "nxa-")
	check(err)
	defer os.RemoveAll(state)

	// The chain, written through the store as nexus writes it, in
	// batches (one transaction each) to keep the setup short.
	db, err := store.Open(state)
	check(err)
	t0 := time.Now()
	const batch = 10000
	for done := 0; done < *records; done += batch {
		recs := make([]*store.AuditRecord, min(batch, *records-done))
		for i := range recs {
			recs[i] = &store.AuditRecord{Event: "fork", Outcome: "ok", Node: "01NODE0000000000000000000",
				Sandbox: fmt.Sprintf("01SANDBOX%017d", done+i), Parent: "01PARENT00000000000000000", Snapshot: "01SNAP0000000000000000000",
				Plan: strings.Repeat("ab", 32)}
		}
		check(db.Update(func(tx *store.Tx) error { return tx.AppendAudit(recs...) }))
	}
	fmt.Printf("audit chain of %d records written in %s\n", *records, harness.MS(time.Since(t0)))

	nexus := func(args ...string) (time.Duration, string) {
		cmd := exec.Command(bin, append([]string{"--state-dir", state, "audit"}, args...)...)
		cmd.Env = append(os.Environ(), "NEXUS_NETHER=/bin/true")
		t := time.Now()
		out, err := cmd.CombinedOutput()
		d := time.Since(t)
		if err != nil {
			fail(fmt.Errorf("nexus audit %s: %v: %s", strings.Join(args, " "), err, out))
		}
		return d, strings.TrimSpace(string(out))
	}
	var verify, read []time.Duration
	var said string
	for r := 0; r < *runs; r++ {
		d, out := nexus("verify")
		verify, said = append(verify, d), out
		d, _ = nexus("ls", "--sandbox", "none")
		read = append(read, d)
	}
	sort.Slice(verify, func(i, j int) bool { return verify[i] < verify[j] })
	sort.Slice(read, func(i, j int) bool { return read[i] < read[j] })
	v, b := verify[len(verify)/2], read[len(read)/2]
	fmt.Printf("  %s\n", said)
	fmt.Printf("  nexus audit verify: median %s of %d (target <= 2000 ms)\n", harness.MS(v), *runs)
	fmt.Printf("  nexus audit ls decoding every record, printing none: median %s (verify / read: %.2fx)\n", harness.MS(b), float64(v)/float64(b))
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench/audit:", err)
	os.Exit(1)
}
