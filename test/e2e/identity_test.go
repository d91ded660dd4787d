package e2e

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestInfoLineage: __info__ tells who a sandbox is and where it came
// from. A boot is generation 0 with no parent and no snapshot; a fork is
// one generation on from its base, names the base's sandbox_id as parent
// and the artifact it restored; a sandbox_id and hostname handed in
// through nether.conf are reported verbatim (and the guest carries the
// hostname); a woken park keeps its sandbox_id and goes one generation
// on. The subtests run in order: the park of one is woken by the next.
func TestInfoLineage(t *testing.T) {
	t.Parallel()
	art := sharedBase(t)
	type want map[string]string
	check := func(t *testing.T, info map[string]string, w want) {
		t.Helper()
		for k, v := range w {
			if info[k] != v {
				t.Errorf("__info__ %s=%q, want %q", k, info[k], v)
			}
		}
	}
	outer := t
	var park string // left by "fork with a handed-in identity"
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"boot with a handed-in identity", func(t *testing.T) {
			check(t, sharedInfo, want{"sandbox_id": sharedID, "hostname": sharedHostname,
				"generation": "0", "parent": "-", "snapshot": "-"})
			if sharedHost != sharedHostname {
				t.Errorf("the guest's hostname is %q, want %q", sharedHost, sharedHostname)
			}
		}},
		{"fork with a minted identity", func(t *testing.T) {
			sb := forkOf(t, art)
			c := sb.dial()
			host := strings.TrimSpace(mustRun(t, c, "hostname"))
			info := sb.info(c)
			check(t, info, want{"generation": "1", "parent": sharedID, "snapshot": art, "hostname": host})
			if id := info["sandbox_id"]; id == sharedID || id == "-" || id == "" {
				t.Errorf("__info__ sandbox_id=%q: want a newly minted id", id)
			}
			if !regexp.MustCompile(`^sandbox-[0-9a-z]{8}$`).MatchString(host) {
				t.Errorf("minted hostname %q, want sandbox-xxxxxxxx", host)
			}
			shutdown(t, sb, c)
		}},
		{"fork with a handed-in identity", func(t *testing.T) {
			// The launch directory holds the park, so it must outlive
			// this subtest.
			sb := restoreIn(t, outer.TempDir(), art, "sandbox_id = e2e-fork-1", "hostname = e2e-fork")
			c := sb.dial()
			if host := strings.TrimSpace(mustRun(t, c, "hostname")); host != "e2e-fork" {
				t.Errorf("the fork's guest hostname is %q, want e2e-fork", host)
			}
			check(t, sb.info(c), want{"sandbox_id": "e2e-fork-1", "hostname": "e2e-fork",
				"generation": "1", "parent": sharedID, "snapshot": art})
			if body, exit := run(t, c, "__park__ p"); exit != 0 {
				t.Fatalf("__park__: %q exit %d", body, exit)
			}
			sb.wait(30 * time.Second)
			park = filepath.Join(sb.dir, "p")
		}},
		{"wake of that park", func(t *testing.T) {
			if park == "" {
				t.Fatal("the previous step left no park to wake")
			}
			w := restoreIn(t, t.TempDir(), park)
			c := w.dial()
			if host := strings.TrimSpace(mustRun(t, c, "hostname")); host != "e2e-fork" {
				t.Errorf("the woken guest's hostname is %q, want e2e-fork", host)
			}
			// The parent is the sandbox id the artifact captured: for a
			// park, the sandbox itself.
			check(t, w.info(c), want{"sandbox_id": "e2e-fork-1", "hostname": "e2e-fork",
				"generation": "2", "parent": "e2e-fork-1", "snapshot": park})
			shutdown(t, w, c)
			w.checkNoLeftovers()
		}},
	}
	// Not a step of the chain above: it needs only the shared base.
	t.Run("a restore never reports a boot's lineage, even while restoring", func(t *testing.T) {
		sb := spawn(t, t.TempDir(), "restore = 1", "restore_from = "+art)
		sb.waitListening(10 * time.Second)
		var answers []string
		deadline := time.Now().Add(60 * time.Second)
		for {
			info, _, err := infoNow(sb.sock)
			if err != nil {
				t.Fatalf("__info__ while restoring: %v", err)
			}
			answers = append(answers, fmt.Sprintf("agent=%s generation=%s parent=%s snapshot=%s",
				info["agent"], info["generation"], info["parent"], info["snapshot"]))
			if info["snapshot"] == "-" || info["generation"] == "0" || info["parent"] == "-" {
				// restore_from is in nether.conf and the artifact's
				// identity in its meta.json: both are known before the
				// socket listens.
				t.Errorf("a restoring nether answered __info__ with a boot's lineage (agent=%s generation=%s parent=%s snapshot=%s); want the restore's (generation=1 parent=%s snapshot=%s) from the first answer",
					info["agent"], info["generation"], info["parent"], info["snapshot"], sharedID, art)
				break
			}
			if info["agent"] == "connected" || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Logf("%d answers, first %q, last %q", len(answers), answers[0], answers[len(answers)-1])
		c := primaryClient(t, sb)
		check(t, sb.info(c), want{"generation": "1", "parent": sharedID, "snapshot": art})
	})
	for _, st := range steps {
		if !t.Run(st.name, st.run) {
			return
		}
	}
}
