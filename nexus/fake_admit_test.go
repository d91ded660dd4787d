package nexus

import (
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
	"github.com/nethersandbox/nether/runner"
	"github.com/nethersandbox/nether/runner/fakerunner"
)

// fakeAdmission is a fake nexus whose state directory trusts the plan key
// "ops", and a signer of plans under it (each with a fresh nonce).
func fakeAdmission(t *testing.T) (*Nexus, *fakerunner.Fake, func(edit func(p *trust.Plan)) []byte) {
	t.Helper()
	n, f := fakeNexus(t)
	return n, f, planSigner(t, n)
}

// events are the chain's events naming ref, in order.
func events(t *testing.T, n *Nexus, ref string) []string {
	t.Helper()
	recs, err := n.AuditList(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range recs {
		out = append(out, r.Event)
	}
	return out
}

// TestFakeAdmittedStart: one plan admits a create and the start of the
// same sandbox; the nether runs with the plan's limits filled in and an
// identity token naming the plan; a start without a plan, or under a
// plan pinning another image, is refused before anything runs.
func TestFakeAdmittedStart(t *testing.T) {
	n, f, sign := fakeAdmission(t)
	ctx := t.Context()
	a := n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{Kernel: fakerunner.Kernel, RootImage: fakerunner.Rootfs} }))
	sb, err := a.Create(ctx, CreateRequest{Name: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if sb, err = a.Start(ctx, sb.ID); err != nil || sb.State != lifecycle.Running {
		t.Fatalf("the start the create's plan admitted: %+v, %v", sb, err)
	}
	s, _ := f.Settings(n.sandboxDir(sb.ID))
	if s.PlanDigest != sb.Plan || len(sb.Plan) != 64 || s.RAMMB != 512 || s.CPUs != 1 || s.MaxRuntimeS != 3600 {
		t.Fatalf("launched with %+v under plan %q", s, sb.Plan)
	}
	priv, _ := n.Keyring().AdmissionKey()
	tok, err := trust.VerifyToken(s.IdentityToken, priv.Public().(ed25519.PublicKey), time.Now())
	if err != nil || tok.PlanDigest != sb.Plan || tok.VMID != sb.ID || tok.BootID != s.BootID {
		t.Fatalf("the token: %+v, %v", tok, err)
	}
	if _, err := n.Stop(ctx, "web"); err != nil {
		t.Fatal(err)
	}
	boots := f.Launches("boot")
	for _, tc := range []struct {
		name string
		n    *Nexus
		want string
	}{
		{"no plan", n, "needs a signed plan"},
		{"another kernel", n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{Kernel: strings.Repeat("c", 64)} })), "image.kernel: the plan pins cccccccccccc, and start would run " + fakerunner.Kernel[:12]},
		{"another root image", n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{RootImage: strings.Repeat("d", 64)} })), "image.root_image: the plan pins dddddddddddd"},
		{"less RAM than the record", n.WithPlan(sign(func(p *trust.Plan) { p.Limits.RAMMB = 256 })), "ram_mb 512: the plan allows at most 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.n.Start(ctx, "web")
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("start: %v, want a refusal saying %q", err, tc.want)
			}
			if got := state(t, n, "web"); got.State != lifecycle.Stopped || got.Lease != nil || got.PID != 0 {
				t.Fatalf("a refused start left %s, lease %v, pid %d", got.State, got.Lease, got.PID)
			}
		})
	}
	if f.Launches("boot") != boots || f.Live() != 0 {
		t.Fatalf("refused starts launched %d nethers", f.Launches("boot")-boots)
	}
	// The image the state directory boots changes: a plan pinning the
	// old one no longer admits a start.
	f.SetImage(runner.Image{Kernel: strings.Repeat("e", 64), Rootfs: fakerunner.Rootfs})
	if _, err := n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{Kernel: fakerunner.Kernel} })).Start(ctx, "web"); !errors.Is(err, ErrRefused) {
		t.Fatalf("a start after the kernel changed: %v", err)
	}
	ev := events(t, n, sb.ID)
	if strings.Join(ev, " ") != "admit create boot stop refuse refuse refuse refuse refuse" {
		t.Errorf("the chain for the sandbox: %v", ev)
	}
}

// TestFakeAdmittedResume: a wake is admitted against its park: the
// park's size holds against the plan and the park's image against the
// plan's pin, whatever the state directory boots now.
func TestFakeAdmittedResume(t *testing.T) {
	n, f, sign := fakeAdmission(t)
	ctx := t.Context()
	a := n.WithPlan(sign(nil))
	sb, _ := a.Create(ctx, CreateRequest{Name: "p"})
	if _, err := a.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Pause(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	f.SetImage(runner.Image{Kernel: strings.Repeat("e", 64)})
	if _, err := n.Resume(ctx, "p"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "resume needs a signed plan") {
		t.Fatalf("a resume without a plan: %v", err)
	}
	if _, err := n.WithPlan(sign(func(p *trust.Plan) { p.Limits.RAMMB = 256 })).Resume(ctx, "p"); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "ram_mb 512") {
		t.Fatalf("a resume of a 512 MiB park under a 256 MiB plan: %v", err)
	}
	if got := state(t, n, "p"); got.State != lifecycle.Paused || !exists(got.Park) || got.Lease != nil {
		t.Fatalf("refused wakes left %s, park there %v, lease %v", got.State, exists(got.Park), got.Lease)
	}
	// The park was captured on the first image: a plan pinning it admits
	// the wake though boots now run another.
	r, err := n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{Kernel: fakerunner.Kernel} })).Resume(ctx, "p")
	if err != nil || r.State != lifecycle.Running {
		t.Fatalf("a wake under a plan pinning the park's image: %+v, %v", r, err)
	}
	if s, _ := f.Settings(n.sandboxDir(r.ID)); s.PlanDigest != r.Plan || s.RestoreFrom == "" {
		t.Fatalf("woken with %+v", s)
	}
}

// TestFakeForkAttenuation: a fork of a sandbox admitted under plan P,
// given TOKEN, restores children only under a child plan of P that
// lists TOKEN (its snapshot is dirty), within P's grants; a removed
// child gives its share back, and a refused fork launches nothing.
func TestFakeForkAttenuation(t *testing.T) {
	n, f, sign := fakeAdmission(t)
	ctx := t.Context()
	parentPlan := sign(func(p *trust.Plan) {
		p.Limits.RAMMB = 1024
		p.Secrets = []string{"TOKEN"}
		p.Grants = trust.Grants{MaxDescendants: 2, ForkBudget: trust.Limits{RAMMB: 1024}}
	})
	pn := n.WithPlan(parentPlan).WithSecrets(map[string][]byte{"TOKEN": []byte("t0ken")})
	sb, err := pn.Create(ctx, CreateRequest{Name: "p", Config: Config{RAMMB: 512}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pn.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	sb = state(t, n, "p")
	pd := sb.Plan
	snap, err := n.SnapshotCreate(ctx, "p", "s")
	if err != nil || snap.Plan != pd || SnapshotClass(snap) != ClassDirty {
		t.Fatalf("the snapshot: %+v, %v", snap, err)
	}
	child := func(edit func(p *trust.Plan)) *Nexus {
		return n.WithPlan(sign(func(p *trust.Plan) {
			p.Parent, p.Limits.RAMMB, p.Secrets = pd, 512, []string{"TOKEN"}
			if edit != nil {
				edit(p)
			}
		}))
	}
	restores := f.Launches("restore")
	for _, tc := range []struct {
		name string
		n    *Nexus
		kids int
		want string
	}{
		{"no plan", n, 1, "fork needs a signed plan"},
		{"no parent named", child(func(p *trust.Plan) { p.Parent = "" }), 1, "a fork's plan must name it as its parent (it names none)"},
		{"the dirty parent's secret dropped", child(func(p *trust.Plan) { p.Secrets = nil }), 1, "secrets: the snapshot is dirty and its plan handed the sandbox TOKEN"},
		{"wider than the parent", child(func(p *trust.Plan) { p.Limits.RAMMB = 2048 }), 1, "limits.ram_mb: the child plan asks for 2048, its parent allows 1024"},
		{"past max_descendants", child(nil), 3, "grants.max_descendants: plan " + pd[:12] + " allows 2 descendants, it has 0, and the fork adds 3"},
		{"past the fork budget", child(func(p *trust.Plan) { p.Limits.RAMMB = 768 }), 2, "grants.fork_budget.ram_mb: the children's 1536 would pass the budget of 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kids, err := tc.n.Fork(ctx, ForkRequest{From: "s", N: tc.kids})
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) || len(kids) != 0 {
				t.Fatalf("fork: %d children, %v; want a refusal saying %q", len(kids), err, tc.want)
			}
		})
	}
	if f.Launches("restore") != restores {
		t.Fatalf("refused forks restored %d children", f.Launches("restore")-restores)
	}
	kids, err := child(nil).Fork(ctx, ForkRequest{From: "s", N: 2})
	if err != nil || len(kids) != 2 {
		t.Fatalf("an attenuated fork: %d children, %v", len(kids), err)
	}
	cd := kids[0].Plan
	for _, k := range kids {
		s, _ := f.Settings(n.sandboxDir(k.ID))
		if k.Plan != cd || cd == pd || s.PlanDigest != cd || s.RAMMB != 512 {
			t.Fatalf("child %s: plan %q, launched with plan %q and %d MiB", k.Ref(), k.Plan, s.PlanDigest, s.RAMMB)
		}
	}
	var reserved map[string]int
	n.db.View(func(tx *store.Tx) error { reserved, err = tx.Reservations(time.Now()); return err })
	if len(reserved) != 0 {
		t.Errorf("the fork's place is still held after its children were recorded: %v", reserved)
	}
	if _, err := child(nil).Fork(ctx, ForkRequest{From: "s"}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "it has 2, and the fork adds 1") {
		t.Fatalf("a third descendant of 2: %v", err)
	}
	if err := n.Remove(ctx, kids[0].ID, true); err != nil {
		t.Fatal(err)
	}
	if more, err := child(nil).Fork(ctx, ForkRequest{From: "s"}); err != nil || len(more) != 1 {
		t.Fatalf("a fork after a child was removed: %v", err)
	}
}

// TestFakeCleanForkAnyPlan: a clean snapshot (never held a secret) forks
// under a plan of no lineage, where a dirty one would be refused.
func TestFakeCleanForkAnyPlan(t *testing.T) {
	n, _, sign := fakeAdmission(t)
	ctx := t.Context()
	a := n.WithPlan(sign(nil))
	sb, _ := a.Create(ctx, CreateRequest{Name: "c"})
	if _, err := a.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	clean, err := n.SnapshotCreateClean(ctx, "c", "clean")
	if err != nil {
		t.Fatal(err)
	}
	dirty, err := n.SnapshotCreate(ctx, "c", "dirty")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.WithPlan(sign(nil)).Fork(ctx, ForkRequest{From: dirty.ID}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "parent:") {
		t.Fatalf("a dirty fork under a plan of no lineage: %v", err)
	}
	if kids, err := n.WithPlan(sign(nil)).Fork(ctx, ForkRequest{From: clean.ID}); err != nil || len(kids) != 1 {
		t.Fatalf("a clean fork under any plan: %v", err)
	}
}

// TestFakeSecretsDelivered: the secrets an operation is given reach the
// nether (values) and the record (names only, audited); no file of the
// state directory holds a value; a later boot given none has none, and a
// wake given none keeps what its guest held.
func TestFakeSecretsDelivered(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	const value = "v4lue-that-must-not-be-stored"
	sb, _ := n.Create(ctx, CreateRequest{Name: "s"})
	withS := n.WithSecrets(map[string][]byte{"API_KEY": []byte(value), "DB": []byte("pw")})
	if _, err := withS.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	dir := n.sandboxDir(sb.ID)
	if got := f.Secrets(dir); string(got["API_KEY"]) != value || string(got["DB"]) != "pw" {
		t.Fatalf("the nether got %q", got)
	}
	if got := state(t, n, "s"); strings.Join(got.Secrets, ",") != "API_KEY,DB" {
		t.Fatalf("the record holds secrets %v", got.Secrets)
	}
	recs, _ := n.AuditList(ctx, sb.ID)
	var detail string
	for _, r := range recs {
		if r.Event == evSecrets {
			detail = r.Detail
		}
	}
	if detail != "API_KEY,DB" {
		t.Fatalf("the secrets record says %q", detail)
	}
	if c, err := os.ReadFile(filepath.Join(dir, runner.ConfFile)); err != nil || !strings.Contains(string(c), "secrets_fd") {
		t.Fatalf("nether.conf names no secrets_fd: %q, %v", c, err)
	}
	noValueOnDisk(t, n.dir, value)
	// A wake given none keeps its guest's; a boot given none has none.
	if _, err := n.Pause(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Resume(ctx, "s"); err != nil || strings.Join(r.Secrets, ",") != "API_KEY,DB" || f.Secrets(dir) != nil {
		t.Fatalf("a wake given no secrets: %v, %v (its nether was handed %v)", r.Secrets, err, f.Secrets(dir))
	}
	if _, err := n.Stop(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if r, err := n.Start(ctx, "s"); err != nil || r.Secrets != nil || f.Secrets(dir) != nil {
		t.Fatalf("a boot given no secrets: record %v, nether %v, %v", r.Secrets, f.Secrets(dir), err)
	}
	if c, _ := os.ReadFile(filepath.Join(dir, runner.ConfFile)); strings.Contains(string(c), "secrets_fd") {
		t.Errorf("a launch without secrets names secrets_fd:\n%s", c)
	}
	noValueOnDisk(t, n.dir, value)
}

// TestFakeSecretsForkCold: a fork given secrets restores cold even with
// a ready pool (a claim hands over an identity, never secrets), and its
// children get them.
func TestFakeSecretsForkCold(t *testing.T) {
	n, f := fakeNexus(t)
	ctx := t.Context()
	running(t, n, "base")
	snap, err := n.SnapshotCreate(ctx, "base", "warm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.PoolSet(ctx, "warm", 1); err != nil {
		t.Fatal(err)
	}
	restores := f.Launches("restore")
	kids, err := n.WithSecrets(map[string][]byte{"K": []byte("v")}).Fork(ctx, ForkRequest{From: "warm"})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork: %v", err)
	}
	if f.Launches("restore") != restores+1 || n.PoolReady(ctx, snap.ID) != 1 {
		t.Fatalf("a fork with secrets claimed a member (restores %d -> %d, ready %d)", restores, f.Launches("restore"), n.PoolReady(ctx, snap.ID))
	}
	if got := f.Secrets(n.sandboxDir(kids[0].ID)); string(got["K"]) != "v" || strings.Join(kids[0].Secrets, ",") != "K" {
		t.Fatalf("the child holds %q (record %v)", got, kids[0].Secrets)
	}
}

// noValueOnDisk fails if any file under dir holds value.
func noValueOnDisk(t *testing.T, dir, value string) {
	t.Helper()
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, _ := os.ReadFile(p); strings.Contains(string(b), value) {
			t.Errorf("%s holds a secret's value", p)
		}
		return nil
	})
}
