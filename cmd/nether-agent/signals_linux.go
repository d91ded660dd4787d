package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// pid1Signals are the signals a workload can send the agent that would
// end it: the kernel delivers a signal to PID 1 only when PID 1 handles
// it, and the Go runtime handles these by exiting (SIGHUP, SIGINT,
// SIGTERM) or crashing (SIGQUIT, SIGABRT, and the fault signals when
// kill sent them). PID 1 exiting panics the guest kernel, so `kill -TERM 1`
// in a command would end the sandbox.
//
// The rest need nothing: SIGKILL and SIGSTOP never reach PID 1 from inside
// its namespace; the runtime ignores the others it handles (SIGUSR1 and the
// like included, but they are listed anyway, so no runtime change can turn
// them fatal); and the kernel drops signals PID 1 leaves at their default
// action (SIGTSTP, SIGCONT, ...). SIGCHLD is the reaper's, SIGURG and SIGPROF
// the runtime's own.
var pid1Signals = []os.Signal{
	unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP,
	unix.SIGABRT, unix.SIGBUS, unix.SIGFPE, unix.SIGUSR1, unix.SIGSEGV,
	unix.SIGUSR2, unix.SIGPIPE, unix.SIGALRM, unix.SIGTERM, unix.SIGSTKFLT,
	unix.SIGXCPU, unix.SIGXFSZ, unix.SIGVTALRM, unix.SIGIO, unix.SIGPWR,
	unix.SIGSYS,
}

// ignoreSignals makes the agent survive pid1Signals and returns a function
// that undoes it (for tests).
//
// They are caught into a channel that is drained and dropped, not ignored
// with signal.Ignore: a signal ignored (SIG_IGN) stays ignored across
// fork and exec, so every command would start unable to be stopped with
// SIGTERM or SIGINT, while a caught one returns to its default action in
// the new program. Commands start with default dispositions.
//
// Faults the agent itself causes still crash it as before: the runtime
// hands a channel only signals sent by kill.
func ignoreSignals() (stop func()) {
	ch := make(chan os.Signal, 16)
	signal.Notify(ch, pid1Signals...)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				// Dropped without a word: a workload that sends a stream
				// of them must not be able to flood the console log.
			case <-done:
				return
			}
		}
	}()
	return func() {
		signal.Stop(ch)
		close(done)
	}
}
