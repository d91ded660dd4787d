package qemu

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// processCPU reads another process's CPU time at nanosecond resolution,
// in step with what /proc counts in ticks.
func TestProcessCPU(t *testing.T) {
	cmd := exec.Command("sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 5")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sh to burn CPU with: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cpu, ok := processCPU(cmd.Process.Pid)
		if !ok {
			t.Fatal("processCPU could not read a child's CPU clock")
		}
		u, err := procUsage(cmd.Process.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if cpu > 200*time.Millisecond {
			// procUsage reports the precise figure; /proc's ticks agree
			// within a few of them.
			if d := u.CPU - cpu; d < -50*time.Millisecond || d > 50*time.Millisecond {
				t.Errorf("procUsage CPU %v, processCPU %v a moment before", u.CPU, cpu)
			}
			if cpu%(10*time.Millisecond) == 0 {
				t.Errorf("processCPU %v is a whole number of ticks: not the scheduler's clock", cpu)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the child used only %v of CPU", cpu)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProcessCPUOfNoProcess(t *testing.T) {
	if _, ok := processCPU(4<<20 + 1); ok { // above Linux's PID_MAX_LIMIT
		t.Error("processCPU read the clock of a process that does not exist")
	}
	if _, ok := processCPU(os.Getpid()); !ok {
		t.Error("processCPU cannot read our own clock")
	}
}
