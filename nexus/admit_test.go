package nexus

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/nexus/trust"
)

// admissionNexus is a state directory that trusts the plan key "ops",
// with a guest directory holding a kernel ("kernel") and a root image
// ("root image").
func admissionNexus(t *testing.T) (*Nexus, func(edit func(p *trust.Plan)) []byte) {
	t.Helper()
	ctx := context.Background()
	guest := t.TempDir()
	os.WriteFile(filepath.Join(guest, "vmlinux"), []byte("kernel"), 0o644)
	os.WriteFile(filepath.Join(guest, "rootfs.img"), []byte("root image"), 0o644)
	n, err := Open(ctx, Options{StateDir: t.TempDir(), Nether: "/bin/true", GuestDir: guest})
	if err != nil {
		t.Fatal(err)
	}
	return n, planSigner(t, n)
}

// planSigner makes a plan key "ops" that n trusts and returns a signer of
// plans under it: each a fresh nonce, all one validity window (a child
// plan signed a second after its parent is valid no longer than it).
func planSigner(t *testing.T, n *Nexus) func(edit func(p *trust.Plan)) []byte {
	t.Helper()
	pub, err := n.CreateKey("ops")
	if err != nil {
		t.Fatal(err)
	}
	line, _ := os.ReadFile(pub)
	if _, err := n.Trust(line); err != nil {
		t.Fatal(err)
	}
	priv, err := n.Keyring().Key("ops")
	if err != nil {
		t.Fatal(err)
	}
	from := time.Now().Add(-time.Minute)
	return func(edit func(p *trust.Plan)) []byte {
		p := trust.NewPlan(from)
		if edit != nil {
			edit(p)
		}
		b, err := trust.Sign(p, priv, "ops")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func TestAdmissionOfCreate(t *testing.T) {
	ctx := context.Background()
	n, sign := admissionNexus(t)

	plan := sign(nil)
	sb, err := n.WithPlan(plan).Create(ctx, CreateRequest{Name: "ok"})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Plan) != 64 || sb.Config.RAMMB != 512 || sb.Config.CPUs != 1 || sb.Config.MaxRuntimeS != 3600 {
		t.Fatalf("an admitted create: plan %q, config %+v; want the plan's digest and its limits filled in", sb.Plan, sb.Config)
	}
	pinned := sign(func(p *trust.Plan) {
		p.Image = &trust.Image{Kernel: sha256Hex("kernel"), RootImage: sha256Hex("root image")}
	})
	if _, err := n.WithPlan(pinned).Create(ctx, CreateRequest{}); err != nil {
		t.Fatalf("a plan pinning the image that boots: %v", err)
	}

	cases := []struct {
		name string
		n    *Nexus
		req  CreateRequest
		want string
	}{
		{"no plan", n, CreateRequest{}, "needs a signed plan"},
		{"a replayed plan", n.WithPlan(plan), CreateRequest{}, "nonce was used before"},
		{"more RAM than the plan", n.WithPlan(sign(nil)), CreateRequest{Config: Config{RAMMB: 1024}}, "ram_mb 1024: the plan allows at most 512"},
		{"a network the plan does not give", n.WithPlan(sign(nil)), CreateRequest{Config: Config{Net: true}}, "net: the plan gives the sandbox no network"},
		{"an app port without the data plane", n.WithPlan(sign(nil)), CreateRequest{Config: Config{AppPort: 8080}}, "app_port: the plan grants no data plane"},
		{"an allow-list wider than the plan's", n.WithPlan(sign(func(p *trust.Plan) { p.Network = trust.Network{Net: true, Allow: []string{"10.1.0.0/16"}} })),
			CreateRequest{Config: Config{Net: true, NetAllow: "10.0.0.0/8"}}, "net_allow 10.0.0.0/8: outside the plan's network.allow (10.1.0.0/16)"},
		{"another kernel pinned", n.WithPlan(sign(func(p *trust.Plan) { p.Image = &trust.Image{Kernel: strings.Repeat("c", 64)} })), CreateRequest{}, "image.kernel: the plan pins cccccccccccc"},
		{"expired", n.WithPlan(sign(func(p *trust.Plan) {
			p.NotBefore, p.NotAfter = time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)
		})), CreateRequest{}, "has expired"},
		{"a damaged plan", n.WithPlan([]byte(`{`)), CreateRequest{}, "not a signed plan"},
		{"a secret the plan does not list", n.WithPlan(sign(func(p *trust.Plan) { p.Secrets = []string{"API_KEY"} })).
			WithSecrets(map[string][]byte{"API_KEY": []byte("v"), "DB": []byte("w")}), CreateRequest{}, "secrets DB: the plan does not list them (it lists API_KEY)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.n.Create(ctx, c.req)
			if !errors.Is(err, ErrRefused) || Kind(err) != KindRefused || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Create: %v, want a refusal saying %q", err, c.want)
			}
		})
	}
	// Nothing refused left a record, and every refusal is audited.
	list, _ := n.List(ctx)
	if len(list) != 2 {
		t.Fatalf("%d sandboxes after 2 admitted creates", len(list))
	}
	recs, _ := n.AuditList(ctx, "")
	refusals := 0
	for _, r := range recs {
		if r.Event == "refuse" {
			refusals++
		}
	}
	if refusals != len(cases) {
		t.Fatalf("%d refusals audited, want %d", refusals, len(cases))
	}
	if _, err := n.AuditVerify(ctx); err != nil {
		t.Fatal(err)
	}
}

// Without a trusted authority nexus runs sandboxes unadmitted, and a plan
// it cannot check is refused rather than ignored.
func TestAdmissionOff(t *testing.T) {
	ctx := context.Background()
	n, err := Open(ctx, Options{StateDir: t.TempDir(), Nether: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := n.Create(ctx, CreateRequest{})
	if err != nil || sb.Plan != "" {
		t.Fatalf("an unadmitted create: %+v, %v", sb, err)
	}
	if _, err := n.WithPlan([]byte(`{}`)).Create(ctx, CreateRequest{}); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "no plan authority is trusted") {
		t.Fatalf("a plan nobody can check: %v", err)
	}
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// The identity a launch hands nether is what nether's own parser takes,
// and its token verifies under the admission key, naming the sandbox,
// the boot and the plan.
func TestBootLines(t *testing.T) {
	n, _ := admissionNexus(t)
	sb := &Sandbox{ID: "01JABCDEFGHJK0123456CDEFGHJK", Hostname: "web", Plan: strings.Repeat("ab", 32)}
	set, err := n.launchSettings(sb, "", "01BOOT")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text, err := set.Text(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "nether.conf"), []byte(text), 0o600)
	cfg, err := conf.Load(dir)
	if err != nil {
		t.Fatalf("nether refuses what nexus writes: %v", err)
	}
	if cfg.NodeID != n.NodeID() || cfg.BootID != "01BOOT" || cfg.PlanDigest != sb.Plan || cfg.SecretsFD != 3 {
		t.Fatalf("nether read node %q boot %q plan %q fd %d", cfg.NodeID, cfg.BootID, cfg.PlanDigest, cfg.SecretsFD)
	}
	priv, _ := n.Keyring().AdmissionKey()
	tok, err := trust.VerifyToken(cfg.IdentityToken, priv.Public().(ed25519.PublicKey), time.Now())
	if err != nil || tok.VMID != sb.ID || tok.BootID != "01BOOT" || tok.NodeID != n.NodeID() || tok.PlanDigest != sb.Plan {
		t.Fatalf("the token: %+v, %v", tok, err)
	}
}
