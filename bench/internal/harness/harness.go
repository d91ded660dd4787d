// Package harness starts nether processes for the benchmarks and reports
// figures. Benchmarks print; they never assert: these machines are noisy,
// so every figure is set against a baseline measured in the same run.
package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/client"
)

// Repo finds the repository root from the working directory.
func Repo() string {
	d, _ := os.Getwd()
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		p := filepath.Dir(d)
		if p == d {
			fmt.Fprintln(os.Stderr, "bench: run from inside the repository")
			os.Exit(2)
		}
		d = p
	}
}

// Sandbox is a running nether.
type Sandbox struct {
	Dir    string
	Sock   string
	Cmd    *exec.Cmd
	Start  time.Time
	Stdout *os.File
}

var (
	liveMu sync.Mutex
	live   = map[*Sandbox]bool{}
)

// StopAll stops every sandbox still running: a benchmark that fails calls
// it before exiting, so no guest outlives it.
func StopAll() {
	liveMu.Lock()
	sbs := make([]*Sandbox, 0, len(live))
	for sb := range live {
		sbs = append(sbs, sb)
	}
	liveMu.Unlock()
	for _, sb := range sbs {
		sb.Stop()
	}
}

// Start launches bin/nether in a fresh launch directory.
func Start(repo string, conf string) (*Sandbox, error) {
	dir, err := os.MkdirTemp("", "nether-bench-")
	if err != nil {
		return nil, err
	}
	sb := &Sandbox{Dir: dir, Sock: filepath.Join(dir, "ctl.sock")}
	if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("control_socket = "+sb.Sock+"\n"+conf), 0o600); err != nil {
		return nil, err
	}
	out, err := os.Create(filepath.Join(dir, "stdout.txt"))
	if err != nil {
		return nil, err
	}
	sb.Stdout = out
	sb.Cmd = exec.Command(filepath.Join(repo, "bin", "nether"), "-log-level", "info")
	sb.Cmd.Dir = dir
	sb.Cmd.Stdout, sb.Cmd.Stderr = out, out
	sb.Start = time.Now()
	if err := sb.Cmd.Start(); err != nil {
		return nil, err
	}
	liveMu.Lock()
	live[sb] = true
	liveMu.Unlock()
	return sb, nil
}

// Dial connects as soon as the socket accepts, retrying until timeout.
func (sb *Sandbox) Dial(timeout time.Duration) (*client.Client, error) {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := client.Dial(ctx, sb.Sock)
		cancel()
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connecting to %s: %w", sb.Sock, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Stop shuts the sandbox down and removes its directory.
func (sb *Sandbox) Stop() {
	liveMu.Lock()
	if !live[sb] {
		liveMu.Unlock()
		return
	}
	delete(live, sb)
	liveMu.Unlock()
	sb.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { sb.Cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		sb.Cmd.Process.Kill()
		<-done
	}
	sb.Stdout.Close()
	os.RemoveAll(sb.Dir)
}

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

// Wait waits for the sandbox process to exit by itself.
func (sb *Sandbox) Wait(timeout time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- sb.Cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		sb.Cmd.Process.Kill()
		return fmt.Errorf("nether did not exit within %s", timeout)
	}
}

// QEMUPid reads the QEMU pid nether logged.
func (sb *Sandbox) QEMUPid() int {
	b, _ := os.ReadFile(filepath.Join(sb.Dir, "stdout.txt"))
	m := regexp.MustCompile(`guest booting.* pid=(\d+)`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	pid, _ := strconv.Atoi(string(m[1]))
	return pid
}

// PSS is a process's proportional set size in bytes: shared pages count
// for a share of each process mapping them, so a sum over processes is
// the memory they really cost the host.
func PSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^Pss:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10
}

// MiB formats bytes.
func MiB(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// FirstCommand starts a nether with conf and returns the time from process
// start until its first command (`true`) was answered; the sandbox is
// stopped afterwards.
func FirstCommand(repo, conf string) (time.Duration, error) {
	sb, err := Start(repo, conf)
	if err != nil {
		return 0, err
	}
	defer sb.Stop()
	c, err := sb.Dial(30 * time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if err := Run(c, "true"); err != nil {
		return 0, err
	}
	return time.Since(sb.Start), nil
}
