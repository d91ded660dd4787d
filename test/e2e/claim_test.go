package e2e

// __claim__ against real guests: forks of the shared base stand for a
// warm pool, and each is handed over with a new identity.

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// guestFacts is what a guest says of its own identity.
type guestFacts struct{ hostname, etcHostname, machineID string }

func factsOf(t *testing.T, c *client.Client) guestFacts {
	t.Helper()
	out := mustRun(t, c, "hostname; cat /etc/hostname /etc/machine-id")
	f := strings.Split(strings.TrimSpace(out), "\n")
	if len(f) != 3 {
		t.Fatalf("hostname and identity files: %q", out)
	}
	return guestFacts{f[0], f[1], f[2]}
}

// claimedLog is nether's log line for a claim, with its timings.
var claimedLog = regexp.MustCompile(`msg=claimed sandbox=(\S+) hostname=(\S+) was=\S+ claim_ms=([0-9.]+) reseed_ms=([0-9.]+) handshake_ms=([0-9.]+)`)

// TestClaim: two forks of the shared base are claimed. Each guest takes
// its new hostname (kernel, /etc/hostname) and a machine-id neither it
// nor the other had; __info__ and the timeline tell the new identity with
// the lineage unchanged; commands run in the claimed session (its new
// epoch); a second claim is refused.
//
// The second pool member kept the base's VM generation (fork_reseed = 0)
// and is claimed all the same: a claim's OK means the guest kernel took
// the agent's RNDRESEEDCRNG. Nothing inside the guest shows a reseed
// happened (the kernel logs only the vmgenid one), and comparing urandom
// bytes of siblings does not either: two fork_reseed=0 siblings of this
// base already read different bytes before any claim, their kernels
// having reseeded on their own early-boot timer.
func TestClaim(t *testing.T) {
	t.Parallel()
	art := sharedBase(t)
	confs := [][]string{nil, {"fork_reseed = 0"}}
	pool := make([]*sandbox, len(confs))
	clients := make([]*client.Client, len(pool))
	machineIDs := map[string]string{}
	for i := range pool {
		// What a pool saves: a restore, from the process start to the
		// first command answered, measured here beside the claim.
		restoreBegan := time.Now()
		sb := forkOf(t, art, confs[i]...)
		c := sb.dial()
		mustRun(t, c, "true")
		restoreTook := time.Since(restoreBegan)
		pool[i], clients[i] = sb, c
		before := factsOf(t, c)
		info := sb.info(c)
		if info["claimed"] != "0" || info["hostname"] != before.hostname {
			t.Fatalf("pool member %d before its claim: __info__ claimed=%q hostname=%q, guest %+v", i, info["claimed"], info["hostname"], before)
		}
		machineIDs[before.machineID] = fmt.Sprintf("pool member %d before its claim", i)
		id, host := fmt.Sprintf("e2e-claim-%d", i), fmt.Sprintf("claimed-%d", i)
		began := time.Now()
		body, exit := run(t, c, "__claim__ "+id+" "+host)
		took := time.Since(began)
		if want := "OK claimed " + id + " " + host + "\n"; exit != 0 || body != want {
			t.Fatalf("__claim__ %s %s: %q exit %d, want %q exit 0", id, host, body, exit, want)
		}

		after := factsOf(t, c)
		if after.hostname != host || after.etcHostname != host {
			t.Errorf("pool member %d after its claim: hostname %q, /etc/hostname %q; want %s", i, after.hostname, after.etcHostname, host)
		}
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(after.machineID) {
			t.Errorf("pool member %d's machine-id after its claim is %q, want 32 hex digits", i, after.machineID)
		}
		if was, dup := machineIDs[after.machineID]; dup {
			t.Errorf("pool member %d's machine-id after its claim, %s, was %s's", i, after.machineID, was)
		}
		machineIDs[after.machineID] = fmt.Sprintf("claim %d", i)
		info = sb.info(c)
		for k, want := range map[string]string{
			"sandbox_id": id, "hostname": host, "claimed": "1",
			"parent": sharedID, "generation": "1", "snapshot": art,
		} {
			if info[k] != want {
				t.Errorf("pool member %d after its claim: __info__ %s=%q, want %q", i, k, info[k], want)
			}
		}
		events, err := c.Events(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if !hasEvent(events, "LIFE", "claimed sandbox="+id+" hostname="+host) {
			t.Errorf("pool member %d's timeline lacks the claim: %+v", i, events)
		}
		logged := claimedLog.FindStringSubmatch(sb.stderr.String())
		if logged == nil || logged[1] != id || logged[2] != host {
			t.Errorf("nether's log lacks the claim of %s: %v", id, logged)
		} else {
			t.Logf("pool member %d: __claim__ answered in %s (nether: claim_ms=%s reseed_ms=%s handshake_ms=%s); its restore took %s to its first command",
				i, took.Round(100*time.Microsecond), logged[3], logged[4], logged[5], restoreTook.Round(time.Millisecond))
		}

		body, exit = run(t, c, "__claim__ e2e-claim-again again")
		if exit != -1 || !strings.HasPrefix(body, "ERR claim: already claimed, as "+id) {
			t.Errorf("a second claim of pool member %d: %q exit %d, want ERR claim: already claimed", i, body, exit)
		}
		if got := factsOf(t, c); got != after {
			t.Errorf("a refused second claim changed pool member %d: %+v -> %+v", i, after, got)
		}
	}
	for i, sb := range pool {
		shutdown(t, sb, clients[i])
	}
}

// hasEvent reports whether events hold one of kind with exactly text.
func hasEvent(events client.Events, kind, text string) bool {
	for _, e := range events.Lines {
		if e.Kind == kind && e.Text == text {
			return true
		}
	}
	return false
}
