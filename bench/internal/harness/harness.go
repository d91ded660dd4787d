// Package harness is what the benchmarks share beyond the process
// harness (internal/testharness, shared with the end-to-end tests):
// starting bin/nether the way every benchmark does, driving it, and
// reporting figures. Benchmarks print; they never assert: these machines
// are noisy, so every figure is set against a baseline measured in the
// same run.
package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

// Repo finds the repository root from the working directory.
func Repo() string {
	d, err := testharness.FindRepo()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: run from inside the repository:", err)
		os.Exit(2)
	}
	return d
}

// Start launches bin/nether (what scripts/setup.sh built) in a fresh
// launch directory with a private TMPDIR, with conf (nether.conf text
// after the control_socket line). Close stops it and removes both
// directories.
func Start(repo string, conf string) (*testharness.Sandbox, error) {
	return StartBin(repo, filepath.Join(repo, "bin", "nether"), conf)
}

// StartBin is Start with another nether binary (one built with other
// tags, say, outside bin/), booting the guest setup built in repo.
func StartBin(repo, bin string, conf string) (*testharness.Sandbox, error) {
	return testharness.Start(testharness.Options{
		Bin:      bin,
		GuestDir: filepath.Join(repo, "build", "guest"),
		Socket:   "ctl.sock",
		Conf:     strings.Split(strings.TrimRight(conf, "\n"), "\n"),
		Args:     []string{"-log-level", "info"},
	})
}

// StopAll stops every sandbox still running: a benchmark that fails calls
// it before exiting, so no guest outlives it.
func StopAll() { testharness.StopAll() }

// Run runs one command and fails on a non-zero exit. A guest that is not
// ready yet (many restores at once on a small machine can take longer than
// nether's 30 s readiness wait) is asked again, as a platform would.
func Run(c *client.Client, line string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	exit, err := c.Run(ctx, line, nil)
	for err != nil && strings.Contains(err.Error(), "agent not connected") && ctx.Err() == nil {
		exit, err = c.Run(ctx, line, nil)
	}
	if err != nil {
		return err
	}
	if exit != 0 {
		return fmt.Errorf("%q exited %d", line, exit)
	}
	return nil
}

// Exec runs a command and returns its body.
func Exec(c *client.Client, line string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var b strings.Builder
	exit, err := c.Run(ctx, line, &b)
	if err != nil {
		return b.String(), err
	}
	if exit != 0 {
		return b.String(), fmt.Errorf("%q exited %d: %s", line, exit, b.String())
	}
	return b.String(), nil
}

// NexusTrue runs `true` in the nexus sandbox id of the state directory
// state, over its control socket: a fork's first command.
func NexusTrue(state, id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, filepath.Join(state, "sandboxes", id, "ctl.sock"))
	if err != nil {
		return err
	}
	defer c.Close()
	return Run(c, "true")
}

// FirstCommand starts a nether with conf and returns the time from process
// start until its first command (`true`) was answered; the sandbox is
// stopped afterwards.
func FirstCommand(repo, conf string) (time.Duration, error) {
	sb, c, d, err := StartFirstCommand(repo, conf)
	if err != nil {
		return 0, err
	}
	c.Close()
	sb.Close()
	return d, nil
}

// StartFirstCommand is FirstCommand for a sandbox that runs on: it
// returns the sandbox and its client with the time, and stops nothing
// unless it fails.
func StartFirstCommand(repo, conf string) (*testharness.Sandbox, *client.Client, time.Duration, error) {
	sb, err := Start(repo, conf)
	if err != nil {
		return nil, nil, 0, err
	}
	c, err := sb.Dial(30 * time.Second)
	if err != nil {
		sb.Close()
		return nil, nil, 0, err
	}
	if err := Run(c, "true"); err != nil {
		c.Close()
		sb.Close()
		return nil, nil, 0, err
	}
	return sb, c, time.Since(sb.Started), nil
}

// Percentile of sorted durations (nearest rank).
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	return sorted[i]
}

// Sorted returns a sorted copy.
func Sorted(d []time.Duration) []time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s
}

// MS formats a duration in milliseconds.
func MS(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }

var pssRE = regexp.MustCompile(`(?m)^Pss:\s+(\d+) kB`)

// PSS is a process's proportional set size in bytes: shared pages count
// for a share of each process mapping them, so a sum over processes is
// the memory they really cost the host. 0 when pid is gone (or 0).
func PSS(pid int) int64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	m := pssRE.FindSubmatch(b)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// MiB formats bytes.
func MiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
