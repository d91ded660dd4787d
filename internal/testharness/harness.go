// Package testharness starts and watches nether processes for the
// end-to-end tests (test/e2e) and the benchmarks (bench/...): one process
// harness for both. It knows nothing of package testing; the e2e suite
// wraps it with its own helpers and failure reporting.
//
// Nothing here reads facts out of nether's log. Readiness is a listening
// socket in /proc/net/unix, the QEMU process is nether's child in /proc,
// and identity comes from __info__ (the caller's business). Every nether
// gets a private, empty TMPDIR, so what it leaves behind there, and any
// process that still carries that TMPDIR in its environment after nether
// ended, is attributable to it.
package testharness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/client"
)

// FindRepo finds the repository root (the directory holding go.mod) from
// the working directory upwards.
func FindRepo() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		p := filepath.Dir(d)
		if p == d {
			return "", errors.New("not inside the repository (no go.mod above the working directory)")
		}
		d = p
	}
}

// Build builds the main packages pkgs of the repository at repo into
// outDir with extra go build flags (e.g. -race).
func Build(repo, outDir string, flags []string, pkgs ...string) error {
	args := append([]string{"build"}, flags...)
	args = append(args, "-o", outDir+string(filepath.Separator))
	args = append(args, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return nil
}

// Options describe one nether process.
type Options struct {
	// Bin is the nether binary.
	Bin string
	// Dir is the launch directory; "" makes a fresh one that Remove
	// deletes.
	Dir string
	// TmpDir is the process's private TMPDIR. It must exist and be empty;
	// "" makes a fresh one that Remove deletes.
	TmpDir string
	// Socket, when set, is written as the first line of nether.conf
	// (control_socket = Socket); a relative Socket is taken inside Dir.
	Socket string
	// Conf are the nether.conf lines (after the control_socket line).
	Conf []string
	// NoConf writes no nether.conf at all (Socket and Conf are ignored).
	NoConf bool
	// Args are nether's command-line arguments.
	Args []string
	// GuestDir, when set, is passed as NETHER_GUEST_DIR.
	GuestDir string
	// Env are extra environment variables (KEY=value).
	Env []string
	// StdinPipe connects Sandbox.Stdin to nether's standard input.
	StdinPipe bool
	// Stdout, when set, receives a copy of nether's standard output as it
	// is written (Sandbox.Stdout keeps everything either way).
	Stdout io.Writer
	// NetNS, when set, runs nether inside that network namespace through
	// `ip netns exec`, which execs it under the same pid and binds
	// /etc/netns/<NetNS>/{hosts,resolv.conf} over /etc's when they exist.
	NetNS string
}

// Buffer is a goroutine-safe bytes.Buffer.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Sandbox is one nether process.
type Sandbox struct {
	Dir     string // launch directory
	Sock    string // control socket ("" without one)
	TmpDir  string // the private TMPDIR
	Cmd     *exec.Cmd
	Started time.Time
	Stdout  *Buffer
	Stderr  *Buffer
	Stdin   io.WriteCloser // with Options.StdinPipe

	done   chan struct{}
	err    error
	remove []string // directories the harness made

	mu   sync.Mutex
	seen map[int]Proc // every QEMU child observed
}

var (
	liveMu sync.Mutex
	live   = map[*Sandbox]bool{}
)

// Start writes nether.conf and starts nether. It does not wait for
// anything.
func Start(o Options) (*Sandbox, error) {
	sb := &Sandbox{Dir: o.Dir, TmpDir: o.TmpDir, Stdout: &Buffer{}, Stderr: &Buffer{},
		done: make(chan struct{}), seen: map[int]Proc{}}
	fail := func(err error) (*Sandbox, error) {
		sb.Remove()
		return nil, err
	}
	if sb.Dir == "" || sb.TmpDir == "" {
		root, err := os.MkdirTemp("", "nether-sandbox-")
		if err != nil {
			return nil, err
		}
		sb.remove = append(sb.remove, root)
		if sb.Dir == "" {
			sb.Dir = filepath.Join(root, "launch")
			if err := os.Mkdir(sb.Dir, 0o700); err != nil {
				return fail(err)
			}
		}
		if sb.TmpDir == "" {
			sb.TmpDir = filepath.Join(root, "tmp")
			if err := os.Mkdir(sb.TmpDir, 0o700); err != nil {
				return fail(err)
			}
		}
	}
	if left, err := Entries(sb.TmpDir); err != nil || len(left) > 0 {
		return fail(fmt.Errorf("TMPDIR %s is not an empty directory: %v %v", sb.TmpDir, left, err))
	}
	if !o.NoConf {
		var text strings.Builder
		if o.Socket != "" {
			sb.Sock = o.Socket
			if !filepath.IsAbs(sb.Sock) {
				sb.Sock = filepath.Join(sb.Dir, sb.Sock)
			}
			fmt.Fprintf(&text, "control_socket = %s\n", sb.Sock)
		}
		for _, l := range o.Conf {
			text.WriteString(l + "\n")
		}
		if err := os.WriteFile(filepath.Join(sb.Dir, "nether.conf"), []byte(text.String()), 0o600); err != nil {
			return fail(err)
		}
	}
	if o.NetNS != "" {
		sb.Cmd = exec.Command("ip", append([]string{"netns", "exec", o.NetNS, o.Bin}, o.Args...)...)
	} else {
		sb.Cmd = exec.Command(o.Bin, o.Args...)
	}
	sb.Cmd.Dir = sb.Dir
	env := append(os.Environ(), "TMPDIR="+sb.TmpDir)
	if o.GuestDir != "" {
		env = append(env, "NETHER_GUEST_DIR="+o.GuestDir)
	}
	sb.Cmd.Env = append(env, o.Env...)
	sb.Cmd.Stdout, sb.Cmd.Stderr = sb.Stdout, sb.Stderr
	if o.Stdout != nil {
		sb.Cmd.Stdout = io.MultiWriter(sb.Stdout, o.Stdout)
	}
	if o.StdinPipe {
		w, err := sb.Cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		sb.Stdin = w
	}
	// A process nether left behind may hold its stdout or stderr open;
	// that must not keep Wait from noticing nether's own exit.
	sb.Cmd.WaitDelay = 2 * time.Second
	sb.Started = time.Now()
	if err := sb.Cmd.Start(); err != nil {
		return fail(err)
	}
	liveMu.Lock()
	live[sb] = true
	liveMu.Unlock()
	go func() {
		sb.err = sb.Cmd.Wait()
		liveMu.Lock()
		delete(live, sb)
		liveMu.Unlock()
		close(sb.done)
	}()
	return sb, nil
}

// Pid is nether's process id.
func (sb *Sandbox) Pid() int { return sb.Cmd.Process.Pid }

// Done is closed once nether has exited and been reaped.
func (sb *Sandbox) Done() <-chan struct{} { return sb.done }

// Exited reports whether nether has exited.
func (sb *Sandbox) Exited() bool {
	select {
	case <-sb.done:
		return true
	default:
		return false
	}
}

// Err is what waiting for nether returned (valid once Done is closed).
func (sb *Sandbox) Err() error {
	<-sb.done
	return sb.err
}

// ExitCode is nether's exit status (valid once Done is closed; -1 for a
// signal).
func (sb *Sandbox) ExitCode() int {
	<-sb.done
	return sb.Cmd.ProcessState.ExitCode()
}

// Wait waits up to timeout for nether to exit by itself.
func (sb *Sandbox) Wait(timeout time.Duration) error {
	select {
	case <-sb.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("nether did not exit within %s", timeout)
	}
}

// Signal sends sig to nether (a no-op once it exited).
func (sb *Sandbox) Signal(sig syscall.Signal) {
	if !sb.Exited() {
		sb.Cmd.Process.Signal(sig)
	}
}

// Stop ends nether if it still runs: SIGTERM, then SIGKILL after grace.
// It returns whether nether ended within grace on its own.
func (sb *Sandbox) Stop(grace time.Duration) bool {
	if sb.Exited() {
		return true
	}
	sb.Signal(syscall.SIGTERM)
	select {
	case <-sb.done:
		return true
	case <-time.After(grace):
		sb.Signal(syscall.SIGKILL)
		<-sb.done
		return false
	}
}

// Remove deletes the directories the harness made for this sandbox.
func (sb *Sandbox) Remove() {
	for _, d := range sb.remove {
		os.RemoveAll(d)
	}
	sb.remove = nil
}

// StopAll stops every nether this process started that still runs: a
// benchmark that fails calls it before exiting, so no guest outlives it.
func StopAll() {
	liveMu.Lock()
	sbs := make([]*Sandbox, 0, len(live))
	for sb := range live {
		sbs = append(sbs, sb)
	}
	liveMu.Unlock()
	for _, sb := range sbs {
		sb.Close()
	}
}

// WaitListening waits until nether listens on its control socket (seen
// in /proc/net/unix, without connecting: a probe connection would take
// the primary slot). It fails at once if nether exits first.
func (sb *Sandbox) WaitListening(timeout time.Duration) error {
	if sb.Sock == "" {
		return errors.New("this nether has no control socket")
	}
	deadline := time.Now().Add(timeout)
	for {
		ok, err := ListeningIn(sb.Pid(), sb.Sock)
		if err != nil && sb.Exited() {
			return fmt.Errorf("nether exited (%v) before listening on %s", sb.err, sb.Sock)
		}
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if sb.Exited() {
			return fmt.Errorf("nether exited (%v) before listening on %s", sb.err, sb.Sock)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nether did not listen on %s within %s", sb.Sock, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Dial waits until the control socket listens and connects a client
// (the primary, if it is the first).
func (sb *Sandbox) Dial(timeout time.Duration) (*client.Client, error) {
	began := time.Now()
	if err := sb.WaitListening(timeout); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout-time.Since(began), 10*time.Second))
	defer cancel()
	return client.Dial(ctx, sb.Sock)
}

// RaceMarker starts every report of the Go race detector.
const RaceMarker = "WARNING: DATA RACE"

// RaceReports returns the race detector's reports in s (nether's
// stderr), or "" when there are none.
func RaceReports(s string) string {
	i := strings.Index(s, RaceMarker)
	if i < 0 {
		return ""
	}
	// Each report is fenced by a line of '=' before its marker.
	if j := strings.LastIndex(s[:i], "=================="); j >= 0 {
		i = j
	}
	return s[i:]
}

// Entries lists the names in dir.
func Entries(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// Close stops nether (SIGTERM, then SIGKILL after 20 s) and removes the
// directories the harness made for it.
func (sb *Sandbox) Close() {
	sb.Stop(20 * time.Second)
	sb.Remove()
}
