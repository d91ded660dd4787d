package e2e

// Channel faults a guest can cause itself, as root: scribbling over the
// bulk lane's memory while a transfer uses it, and removing the
// channel's PCI device. Neither may leave a command hanging: the lane
// recovers (its frames go again through the port), and a channel whose
// device is gone ends the sandbox with reason=error and a log line that
// says so.

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// laneDevice prints the sysfs directory of the bulk lane's PCI device
// (QEMU's ivshmem, 1af4:1110).
const laneDevice = `for d in /sys/bus/pci/devices/*; do [ "$(cat $d/vendor):$(cat $d/device)" = 0x1af4:0x1110 ] && echo $d; done; true`

// channelDevice prints the sysfs directory of the PCI device behind the
// channel's virtio-serial port (named nether.channel).
const channelDevice = `for p in /sys/class/virtio-ports/*; do [ "$(cat $p/name)" = nether.channel ] && readlink -f $p/device/..; done; true`

// scribbler overwrites random 4 KiB runs of a PCI BAR (argv[1]) with
// random bytes for argv[2] seconds, then prints how many runs it wrote.
// It creates /tmp/scribbling once the BAR is mapped.
const scribbler = `import mmap, os, random, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_SYNC)
size = os.fstat(fd).st_size
m = mmap.mmap(fd, size)
open("/tmp/scribbling", "w").close()
end = time.time() + float(sys.argv[2])
n = 0
while time.time() < end:
    off = random.randrange(0, size - 4096)
    m[off:off + 4096] = os.urandom(4096)
    n += 1
print(n)
`

// TestChannelLaneScribble: a guest that scribbles over the whole bulk
// lane for 10 s while 32 MiB transfers run both ways loses nothing on
// the host: nether refuses the batches whose bytes changed and has them
// sent again through the port, so every __get__ arrives whole and every
// __put__ answers, commands answer at once during and after the
// scribbling, and a snapshot is taken once it stops.
func TestChannelLaneScribble(t *testing.T) {
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	dev := strings.TrimSpace(mustRun(t, c, laneDevice))
	if dev == "" {
		t.Fatal("no bulk lane device (1af4:1110) in the guest")
	}
	if err := os.WriteFile(filepath.Join(sb.dir, "scribble.py"), []byte(scribbler), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "__put__ scribble.py /tmp/scribble.py")
	mustRun(t, c, "head -c 32M /dev/urandom > /tmp/big")
	sum := strings.Fields(mustRun(t, c, "sha256sum /tmp/big"))[0]
	mustRun(t, c, "__get__ /tmp/big big.bin")
	// The scribbler runs beside the transfers, detached from the command
	// that starts it.
	mustRun(t, c, fmt.Sprintf("setsid python3 /tmp/scribble.py %s/resource2 10 > /tmp/scribbled 2>&1 < /dev/null &", dev))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, exit, err := runFor(t, c, "test -e /tmp/scribbling", 10*time.Second); err == nil && exit == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scribbler did not start within 30 s")
		}
	}
	scribbled := func() string {
		out, _, err := runFor(t, c, "cat /tmp/scribbled", 10*time.Second)
		if err != nil {
			t.Fatalf("cat /tmp/scribbled: %v", err)
		}
		return strings.TrimSpace(out)
	}
	// Transfers both ways, and a command between, until the scribbler is
	// done: each must answer, and each __get__ arrive whole.
	deadline := time.Now().Add(60 * time.Second)
	for round := 1; ; round++ {
		for _, line := range []string{"__get__ /tmp/big out.bin", "__put__ big.bin /tmp/put", "echo ok"} {
			began := time.Now()
			body, exit, err := runFor(t, c, line, 60*time.Second)
			took := time.Since(began)
			t.Logf("round %d: %s: %q exit %d err %v after %s", round, line, tail(body, 60), exit, err, took.Round(time.Millisecond))
			if err != nil || exit != 0 || took > 20*time.Second {
				t.Fatalf("round %d: %s: %q exit %d err %v after %s (want it answered within 20 s)", round, line, body, exit, err, took.Round(time.Millisecond))
			}
		}
		if b, err := os.ReadFile(filepath.Join(sb.dir, "out.bin")); err != nil || fmt.Sprintf("%x", sha256.Sum256(b)) != sum {
			t.Fatalf("round %d: __get__ answered OK but the host copy differs from the guest's file (%d bytes, err %v)", round, len(b), err)
		}
		if n := scribbled(); n != "" {
			t.Logf("the scribbler wrote %s runs of 4 KiB", n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the scribbler did not finish within 60 s")
		}
	}
	logged := sb.stderr.String()
	refusals, asks := strings.Count(logged, "refused bulk lane"), strings.Count(logged, "asking the peer to send them again")
	t.Logf("nether's log on the lane: %d refusal warnings, %d resend requests", refusals, asks)
	if refusals == 0 || asks == 0 {
		t.Fatalf("the scribbling never hit a batch nether read (refusals %d, resend requests %d): the test did not test", refusals, asks)
	}
	// After the scribbling: the guest's file is intact, transfers arrive
	// whole, and nothing pins the sandbox.
	if body := mustRun(t, c, "sha256sum /tmp/big"); !strings.HasPrefix(body, sum) {
		t.Fatalf("the guest's file changed: %q", body)
	}
	mustRun(t, c, "__put__ big.bin /tmp/put")
	if body := mustRun(t, c, "sha256sum /tmp/put"); !strings.HasPrefix(body, sum) {
		t.Fatalf("a __put__ after the scribbling stored other bytes: %q", body)
	}
	mustRun(t, c, "__get__ /tmp/big again.bin")
	if b, err := os.ReadFile(filepath.Join(sb.dir, "again.bin")); err != nil || fmt.Sprintf("%x", sha256.Sum256(b)) != sum {
		t.Fatalf("the __get__ after the scribbling differs (%d bytes, err %v)", len(b), err)
	}
	okSnapshot(t, c, "after-scribble")
	shutdown(t, sb, c)
}

// TestChannelDeviceRemoved: a guest that removes the PCI device behind
// the channel can no longer be driven. The command that removed it, and
// any command after, end with an ERR within seconds, and the sandbox
// ends with reason=error and a log line naming the silent channel.
func TestChannelDeviceRemoved(t *testing.T) {
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	dev := strings.TrimSpace(mustRun(t, c, channelDevice))
	if !strings.HasPrefix(dev, "/sys/devices/pci") {
		t.Fatalf("no PCI device behind the channel's port: %q", dev)
	}
	c.Close()
	rc := rawPrimary(t, sb)
	began := time.Now()
	rc.send(t, "echo 1 > "+dev+"/remove; sleep 1; echo removed")
	all, err := readToEOF(rc, 60*time.Second)
	answered := time.Since(began)
	if err != nil {
		t.Fatalf("the reply to the removal did not end within 60 s: %v (got %q)", err, all)
	}
	errLine := stoppedReply(t, all, "")
	line := sb.wait(60 * time.Second)
	ended := time.Since(began)
	t.Logf("device removed: reply %q after %s; nether ended after %s: %s", errLine, answered.Round(time.Millisecond), ended.Round(time.Millisecond), line)
	if reasonOf(line) != "error" {
		t.Errorf("final record %q, want reason=error", line)
	}
	if !strings.Contains(errLine, "channel") {
		t.Errorf("reply %q: want the ERR to name the channel", errLine)
	}
	if answered > 20*time.Second {
		t.Errorf("the ERR came %s after the removal, want within 20 s", answered.Round(time.Millisecond))
	}
	if !strings.Contains(sb.stderr.String(), "the guest stopped answering on the channel") {
		t.Errorf("nether's log does not say the channel went silent:\n%s", tail(sb.stderr.String(), 4000))
	}
	sb.checkNoLeftovers()
}
