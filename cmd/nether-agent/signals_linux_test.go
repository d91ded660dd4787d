package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// signalHelperEnv makes TestSignalHelper, run in a child copy of the test
// binary, send itself signals: surviving them is what PID 1 must do, and
// failing to would otherwise kill the whole test run.
const signalHelperEnv = "NETHER_AGENT_TEST_SIGNAL_HELPER"

// TestSignalHelper is not a test on its own; see runSignalHelper.
func TestSignalHelper(t *testing.T) {
	mode := os.Getenv(signalHelperEnv)
	if mode == "" {
		t.Skip("helper process for TestPID1SurvivesSignals")
	}
	if mode == "agent" {
		ignoreSignals()
	}
	for _, sig := range pid1Signals {
		fmt.Printf("sending %v\n", sig)
		// kill(2) as a workload would send it: si_code SI_USER.
		if err := unix.Kill(os.Getpid(), sig.(unix.Signal)); err != nil {
			fmt.Printf("kill: %v\n", err)
			os.Exit(3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("survived")
	os.Exit(0)
}

// runSignalHelper runs TestSignalHelper in a child process.
func runSignalHelper(t *testing.T, mode string) (string, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSignalHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), signalHelperEnv+"="+mode)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestPID1SurvivesSignals sends the agent, set up as main sets up PID 1,
// every signal a workload could kill it with.
func TestPID1SurvivesSignals(t *testing.T) {
	out, err := runSignalHelper(t, "agent")
	if err != nil || !strings.HasSuffix(out, "survived\n") {
		t.Fatalf("agent did not survive its signals: %v\n%s", err, out)
	}

	// The control: without ignoreSignals the first signal (SIGHUP) ends
	// the process, so the check above can fail.
	out, err = runSignalHelper(t, "plain")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || strings.Contains(out, "survived") {
		t.Fatalf("a plain Go process survived SIGHUP (err %v); the test proves nothing\n%s", err, out)
	}
}

// TestCommandsGetDefaultSignals checks that what the agent does to survive
// signals does not leak into the commands it starts: a command must die of
// SIGTERM as anywhere else, and start with no signal ignored or blocked.
func TestCommandsGetDefaultSignals(t *testing.T) {
	stop := ignoreSignals()
	t.Cleanup(stop)
	ta := startAgent(t)

	for _, tc := range []struct {
		sig  string
		want int
	}{
		{"TERM", 128 + int(unix.SIGTERM)},
		{"INT", 128 + int(unix.SIGINT)},
		{"HUP", 128 + int(unix.SIGHUP)},
		{"USR1", 128 + int(unix.SIGUSR1)},
		{"USR2", 128 + int(unix.SIGUSR2)},
		{"PIPE", 128 + int(unix.SIGPIPE)},
		{"ALRM", 128 + int(unix.SIGALRM)},
	} {
		t.Run(tc.sig, func(t *testing.T) {
			r := ta.do(t, agentproto.Request{Op: agentproto.OpExec, Command: agentproto.Text("kill -" + tc.sig + " $$; echo survived")}, "")
			if r.err != nil || r.out != "" || r.status != strconv.Itoa(tc.want) {
				t.Fatalf("kill -%s $$: out %q, status %q, err %v; want no output and exit %d", tc.sig, r.out, r.status, r.err, tc.want)
			}
		})
	}

	t.Run("dispositions", func(t *testing.T) {
		// The process the agent started, after exec: what a command
		// inherits. (Reading the shell's mask from a child races with the
		// shell blocking signals around its fork.)
		r := ta.do(t, agentproto.Request{Op: agentproto.OpExec, Command: "exec cat /proc/self/status"}, "")
		if r.err != nil || r.status != "0" {
			t.Fatalf("reading the command's status: %q %v", r.status, r.err)
		}
		masks := map[string]uint64{}
		sc := bufio.NewScanner(strings.NewReader(r.out))
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if ok && (k == "SigIgn" || k == "SigBlk") {
				m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					t.Fatalf("%s: %v", sc.Text(), err)
				}
				masks[k] = m
			}
		}
		if len(masks) != 2 {
			t.Fatalf("no SigIgn/SigBlk in\n%s", r.out)
		}
		for _, sig := range pid1Signals {
			bit := uint64(1) << (uint(sig.(unix.Signal)) - 1)
			for k, m := range masks {
				if m&bit != 0 {
					t.Errorf("the command starts with %v in %s (%016x)", sig, k, m)
				}
			}
		}
	})
}
