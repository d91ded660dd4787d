package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

type agent struct {
	log    *slog.Logger
	reaper *reaper
	mux    *channel.Mux
	// epoch is the session epoch served (agentproto's package comment):
	// 0 after boot, set by each restore handshake, checked on every
	// host request.
	epoch atomic.Uint64
	// powerOff ends the guest after a poweroff request was acknowledged.
	// A field, not a direct call, so a test can serve poweroff requests
	// without powering anything off.
	powerOff func()
}

// shellEnv is the environment of every command. Commands start from a
// known state, not from whatever the kernel handed PID 1.
var shellEnv = []string{
	"PATH=/bin:/sbin:/usr/bin:/usr/sbin",
	"HOME=/root",
	"USER=root",
	"LOGNAME=root",
	"TERM=dumb",
	"LANG=C.UTF-8",
}

func (a *agent) serve(s *channel.Stream) {
	req, err := agentproto.Decode(s.Meta())
	if err != nil {
		s.Reset(err.Error())
		return
	}
	// Checked once, before anything runs: a request from another session
	// (still queued in a captured channel, or from a host that missed a
	// restore) must not act in this one, while a stream admitted earlier
	// keeps running when a later handshake changes the epoch.
	if err := agentproto.CheckEpoch(req, a.epoch.Load()); err != nil {
		a.log.Warn("agent: refused a request from another session", "op", req.Op, "err", err)
		s.Reset(err.Error())
		return
	}
	switch req.Op {
	case agentproto.OpExec:
		a.exec(s, string(req.Command))
	case agentproto.OpPut:
		a.put(s, req)
	case agentproto.OpGet:
		a.get(s, req)
	case agentproto.OpRestored:
		a.restored(s, req)
	case agentproto.OpPoweroff:
		s.CloseWrite([]byte("ok 0"))
		// Give the acknowledgement a moment to leave before the power goes.
		time.Sleep(20 * time.Millisecond)
		a.powerOff()
	default:
		s.Reset(fmt.Sprintf("operation %q is not served by this agent", req.Op))
	}
}

// exec runs a shell command with stdout and stderr on one pipe, so their
// interleaving is kept, and streams the bytes as they come.
func (a *agent) exec(s *channel.Stream, command string) {
	pr, pw, err := os.Pipe()
	if err != nil {
		s.Reset("creating output pipe: " + err.Error())
		return
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		pr.Close()
		pw.Close()
		s.Reset("opening /dev/null: " + err.Error())
		return
	}
	_, done, err := a.reaper.start("/bin/sh", []string{"sh", "-c", command}, &os.ProcAttr{
		Dir:   "/root",
		Env:   shellEnv,
		Files: []*os.File{devnull, pw, pw},
		// Its own session and process group, so no command can signal the
		// agent's group or take over its terminal.
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	devnull.Close()
	pw.Close()
	if err != nil {
		pr.Close()
		s.Reset("starting /bin/sh: " + err.Error())
		return
	}
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		buf := make([]byte, 32<<10)
		for {
			n, err := pr.Read(buf)
			if n > 0 {
				if _, werr := s.Write(buf[:n]); werr != nil {
					// The host dropped the stream; keep draining so the
					// command never blocks on a full pipe.
					io.Copy(io.Discard, pr)
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	ws := <-done
	// A command that leaves a background process holding the pipe open
	// would keep us waiting forever; take what arrives shortly after the
	// shell exits and stop there.
	pr.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	<-copied
	pr.Close()
	s.CloseWrite([]byte(strconv.Itoa(exitCode(ws))))
}

// restored is the post-restore handshake: the one place the guest learns
// it is a new session. A fork takes a fresh hostname and machine-id; the
// kernel has already reseeded its CRNG from the new vmgenid generation.
func (a *agent) restored(s *channel.Stream, req agentproto.Request) {
	var errs []string
	if req.Hostname != "" {
		if err := setHostname(req.Hostname); err != nil {
			errs = append(errs, "hostname: "+err.Error())
		}
	}
	if req.MachineID != "" {
		if err := os.WriteFile("/etc/machine-id", []byte(req.MachineID+"\n"), 0o444); err != nil {
			errs = append(errs, "machine-id: "+err.Error())
		}
	}
	a.epoch.Store(req.Epoch)
	if len(errs) > 0 {
		s.Reset("restore handshake: " + strings.Join(errs, "; "))
		return
	}
	s.CloseWrite([]byte(fmt.Sprintf("ok %d", req.Epoch)))
}

// guestPath resolves a transfer path: relative paths are relative to /root,
// the directory commands run in.
func guestPath(p string) (string, error) {
	if p == "" {
		return "", errors.New("empty guest path")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join("/root", p)
	}
	return filepath.Clean(p), nil
}

// put writes the stream's bytes to a temporary file beside the target and
// renames it into place only when the host's declared length matches, so
// an interrupted transfer never leaves a half-written file under the
// target's name.
func (a *agent) put(s *channel.Stream, req agentproto.Request) {
	path, err := guestPath(string(req.Path))
	if err != nil {
		s.Reset(err.Error())
		return
	}
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		s.Reset(fmt.Sprintf("%s is a directory", path))
		return
	}
	mode := os.FileMode(req.Mode & 0o7777)
	if mode == 0 {
		mode = 0o644
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".nether-put-*")
	if err != nil {
		s.Reset(fmt.Sprintf("creating %s: %v", path, unwrapPathError(err)))
		return
	}
	fail := func(msg string) {
		tmp.Close()
		os.Remove(tmp.Name())
		s.Reset(msg)
	}
	n, err := io.Copy(tmp, s)
	if err != nil {
		fail(fmt.Sprintf("receiving %s: %v", path, err))
		return
	}
	want, err := strconv.ParseInt(string(s.Status()), 10, 64)
	if err != nil || want != n {
		fail(fmt.Sprintf("transfer of %s incomplete: got %d bytes, host declared %q", path, n, s.Status()))
		return
	}
	if err := tmp.Chmod(mode); err != nil {
		fail(fmt.Sprintf("setting mode of %s: %v", path, err))
		return
	}
	if err := tmp.Sync(); err != nil {
		fail(fmt.Sprintf("writing %s: %v", path, err))
		return
	}
	if err := tmp.Close(); err != nil {
		fail(fmt.Sprintf("writing %s: %v", path, err))
		return
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		s.Reset(fmt.Sprintf("renaming into %s: %v", path, unwrapPathError(err)))
		return
	}
	s.CloseWrite(agentproto.OKStatus(n))
}

func (a *agent) get(s *channel.Stream, req agentproto.Request) {
	path, err := guestPath(string(req.Path))
	if err != nil {
		s.Reset(err.Error())
		return
	}
	f, err := os.Open(path)
	if err != nil {
		s.Reset(fmt.Sprintf("opening %s: %v", path, unwrapPathError(err)))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		s.Reset(fmt.Sprintf("%s is not a regular file", path))
		return
	}
	n, err := io.Copy(s, f)
	if err != nil {
		s.Reset(fmt.Sprintf("reading %s: %v", path, err))
		return
	}
	s.CloseWrite(agentproto.OKStatus(n))
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// runConsoleShell runs an interactive shell on the serial console. busybox
// setsid -c makes the console the shell's controlling terminal, so job
// control and ^C work as at any login prompt.
func runConsoleShell(r *reaper, log *slog.Logger) {
	tty, err := os.OpenFile("/dev/ttyS0", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		log.Error("agent: console shell", "err", err)
		return
	}
	defer tty.Close()
	_, done, err := r.start("/bin/busybox", []string{"setsid", "-c", "/bin/sh", "-l"}, &os.ProcAttr{
		Dir:   "/root",
		Env:   append(shellEnv[:len(shellEnv):len(shellEnv)], "PS1=sandbox# "),
		Files: []*os.File{tty, tty, tty},
	})
	if err != nil {
		log.Error("agent: console shell", "err", err)
		return
	}
	<-done
}
