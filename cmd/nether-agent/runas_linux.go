package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// The run_as policy: who commands and transfers act as. It lives here, in
// guest memory, so a fork inherits its base's policy with the rest of the
// guest; a restore handshake may narrow it (root to a user) and is
// refused if it would widen or change it.

// runAsPolicy is the user commands run as: nil is root.
type runAsPolicy struct {
	user atomic.Pointer[account]
}

// get returns the policy's user, nil for root.
func (p *runAsPolicy) get() *account {
	if p == nil {
		return nil
	}
	return p.user.Load()
}

// rootName is how root is spelt in a handshake that asks for it.
const rootName = "root"

// The guest's account files, which run_as is looked up in.
const (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// narrow applies a restore's run_as: "" keeps the policy, the user the
// policy already has keeps it too, a user when the policy is root
// narrows to that user (who must exist), anything else is refused.
func (p *runAsPolicy) narrow(name, passwd, group string) error {
	cur := p.get()
	switch {
	case name == "":
		return nil
	case cur == nil && name == rootName:
		return nil
	case cur != nil && cur.name == name:
		return nil
	case cur != nil:
		return fmt.Errorf("run_as: this sandbox's base runs commands as %s; a fork may narrow run_as (root to a user) but never widen or change it (asked for %s)", cur.name, name)
	}
	u, err := lookupUser(passwd, group, name)
	if err != nil {
		return fmt.Errorf("run_as = %s: %w", name, err)
	}
	p.user.Store(&u)
	return nil
}

// lookupUser finds name in passwd and its supplementary groups in group.
func lookupUser(passwd, group, name string) (account, error) {
	u, err := lookupAccount(passwd, name)
	if err != nil {
		return u, err
	}
	if u.uid == 0 {
		// A second name for uid 0 would be root under another name: the
		// policy exists to keep commands away from it.
		return u, fmt.Errorf("%q has uid 0: run_as takes an unprivileged user (leave it unset to run as root)", name)
	}
	u.groups, err = supplementaryGroups(group, name, u.gid)
	return u, err
}

// supplementaryGroups lists the gids of the groups in a group file
// (name:x:gid:member,member) that name is a member of, besides gid.
func supplementaryGroups(path, name string, gid uint32) ([]uint32, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // an image without /etc/group: no extra groups
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close()
	var out []uint32
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) != 4 {
			continue
		}
		g, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil || uint32(g) == gid {
			continue
		}
		for _, m := range strings.Split(fields[3], ",") {
			if m == name {
				out = append(out, uint32(g))
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	return out, nil
}

// procAttr fills in how a command starts for the policy's user (nil:
// root): credentials, home directory and environment.
func commandAttr(u *account, files []*os.File) *os.ProcAttr {
	// Its own session and process group, so no command can signal the
	// agent's group or take over its terminal.
	sys := &syscall.SysProcAttr{Setsid: true}
	if u == nil {
		return &os.ProcAttr{Dir: "/root", Env: shellEnv, Files: files, Sys: sys}
	}
	sys.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	dir := u.home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/"
	}
	return &os.ProcAttr{Dir: dir, Env: userEnv(u), Files: files, Sys: sys}
}

// userEnv is shellEnv for a user.
func userEnv(u *account) []string {
	env := make([]string, 0, len(shellEnv))
	for _, kv := range shellEnv {
		switch {
		case strings.HasPrefix(kv, "HOME="):
			kv = "HOME=" + u.home
		case strings.HasPrefix(kv, "USER="):
			kv = "USER=" + u.name
		case strings.HasPrefix(kv, "LOGNAME="):
			kv = "LOGNAME=" + u.name
		}
		env = append(env, kv)
	}
	return env
}

// asUser runs f with u's file-system credentials (fsuid, fsgid and
// groups), so a transfer can reach exactly what the user's own commands
// can, and what it creates belongs to the user. nil runs f as root. f runs
// on an OS thread of its own that is never handed back: the credentials
// are the thread's (raw system calls, not Go's process-wide setuid), and
// a goroutine that exits locked to its thread takes the thread with it.
func asUser(u *account, f func() error) error {
	if u == nil {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := setThreadFSCreds(u); err != nil {
			done <- fmt.Errorf("taking %s's credentials: %w", u.name, err)
			return
		}
		done <- f()
	}()
	return <-done
}

// setThreadFSCreds sets the calling thread's groups, fsgid and fsuid.
// Changing the fsuid from 0 drops the file capabilities (DAC override and
// the rest) from the thread's effective set, so permission checks apply
// as they would to the user.
func setThreadFSCreds(u *account) error {
	groups := make([]uint32, len(u.groups)+1)
	groups[0] = u.gid
	copy(groups[1:], u.groups)
	if err := setThreadGroups(groups); err != nil {
		return err
	}
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(u.gid), 0, 0)
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(u.uid), 0, 0)
	// setfsuid reports the previous value, never an error: read back.
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); uint32(got) != u.uid {
		return fmt.Errorf("setfsuid(%d) did not take (fsuid is %d)", u.uid, got)
	}
	if got, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); uint32(got) != u.gid {
		return fmt.Errorf("setfsgid(%d) did not take (fsgid is %d)", u.gid, got)
	}
	return nil
}
