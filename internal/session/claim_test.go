package session

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

// restoreOf starts a restore of art and waits until it answers a
// command; it returns the primary client and the fake machine that runs
// the guest.
func restoreOf(t *testing.T, eng *fake.Engine, art, extra string, tweak ...func(*Options)) (*sandbox, *client.Client, *fake.Machine) {
	t.Helper()
	sb := start(t, eng, "", "restore = 1\nrestore_from = "+art+"\n"+extra, tweak...)
	c := sb.dial()
	mustRun(t, c, "echo up")
	ms := eng.Machines()
	return sb, c, ms[len(ms)-1]
}

// claim sends __claim__ and returns the OK line, or the ERR text as the
// error.
func claim(t *testing.T, c *client.Client, id, host string) (string, error) {
	t.Helper()
	out, exit, err := run(t, c, "__claim__ "+id+" "+host)
	var ce *client.ControlError
	if errors.As(err, &ce) {
		if ce.Exit != -1 {
			t.Fatalf("__claim__ %s %s: ERR with exit %d, want -1", id, host, ce.Exit)
		}
		return "", errors.New(ce.Msg)
	}
	if err != nil {
		t.Fatalf("__claim__ %s %s: %v", id, host, err)
	}
	if exit != 0 {
		t.Fatalf("__claim__ %s %s: %q exit %d", id, host, out, exit)
	}
	return out, nil
}

func mustClaim(t *testing.T, c *client.Client, id, host string) {
	t.Helper()
	out, err := claim(t, c, id, host)
	if err != nil {
		t.Fatalf("__claim__ %s %s: %v", id, host, err)
	}
	if want := "OK claimed " + id + " " + host + "\n"; out != want {
		t.Fatalf("__claim__ reply %q, want %q", out, want)
	}
}

func mustRefuse(t *testing.T, c *client.Client, id, host, want string) {
	t.Helper()
	out, err := claim(t, c, id, host)
	if err == nil {
		t.Fatalf("__claim__ %s %s succeeded (%q), want ERR with %q", id, host, out, want)
	}
	if !strings.HasPrefix(err.Error(), "ERR claim: ") || !strings.Contains(err.Error(), want) {
		t.Fatalf("__claim__ %s %s: %q, want ERR claim: ...%s...", id, host, err, want)
	}
}

// guestIdentity is what the fake guest holds of its identity, and how
// many times its agent reseeded the CRNG.
type guestIdentity struct {
	epoch     uint64
	hostname  string
	machineID string
	reseeds   int
}

func identityOf(m *fake.Machine) guestIdentity {
	return guestIdentity{m.Epoch(), m.Hostname(), m.MachineID(), len(m.Reseeds())}
}

// TestClaimFork: a claim gives a fork the identity handed in, a fresh
// machine-id and epoch, and reseeds its CRNG; __info__ reports it with the
// lineage unchanged; the timeline records it; commands run in the new
// session; and a fork is claimed once.
func TestClaimFork(t *testing.T) {
	eng := fake.New(slog.Default())
	base, baseID := snapshotBase(t, eng, "base")
	sb, c, m := restoreOf(t, eng, base, "")
	before, info := identityOf(m), infoOf(t, c)
	if info["claimed"] != "0" || before.reseeds != 0 || before.hostname != info["hostname"] || before.machineID == "" {
		t.Fatalf("the fork before its claim: __info__ %v, guest %+v", info, before)
	}

	mustClaim(t, c, "user-42", "host-42")

	after := identityOf(m)
	if after.hostname != "host-42" {
		t.Errorf("the guest's hostname is %q, want host-42", after.hostname)
	}
	if after.machineID == before.machineID || !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(after.machineID) {
		t.Errorf("the guest's machine-id went from %q to %q, want a new 32-hex-digit one", before.machineID, after.machineID)
	}
	if after.epoch == before.epoch || after.epoch == 0 {
		t.Errorf("the agent's epoch went from %d to %d, want a new one", before.epoch, after.epoch)
	}
	if seeds := m.Reseeds(); len(seeds) != 1 || len(seeds[0]) != agentproto.MinSeed {
		t.Errorf("the agent reseeded with %q, want once with %d bytes", seeds, agentproto.MinSeed)
	}
	got := infoOf(t, c)
	// A claim is a new boot: its own boot id and session, in __info__
	// and in the guest's /run/nether/identity.
	if got["boot_id"] == info["boot_id"] || got["boot_id"] == "-" || m.Identity().BootID != got["boot_id"] {
		t.Errorf("boot_id went from %q to %q (guest holds %q), want a new one the guest holds", info["boot_id"], got["boot_id"], m.Identity().BootID)
	}
	if m.Identity().VMID != "user-42" {
		t.Errorf("the guest's identity names vm %q, want user-42", m.Identity().VMID)
	}
	if got["session_epoch"] != fmt.Sprintf("%016x", after.epoch) || got["session_epoch"] == info["session_epoch"] {
		t.Errorf("session_epoch went from %q to %q, want the agent's new %016x", info["session_epoch"], got["session_epoch"], after.epoch)
	}
	for k, want := range map[string]string{
		"sandbox_id": "user-42", "hostname": "host-42", "claimed": "1",
		"parent": baseID, "generation": "1", "snapshot": base,
	} {
		if got[k] != want {
			t.Errorf("__info__ %s=%q after the claim, want %q", k, got[k], want)
		}
	}
	if out := mustRun(t, c, "echo in the claimed sandbox"); out != "in the claimed sandbox\n" {
		t.Errorf("a command after the claim: %q", out)
	}
	if ev := mustRun(t, c, "__events__"); !regexp.MustCompile(`(?m)^\d+ \d+ LIFE claimed sandbox=user-42 hostname=host-42$`).MatchString(ev) {
		t.Errorf("the timeline lacks the claim:\n%s", ev)
	}
	if !regexp.MustCompile(`msg=claimed sandbox=user-42 hostname=host-42 was=\S+ claim_ms=[0-9.]+ reseed_ms=[0-9.]+ handshake_ms=[0-9.]+`).MatchString(sb.logs.String()) {
		t.Errorf("the log lacks the claim and its timings:\n%s", sb.logs.String())
	}

	mustRefuse(t, c, "user-43", "host-43", "already claimed, as user-42")
	if again := identityOf(m); again != after {
		t.Errorf("a refused second claim changed the guest: %+v -> %+v", after, again)
	}
	if got := infoOf(t, c); got["sandbox_id"] != "user-42" || got["hostname"] != "host-42" {
		t.Errorf("a refused second claim changed __info__: %v", got)
	}
}

// TestClaimsApart: two pool members of one base, claimed, share nothing
// of their identity with each other or with what they were, and their
// CRNGs were reseeded from different seeds.
func TestClaimsApart(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	var seen []guestIdentity
	var seeds [][]byte
	for i, id := range []string{"user-1", "user-2"} {
		_, c, m := restoreOf(t, eng, base, "")
		seen = append(seen, identityOf(m))
		mustClaim(t, c, id, "host-"+id)
		seen = append(seen, identityOf(m))
		seeds = append(seeds, m.Reseeds()...)
		t.Logf("pool member %d: %+v -> %+v", i, seen[len(seen)-2], seen[len(seen)-1])
	}
	if len(seeds) != 2 || bytes.Equal(seeds[0], seeds[1]) {
		t.Errorf("the two claims reseeded with %q, want two different seeds", seeds)
	}
	for i := range seen {
		for j := range i {
			if seen[i].epoch == seen[j].epoch || seen[i].machineID == seen[j].machineID || seen[i].hostname == seen[j].hostname {
				t.Errorf("identities %d and %d share an epoch, machine-id or hostname: %+v, %+v", j, i, seen[j], seen[i])
			}
		}
	}
}

// TestClaimKeepsTheMemberID: the sandbox id and hostname are the
// orchestrator's to choose, and one may keep a member's id it never
// showed anyone (nexus does); the machine-id, epoch and CRNG are new
// whatever it chooses.
func TestClaimKeepsTheMemberID(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	_, c, m := restoreOf(t, eng, base, "sandbox_id = member-1\nhostname = member-host\n")
	before := identityOf(m)
	mustClaim(t, c, "member-1", "member-host")
	after := identityOf(m)
	if after.machineID == before.machineID || after.epoch == before.epoch || after.reseeds != before.reseeds+1 {
		t.Errorf("a claim keeping the member's id and hostname: guest %+v -> %+v, want a new machine-id, epoch and a reseed", before, after)
	}
	if info := infoOf(t, c); info["sandbox_id"] != "member-1" || info["hostname"] != "member-host" || info["claimed"] != "1" {
		t.Errorf("__info__ after the claim: %v", info)
	}
}

// TestClaimReseedsWithoutForkReseed: a claim reseeds the CRNG even where
// the restore kept the captured VM generation (fork_reseed = 0): claimed
// sandboxes must not share CRNG state with the pool member's siblings.
func TestClaimReseedsWithoutForkReseed(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	_, c, m := restoreOf(t, eng, base, "fork_reseed = 0\n")
	mustClaim(t, c, "user-1", "host-1")
	if n := len(m.Reseeds()); n != 1 {
		t.Fatalf("the claim reseeded the guest %d times, want once", n)
	}
}

// TestClaimRefused: what cannot be claimed, or not with those arguments,
// gets a framed ERR saying why and changes nothing; a refused claim does
// not use up the fork's one claim.
func TestClaimRefused(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")

	t.Run("a boot", func(t *testing.T) {
		sb := start(t, eng, "", "sandbox_id = booted\n")
		c := sb.dial()
		mustRun(t, c, "echo up")
		mustRefuse(t, c, "user-1", "host-1", "only a fork of a base can be claimed; this sandbox booted")
		if info := infoOf(t, c); info["sandbox_id"] != "booted" || info["claimed"] != "0" {
			t.Errorf("__info__ after a refused claim: %v", info)
		}
		if n := len(eng.Machines()[len(eng.Machines())-1].Reseeds()); n != 0 {
			t.Errorf("a refused claim reseeded the guest %d times", n)
		}
	})

	t.Run("a woken park", func(t *testing.T) {
		fork, c, _ := restoreOf(t, eng, base, "")
		mustRun(t, c, "__park__ p")
		fork.expectEnd(5*time.Second, 0, "park")
		park := filepath.Join(t.TempDir(), "p")
		if err := os.Rename(filepath.Join(fork.dir, "p"), park); err != nil {
			t.Fatal(err)
		}
		_, wc, m := restoreOf(t, eng, park, "")
		before := identityOf(m)
		mustRefuse(t, wc, "user-1", "host-1", "this sandbox woke from a park, which keeps its identity")
		if after := identityOf(m); after != before {
			t.Errorf("a refused claim changed the woken guest: %+v -> %+v", before, after)
		}
	})

	t.Run("bad arguments", func(t *testing.T) {
		_, c, m := restoreOf(t, eng, base, "")
		info := infoOf(t, c)
		before := identityOf(m)
		for _, tc := range []struct{ name, id, host, want string }{
			{"a sandbox id that is not ASCII", "caf\u00e9", "host-1", `sandbox_id: "café" contains 'é'`},
			{"a sandbox id too long", strings.Repeat("x", 129), "host-1", "sandbox_id: sandbox id is 129 bytes long"},
			{"a hostname with a dot", "user-1", "a.example", "hostname: \"a.example\" contains '.'"},
			{"a hostname with an underscore", "user-1", "a_b", "hostname: \"a_b\" contains '_'"},
			{"a hostname ending in a dash", "user-1", "host-", "starts or ends with '-'"},
			{"a hostname too long", "user-1", strings.Repeat("h", 64), "hostname: hostname is 64 bytes long"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				mustRefuse(t, c, tc.id, tc.host, tc.want)
				if after := identityOf(m); after != before {
					t.Fatalf("a refused claim changed the guest: %+v -> %+v", before, after)
				}
				if got := infoOf(t, c); got["sandbox_id"] != info["sandbox_id"] || got["hostname"] != info["hostname"] || got["claimed"] != "0" {
					t.Fatalf("a refused claim changed __info__: %v", got)
				}
			})
		}
		mustClaim(t, c, "user-1", "host-1")
	})

	t.Run("a command running", func(t *testing.T) {
		sb, c1, m := restoreOf(t, eng, base, "")
		// A client starts a command that never ends and leaves: the
		// command runs on in the guest.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		c1.Run(ctx, "hang", io.Discard)
		cancel()
		c1.Close()
		c := primary(t, sb)
		before := identityOf(m)
		mustRefuse(t, c, "user-1", "host-1", "a command or transfer is running (channel: 1 streams open)")
		if after := identityOf(m); after != before {
			t.Errorf("a refused claim changed the guest: %+v -> %+v", before, after)
		}
	})

	t.Run("a restore not finished", func(t *testing.T) {
		eng := fake.New(slog.Default())
		eng.SetFaults(fake.Faults{HangHandshake: true})
		sb := start(t, eng, "", "restore = 1\nrestore_from = "+base+"\n")
		c := sb.dial()
		mustRefuse(t, c, "user-1", "host-1", "the restore has not finished")
	})

	t.Run("an agent that cannot reseed", func(t *testing.T) {
		_, c, m := restoreOf(t, eng, base, "")
		m.SetFaults(fake.Faults{OldAgent: true})
		before := identityOf(m)
		mustRefuse(t, c, "user-1", "host-1", `reseeding the guest CRNG: unknown agent operation "reseed"`)
		if after := identityOf(m); after != before {
			t.Errorf("a failed claim changed the guest: %+v -> %+v", before, after)
		}
		if info := infoOf(t, c); info["claimed"] != "0" {
			t.Errorf("a failed claim left claimed=%s", info["claimed"])
		}
		m.SetFaults(fake.Faults{})
		mustClaim(t, c, "user-1", "host-1")
	})
}

// primary dials until it holds the primary slot (a client that left frees
// it asynchronously).
func primary(t *testing.T, sb *sandbox) *client.Client {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c := sb.dial()
		_, _, err := run(t, c, "echo primary?")
		if err == nil {
			return c
		}
		c.Close()
		if !strings.Contains(err.Error(), "read-only observer") || time.Now().After(deadline) {
			t.Fatalf("could not become primary: %v", err)
		}
	}
}

// TestClaimEndsTheOldEpoch: once claimed, the guest refuses a request
// stamped with the pool member's session epoch, as it refuses one from
// before a restore.
func TestClaimEndsTheOldEpoch(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	installed := make(chan *Session, 1)
	_, c, m := restoreOf(t, eng, base, "", func(o *Options) { o.installed = func(s *Session) { installed <- s } })
	s := <-installed
	send := func(epoch uint64) (string, error) {
		st, err := s.mux.Open(agentproto.Request{Op: agentproto.OpExec, Command: "echo stamped", Epoch: epoch}.Encode())
		if err != nil {
			t.Fatal(err)
		}
		st.CloseWrite(nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var out strings.Builder
		buf := make([]byte, 256)
		for {
			n, err := st.ReadContext(ctx, buf)
			out.Write(buf[:n])
			if err == io.EOF {
				return out.String(), nil
			}
			if err != nil {
				return out.String(), err
			}
		}
	}
	old := m.Epoch()
	if out, err := send(old); err != nil || out != "stamped\n" {
		t.Fatalf("a request of the current epoch before the claim: %q, %v", out, err)
	}
	mustClaim(t, c, "user-1", "host-1")
	out, err := send(old)
	if !errors.Is(err, channel.ErrReset) || !strings.Contains(err.Error(), agentproto.ErrStaleEpoch.Error()) || out != "" {
		t.Fatalf("a request of the pool member's epoch after the claim: %q, %v; want it refused as stale", out, err)
	}
	if out, err := send(m.Epoch()); err != nil || out != "stamped\n" {
		t.Fatalf("a request of the claim's epoch: %q, %v", out, err)
	}
}

// TestClaimHandshakeFails: a guest that does not complete the claim's
// handshake may hold an identity the host does not know, so the sandbox
// ends (reason=error) rather than be driven or handed over.
func TestClaimHandshakeFails(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	sb, c, m := restoreOf(t, eng, base, "", func(o *Options) { o.HandshakeTimeout = 500 * time.Millisecond })
	m.SetFaults(fake.Faults{HangHandshake: true})
	_, err := claim(t, c, "user-1", "host-1")
	// The reply is the claim's own ERR, or the stop's when the stop wins
	// the race to the client: either way a framed ERR.
	if err == nil || !strings.Contains(err.Error(), "the sandbox is ending") && !strings.Contains(err.Error(), "sandbox stopping: error") {
		t.Fatalf("a claim whose handshake hangs: %v", err)
	}
	sb.expectEnd(10*time.Second, 1, "error")
	if !strings.Contains(sb.logs.String(), "claim: the handshake failed; ending the sandbox") {
		t.Errorf("the log does not say why the sandbox ended:\n%s", sb.logs.String())
	}
}

// TestClaimResetsPlaneConns: a data-plane connection open at the claim
// was the pool member's and is reset; one opened after it reaches the
// claimed sandbox.
func TestClaimResetsPlaneConns(t *testing.T) {
	eng := fake.New(slog.Default())
	base, _ := snapshotBase(t, eng, "base")
	sb, c, _ := restoreOf(t, eng, base, "app_port = 8080\ndata_socket = data.sock\n")
	dial := func() net.Conn {
		dc, err := net.Dial("unix", filepath.Join(sb.dir, "data.sock"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dc.Close() })
		dc.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(dc, "ping")
		if _, err := io.ReadFull(dc, make([]byte, 4)); err != nil {
			t.Fatalf("the data connection does not echo: %v", err)
		}
		return dc
	}
	pooled := dial()
	mustClaim(t, c, "user-1", "host-1")
	if n, err := pooled.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the pool member's data connection survived the claim: read %d, %v", n, err)
	}
	dial()
	if !strings.Contains(sb.logs.String(), "plane_conns_reset=1") {
		t.Errorf("the claim's log does not count the reset connection:\n%s", sb.logs.String())
	}
}
