package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The serial console shell: in control mode nobody logs in, but the
// console is still what __screen__ shows, so it carries a login shell as
// a getty would, started again whenever it exits.

// consoleShell is a login shell kept running on a terminal.
type consoleShell struct {
	tty   string  // the terminal device, e.g. /dev/ttyS0
	shell string  // the shell binary
	user  account // who the shell runs as without a run_as policy
	// policy, when it names a user, is who the shell runs as instead: a
	// fork that narrows run_as gets its console shell as that user too.
	policy *runAsPolicy
	delay  backoff // between one shell's exit and the next start
	log    *slog.Logger
	pid    atomic.Int64 // the running shell, 0 between shells
}

// startConsoleShell keeps a login shell on the serial console for the
// life of the guest, as root or as the run_as policy's user. A guest
// whose run_as could not be resolved (policyFailed) gets no shell: falling
// back to root would hand the console to the one user it was meant not
// to be.
func startConsoleShell(r *reaper, log *slog.Logger, policy *runAsPolicy, policyFailed bool) *consoleShell {
	if policyFailed {
		log.Error("agent: no console shell: the run_as user is unknown")
		return nil
	}
	active, _ := os.ReadFile("/sys/class/tty/console/active")
	sh := &consoleShell{
		tty:    consoleDevice(string(active)),
		shell:  "/bin/sh",
		user:   account{name: "root", home: "/root"},
		policy: policy,
		delay:  backoff{min: 500 * time.Millisecond, max: 30 * time.Second, stable: 10 * time.Second},
		log:    log,
	}
	go sh.run(context.Background(), r)
	return sh
}

// restart ends the running shell (its whole session), so the next one
// starts as the policy now says.
func (c *consoleShell) restart() {
	if c == nil {
		return
	}
	if pid := c.pid.Load(); pid > 0 {
		unix.Kill(-int(pid), unix.SIGKILL)
	}
}

// consoleDevice is the device /dev/console writes to: the last of the
// kernel's active consoles (console=ttyS0 makes it ttyS0). The shell
// needs the device itself: /dev/console cannot be a controlling terminal
// the shell can use for job control.
func consoleDevice(active string) string {
	f := strings.Fields(active)
	if len(f) == 0 {
		return "/dev/ttyS0"
	}
	return "/dev/" + f[len(f)-1]
}

// run starts the shell, waits for it and starts it again, until ctx is
// done (checked between shells: a running shell is never killed for it).
func (c *consoleShell) run(ctx context.Context, r *reaper) {
	for ctx.Err() == nil {
		started := time.Now()
		ws, err := c.runOnce(r)
		if err != nil {
			c.log.Error("agent: console shell", "tty", c.tty, "err", err)
		} else {
			c.log.Info("agent: console shell exited", "tty", c.tty, "code", exitCode(ws))
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.delay.next(time.Since(started))):
		}
	}
}

// runOnce runs one shell to its end. The shell leads a new session with
// the terminal as its controlling terminal (setsid, TIOCSCTTY), so ^C,
// ^Z and job control work, and the reaper hands its exit status here (the
// reaper is the agent's one wait4 caller). The agent keeps no descriptor
// of the terminal: when the shell exits the kernel hangs up every one
// still open, and the next shell opens it afresh.
func (c *consoleShell) runOnce(r *reaper) (unix.WaitStatus, error) {
	tty, err := os.OpenFile(c.tty, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return 0, fmt.Errorf("opening the terminal: %w", err)
	}
	defer tty.Close()
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	user := c.user
	if u := c.policy.get(); u != nil {
		user = *u
	}
	if user.uid != 0 || user.gid != 0 {
		// As login does: the user owns the terminal it logs in on.
		if err := tty.Chown(int(user.uid), int(user.gid)); err != nil {
			return 0, fmt.Errorf("giving %s the terminal: %w", user.name, err)
		}
		sys.Credential = &syscall.Credential{Uid: user.uid, Gid: user.gid, Groups: user.groups}
	}
	dir := user.home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	// argv[0] "-sh" makes it a login shell.
	pid, done, err := r.start(c.shell, []string{"-sh"}, &os.ProcAttr{
		Dir:   dir,
		Env:   user.environ(),
		Files: []*os.File{tty, tty, tty},
		Sys:   sys,
	})
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", c.shell, err)
	}
	c.pid.Store(int64(pid))
	defer c.pid.Store(0)
	tty.Close()
	return <-done, nil
}

// account is a user from /etc/passwd.
type account struct {
	name     string
	uid, gid uint32
	groups   []uint32 // supplementary groups, from /etc/group
	home     string
}

// environ is the environment of the user's console shell.
func (a account) environ() []string {
	return []string{
		"PATH=/bin:/sbin:/usr/bin:/usr/sbin",
		"HOME=" + a.home,
		"USER=" + a.name,
		"LOGNAME=" + a.name,
		"SHELL=/bin/sh",
		"TERM=linux",
		"LANG=C.UTF-8",
		`PS1=\u@\h:\w\$ `,
	}
}

var errNoSuchUser = errors.New("no such user")

// lookupAccount finds name in a passwd file (name:x:uid:gid:gecos:home:shell).
func lookupAccount(passwd, name string) (account, error) {
	f, err := os.Open(passwd)
	if err != nil {
		return account{}, fmt.Errorf("looking up %q: %w", name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) != 7 || fields[0] != name || name == "" {
			continue
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return account{}, fmt.Errorf("%s: entry of %q: %w", passwd, name, err)
		}
		return account{name: name, uid: uint32(uid), gid: uint32(gid), home: fields[5]}, nil
	}
	if err := sc.Err(); err != nil {
		return account{}, fmt.Errorf("reading %s: %w", passwd, err)
	}
	return account{}, fmt.Errorf("%q in %s: %w", name, passwd, errNoSuchUser)
}

// backoff spaces the starts of a shell that keeps exiting: each start
// after a short-lived shell waits twice as long as the last, up to max; a
// shell that ran for stable or longer was in use, and the next starts
// after min. So a shell that dies at once (a broken binary, a user whose
// shell cannot start) costs one start per max, not a spinning PID 1.
type backoff struct {
	min, max, stable time.Duration
	cur              time.Duration
}

// next returns the wait before the next start, given how long the last
// shell ran.
func (b *backoff) next(ran time.Duration) time.Duration {
	if b.cur == 0 || ran >= b.stable {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return b.cur
}

// clearDisplay clears the first virtual terminal, which a display
// (gpu = 1) shows: the firmware's boot banner is still on it, and the
// guest's programs should start on a blank screen. Without a display the
// terminal is the kernel's dummy console and the write costs nothing.
func clearDisplay() {
	f, err := os.OpenFile("/dev/tty1", os.O_WRONLY|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString("\x1b[H\x1b[2J")
}
