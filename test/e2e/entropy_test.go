package e2e

import (
	"strings"
	"testing"
)

// TestGuestEntropyFromHost: the guest's hardware RNG is the host's
// virtio-rng device, so its CRNG is fed host entropy from boot, whatever
// the CPU model (RDRAND is not on every one), and it reads from it.
func TestGuestEntropyFromHost(t *testing.T) {
	t.Parallel()
	needGuest(t)
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	if got := strings.TrimSpace(mustRun(t, c, "cat /sys/class/misc/hw_random/rng_current")); got != "virtio_rng.0" {
		t.Fatalf("the guest's current hwrng is %q, want virtio_rng.0", got)
	}
	// Reading the device directly proves the host end answers.
	if got := strings.TrimSpace(mustRun(t, c, "head -c 32 /dev/hwrng | wc -c")); got != "32" {
		t.Fatalf("read %s bytes from /dev/hwrng, want 32", got)
	}
}
