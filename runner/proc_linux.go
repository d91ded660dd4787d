package runner

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

	"golang.org/x/sys/unix"
)

// Spawn starts nether (the binary) in dir, detached: its own session,
// stdin /dev/null, stdout appended to Stdout and stderr to Stderr there,
// with env added to this process's environment. extra, when set, is the
// child's descriptor 3. It returns the process's pid and start time.
func Spawn(nether, dir string, env []string, extra *os.File) (Proc, error) {
	out, err := os.OpenFile(filepath.Join(dir, Stdout), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Proc{}, err
	}
	defer out.Close()
	logf, err := os.OpenFile(filepath.Join(dir, Stderr), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return Proc{}, err
	}
	defer logf.Close()
	cmd := exec.Command(nether, "-log-level", "info")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = out, logf
	cmd.Env = append(os.Environ(), env...)
	if extra != nil {
		cmd.ExtraFiles = []*os.File{extra}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("starting %s: %w", nether, err)
	}
	pid := cmd.Process.Pid
	// Reap it if this process outlives it (nexus serve); a CLI exits
	// first and init adopts it.
	go cmd.Wait()
	start, err := procStart(pid)
	if err != nil {
		return Proc{PID: pid}, err
	}
	return Proc{PID: pid, Start: start}, nil
}

// secretsFile is a sealed memory file holding b, never on disk.
func secretsFile(b []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("nether-secrets", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("a memory file for the secrets: %w", err)
	}
	f := os.NewFile(uintptr(fd), "nether-secrets")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return nil, fmt.Errorf("writing the secrets to a memory file: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		f.Close()
		return nil, err
	}
	unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE|unix.F_SEAL_GROW|unix.F_SEAL_SHRINK|unix.F_SEAL_SEAL)
	return f, nil
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

// Alive says whether p still runs (and is not a zombie). A zero Start
// matches any process with p's pid.
func Alive(p Proc) bool {
	if p.PID <= 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/stat")
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
	got, err := procStart(p.PID)
	return err == nil && (p.Start == 0 || got == p.Start)
}

// Terminate stops p: SIGTERM (nether settles and prints its record),
// then SIGKILL after grace.
func Terminate(p Proc, grace time.Duration) {
	if !Alive(p) {
		return
	}
	syscall.Kill(p.PID, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for Alive(p) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if Alive(p) {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// NethersUnder lists the live nether processes whose working directory
// is a directory right under root, with that directory.
func NethersUnder(root string) map[Proc]string {
	out := map[Proc]string{}
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
		start, _ := procStart(pid)
		out[Proc{PID: pid, Start: start}] = cwd
	}
	return out
}
