package testharness

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// FDs lists the open file descriptors of pid, each with what it names
// (the target of its /proc/<pid>/fd link: a path, "socket:[inode]",
// "pipe:[inode]", "anon_inode:[eventpoll]", ...). A descriptor closed
// while the list is read is left out.
func FDs(pid int) (map[int]string, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	fds := make(map[int]string, len(ents))
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(dir + "/" + e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			target = "?" + err.Error()
		}
		fds[fd] = target
	}
	return fds, nil
}

// FDs lists nether's open file descriptors (see FDs). It fails once
// nether has exited: its pid may then name another process.
func (sb *Sandbox) FDs() (map[int]string, error) {
	if sb.Exited() {
		return nil, errors.New("nether has exited")
	}
	fds, err := FDs(sb.Pid())
	if err == nil && sb.Exited() {
		return nil, errors.New("nether has exited")
	}
	return fds, err
}

// FDKinds summarises a descriptor table by kind, e.g. "socket:3 pipe:2
// /dev/null:1": a path counts by itself, a socket, pipe or anonymous inode
// by its kind. Two tables with the same summary differ at most in which
// descriptor numbers and inodes they use.
func FDKinds(fds map[int]string) string {
	count := map[string]int{}
	for _, target := range fds {
		kind := target
		if i := strings.Index(target, ":["); i >= 0 && !strings.HasPrefix(target, "/") {
			kind = target[:i]
			if kind == "anon_inode" {
				kind = target // anon_inode:[eventpoll], anon_inode:[pidfd], ...
			}
		}
		count[kind]++
	}
	kinds := make([]string, 0, len(count))
	for k := range count {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var b strings.Builder
	for i, k := range kinds {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s:%d", k, count[k])
	}
	return b.String()
}
