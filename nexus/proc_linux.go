package nexus

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A sandbox's nether runs detached: its own session, its stdin /dev/null,
// its stdout (the final usage record) appended to nether.out and its
// stderr (the log) to nether.log in the sandbox's directory, so it
// outlives the nexus command that started it.
const (
	outFile = "nether.out"
	logFile = "nether.log"
)

// spawn starts nether in dir (which holds its nether.conf) and returns
// its pid and the start time the kernel gave it. secrets, when set, is
// the child's descriptor 3 (nether.conf's secrets_fd).
func (n *Nexus) spawn(dir string, secrets *os.File) (int, uint64, error) {
	out, err := os.OpenFile(filepath.Join(dir, outFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer out.Close()
	logf, err := os.OpenFile(filepath.Join(dir, logFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, 0, err
	}
	defer logf.Close()
	cmd := exec.Command(n.nether, "-log-level", "info")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, logf
	cmd.Env = os.Environ()
	if n.guestDir != "" {
		cmd.Env = append(cmd.Env, "NETHER_GUEST_DIR="+n.guestDir)
	}
	if secrets != nil {
		cmd.ExtraFiles = []*os.File{secrets}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, 0, fmt.Errorf("starting %s: %w", n.nether, err)
	}
	pid := cmd.Process.Pid
	// Reap it if this process outlives it (nexus serve); a CLI exits
	// first and init adopts it.
	go cmd.Wait()
	start, err := procStart(pid)
	if err != nil {
		return pid, 0, err
	}
	return pid, start, nil
}

// procStart is the start time of pid in clock ticks since boot (field 22
// of /proc/<pid>/stat): with the pid it names one process for good.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed /proc stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive says whether the process pid that started at start still runs
// (and is not a zombie).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	if s[i+2] == 'Z' || s[i+2] == 'X' {
		return false
	}
	got, err := procStart(pid)
	return err == nil && (start == 0 || got == start)
}

// terminate stops a nether: SIGTERM (it settles and prints its record),
// then SIGKILL after grace.
func terminate(pid int, start uint64, grace time.Duration) {
	if !alive(pid, start) {
		return
	}
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for alive(pid, start) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if alive(pid, start) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}

// nethersUnder lists the live processes whose working directory is a
// directory right under root (a sandbox's): the nethers nexus started,
// found without its records, so an orphan (its nexus died before it
// wrote the record) is found too.
func nethersUnder(root string) map[int]string {
	out := map[int]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || filepath.Dir(cwd) != root {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err != nil || !strings.HasPrefix(filepath.Base(exe), "nether") || strings.HasPrefix(filepath.Base(exe), "nexus") {
			continue
		}
		out[pid] = cwd
	}
	return out
}
