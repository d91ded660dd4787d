package testharness

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is one process as /proc shows it.
type Proc struct {
	Pid   int
	PPid  int
	State byte // R, S, D, T (stopped), Z (zombie), ...
	Comm  string
	Args  []string
	// StartTicks is the start time in clock ticks since boot: with Pid it
	// names one process, even after the pid is reused.
	StartTicks uint64
}

func (p Proc) String() string {
	return fmt.Sprintf("pid %d (%s, state %c, ppid %d): %s", p.Pid, p.Comm, p.State, p.PPid, strings.Join(p.Args, " "))
}

// ReadProc reads /proc/<pid>.
func ReadProc(pid int) (Proc, error) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return Proc{}, err
	}
	// pid (comm) state ppid ... ; comm may hold spaces and parentheses.
	open, close := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
	if open < 0 || close < open {
		return Proc{}, fmt.Errorf("%s/stat: malformed", dir)
	}
	f := strings.Fields(string(stat[close+1:]))
	if len(f) < 20 {
		return Proc{}, fmt.Errorf("%s/stat: malformed", dir)
	}
	p := Proc{Pid: pid, Comm: string(stat[open+1 : close]), State: f[0][0]}
	p.PPid, _ = strconv.Atoi(f[1])
	p.StartTicks, _ = strconv.ParseUint(f[19], 10, 64)
	// A process inside execve, or a kernel thread, has an empty command
	// line: Args stays nil.
	if b, err := os.ReadFile(dir + "/cmdline"); err == nil && len(b) > 0 {
		p.Args = strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	}
	return p, nil
}

// Alive reports whether p still runs: the same process (pid and start
// time) exists and is not a zombie.
func (p Proc) Alive() bool {
	now, err := ReadProc(p.Pid)
	return err == nil && now.StartTicks == p.StartTicks && now.State != 'Z'
}

// Signal sends sig to p if it is still the same process.
func (p Proc) Signal(sig syscall.Signal) error {
	now, err := ReadProc(p.Pid)
	if err != nil || now.StartTicks != p.StartTicks {
		return os.ErrProcessDone
	}
	return syscall.Kill(p.Pid, sig)
}

// IsQEMU reports whether p runs a qemu-system binary.
func (p Proc) IsQEMU() bool {
	if strings.HasPrefix(p.Comm, "qemu-system") {
		return true
	}
	return len(p.Args) > 0 && strings.HasPrefix(filepath.Base(p.Args[0]), "qemu-system")
}

// IsProbe reports whether p is the short-lived QEMU nether starts to ask
// for its version (no guest: -machine none), not a machine.
func (p Proc) IsProbe() bool {
	for i := 0; i+1 < len(p.Args); i++ {
		if p.Args[i] == "-machine" && p.Args[i+1] == "none" {
			return true
		}
	}
	return false
}

// Children lists the live (non-zombie) child processes of pid: those
// whose parent pid is pid. It reads each of pid's threads' children
// lists and checks every entry's ppid; it falls back to a scan of /proc
// where those lists are not available.
func Children(pid int) ([]Proc, error) {
	var cands []int
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	haveLists := true
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		if errors.Is(err, os.ErrNotExist) {
			haveLists = false
			break
		}
		if err != nil {
			continue // the thread ended
		}
		for _, s := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(s); err == nil {
				cands = append(cands, c)
			}
		}
	}
	if !haveLists {
		cands = allPids()
	}
	var out []Proc
	for _, c := range cands {
		p, err := ReadProc(c)
		if err != nil || p.PPid != pid || p.State == 'Z' {
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

func allPids() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// QEMUChildren lists nether's live QEMU children (the version probe
// included) and remembers them for Survivors.
func (sb *Sandbox) QEMUChildren() []Proc {
	if sb.Exited() {
		return nil // its pid may already name another process
	}
	kids, _ := Children(sb.Pid())
	var out []Proc
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, k := range kids {
		if k.IsQEMU() {
			out = append(out, k)
			sb.seen[k.Pid] = k
		}
	}
	return out
}

// Machine returns the QEMU child that runs the guest (not the version
// probe), if there is one now.
func (sb *Sandbox) Machine() (Proc, bool) {
	for _, p := range sb.QEMUChildren() {
		// A child caught inside execve already has its new name but no
		// command line yet: it cannot be told from the probe until
		// its arguments are readable.
		if len(p.Args) > 0 && !p.IsProbe() {
			return p, true
		}
	}
	return Proc{}, false
}

// WaitMachine polls for the guest's QEMU child every poll until timeout.
func (sb *Sandbox) WaitMachine(timeout, poll time.Duration) (Proc, error) {
	deadline := time.Now().Add(timeout)
	for {
		if p, ok := sb.Machine(); ok {
			return p, nil
		}
		if sb.Exited() {
			return Proc{}, fmt.Errorf("nether exited (%v) without a QEMU child", sb.err)
		}
		if time.Now().After(deadline) {
			return Proc{}, fmt.Errorf("no QEMU child of nether %d within %s", sb.Pid(), timeout)
		}
		time.Sleep(poll)
	}
}

// Survivors lists the processes, other than nether itself, that still
// run with this sandbox's private TMPDIR in their environment (which
// every process nether starts inherits), together with every QEMU child
// seen earlier that still runs. Once nether has ended the list should be
// empty.
func (sb *Sandbox) Survivors() []Proc {
	found := map[int]Proc{}
	sb.mu.Lock()
	for _, p := range sb.seen {
		if p.Alive() {
			found[p.Pid] = p
		}
	}
	sb.mu.Unlock()
	mark := []byte("TMPDIR=" + sb.TmpDir + "\x00")
	self := os.Getpid()
	for _, pid := range allPids() {
		if pid == self || (!sb.Exited() && pid == sb.Pid()) {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		// Match whole entries: NUL-fenced on both sides.
		hay := append(append([]byte{0}, env...), 0)
		if err != nil || !bytes.Contains(hay, append([]byte{0}, mark...)) {
			continue
		}
		if p, err := ReadProc(pid); err == nil && p.State != 'Z' {
			found[pid] = p
		}
	}
	out := make([]Proc, 0, len(found))
	for _, p := range found {
		out = append(out, p)
	}
	return out
}

// WaitNoSurvivors waits up to timeout for Survivors to be empty (a
// process killed by its parent's death takes a moment to go) and returns
// whatever still runs.
func (sb *Sandbox) WaitNoSurvivors(timeout time.Duration) []Proc {
	deadline := time.Now().Add(timeout)
	for {
		s := sb.Survivors()
		if len(s) == 0 || time.Now().After(deadline) {
			return s
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Listening reports whether a Unix socket bound at path is listening, as
// /proc/net/unix shows it.
func Listening(path string) (bool, error) { return listeningIn("/proc/net/unix", path) }

// ListeningIn is Listening as process pid sees it: in pid's network
// namespace (Unix sockets are listed per namespace).
func ListeningIn(pid int, path string) (bool, error) {
	return listeningIn(fmt.Sprintf("/proc/%d/net/unix", pid), path)
}

func listeningIn(table, path string) (bool, error) {
	f, err := os.Open(table)
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	sc.Scan() // header
	const acceptCon = 1 << 16
	for sc.Scan() {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(sc.Text())
		if len(f) < 8 || strings.Join(f[7:], " ") != path {
			continue
		}
		flags, err := strconv.ParseUint(f[3], 16, 32)
		if err == nil && flags&acceptCon != 0 {
			return true, nil
		}
	}
	return false, sc.Err()
}

// RSSKiB is a process's resident set in KiB, 0 when it cannot be read.
func RSSKiB(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
