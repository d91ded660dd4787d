package main

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper waits for every child, including the orphans a PID 1 inherits,
// and hands the status of the children we started to whoever waits for
// them. One place calls wait4, so no exit status is stolen from another
// waiter (os/exec's Wait would race with an orphan reaper).
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
	sigs    chan os.Signal
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan unix.WaitStatus{}, sigs: make(chan os.Signal, 1)}
	signal.Notify(r.sigs, unix.SIGCHLD)
	return r
}

// start starts a process and returns its pid and a channel that gets its
// exit status. The lock is held across the start so the reaper cannot see
// the exit before the waiter is registered.
//
// The os.Process is released at once: it holds a pidfd that only its Wait
// (never called: the reaper waits) or the garbage collector would close,
// and PID 1 would run out of descriptors after a few thousand commands.
func (r *reaper) start(argv0 string, argv []string, attr *os.ProcAttr) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(argv0, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	pid := p.Pid
	p.Release()
	ch := make(chan unix.WaitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

func (r *reaper) run() {
	for range r.sigs {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			r.mu.Lock()
			if ch, ok := r.waiters[pid]; ok {
				ch <- ws
				delete(r.waiters, pid)
			}
			r.mu.Unlock()
		}
	}
}

// exitCode turns a wait status into a shell-style exit code: the code, or
// 128+signal for a process killed by a signal.
func exitCode(ws unix.WaitStatus) int {
	switch {
	case ws.Exited():
		return ws.ExitStatus()
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return 255
}
