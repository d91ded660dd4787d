package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// keyring makes a state directory with a plan key "ops" that it trusts.
func keyring(t *testing.T) (Keyring, ed25519.PrivateKey, []Authority) {
	t.Helper()
	k := Keyring{Dir: t.TempDir()}
	pubPath, err := k.CreateKey("ops")
	if err != nil {
		t.Fatal(err)
	}
	line, _ := os.ReadFile(pubPath)
	if _, err := k.Trust(line); err != nil {
		t.Fatal(err)
	}
	priv, err := k.Key("ops")
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := k.Trusted()
	if err != nil || len(trusted) != 1 || trusted[0].Name != "ops" {
		t.Fatalf("Trusted = %+v, %v", trusted, err)
	}
	return k, priv, trusted
}

func TestSignAndVerify(t *testing.T) {
	_, priv, trusted := keyring(t)
	p := NewPlan(t0)
	p.Network = Network{Net: true, Allow: []string{"10.0.0.0/8"}}
	p.Secrets = []string{"API_KEY"}
	signed, err := Sign(p, priv, "ops")
	if err != nil {
		t.Fatal(err)
	}
	v, err := Verify(signed, trusted, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if v.Digest != p.Digest() || len(v.Digest) != 64 || v.Authority.Name != "ops" || v.Plan.Secrets[0] != "API_KEY" {
		t.Fatalf("Verify = %+v", v)
	}
	// Reformatting the file (whitespace) changes nothing.
	var compact bytes.Buffer
	json.Compact(&compact, signed)
	if _, err := Verify(compact.Bytes(), trusted, t0.Add(time.Minute)); err != nil {
		t.Fatalf("a compacted signed plan: %v", err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	_, priv, trusted := keyring(t)
	other := Keyring{Dir: t.TempDir()}
	other.CreateKey("mallory")
	mallory, _ := other.Key("mallory")
	sign := func(edit func(p *Plan)) []byte {
		p := NewPlan(t0)
		if edit != nil {
			edit(p)
		}
		b, err := Sign(p, priv, "ops")
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := sign(nil)
	byMallory, _ := Sign(NewPlan(t0), mallory, "ops")
	cases := []struct {
		name string
		b    []byte
		at   time.Time
		want string
	}{
		{"a field changed after signing", editPlan(t, good, false), t0, "bad signature"},
		{"a field added after signing", editPlan(t, good, true), t0, "unknown field"},
		{"the signature damaged", bytes.Replace(good, []byte(`"signature": "`), []byte(`"signature": "AA`), 1), t0, "bad signature"},
		{"an untrusted authority", byMallory, t0, "untrusted plan authority"},
		{"expired", good, t0.Add(time.Hour), "expired"},
		{"not yet valid", good, t0.Add(-time.Second), "not yet valid"},
		{"not a signed plan", []byte(`{"plan": 1}`), t0, "reading the plan"},
		{"garbage", []byte(`%`), t0, "not a signed plan"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Verify(c.b, trusted, c.at)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Verify: %v, want an error containing %q", err, c.want)
			}
		})
	}
	if _, err := Verify(byMallory, trusted, t0); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("an untrusted authority: %v, want ErrUntrusted", err)
	}
}

// editPlan changes the signed plan's RAM, or adds a field to it, leaving
// the signature as it was.
func editPlan(t *testing.T, signed []byte, addField bool) []byte {
	t.Helper()
	var s Signed
	if err := json.Unmarshal(signed, &s); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(s.Plan, &m)
	if addField {
		m["extra"] = 1
	} else {
		m["limits"].(map[string]any)["ram_mb"] = 4096
	}
	s.Plan, _ = json.Marshal(m)
	b, _ := json.Marshal(s)
	return b
}

func TestPlanCheckNamesTheField(t *testing.T) {
	cases := []struct {
		edit func(p *Plan)
		want string
	}{
		{func(p *Plan) { p.Version = 2 }, "version: 2"},
		{func(p *Plan) { p.Nonce = "short" }, "nonce:"},
		{func(p *Plan) { p.NotAfter = p.NotBefore }, "not_after:"},
		{func(p *Plan) { p.Limits.RAMMB = -1 }, "limits.ram_mb: -1 is negative"},
		{func(p *Plan) { p.Grants.ForkBudget.CPUs = -2 }, "grants.fork_budget.cpus"},
		{func(p *Plan) { p.Network.Allow = []string{"10.0.0.0/33"} }, "network.allow:"},
		{func(p *Plan) { p.Secrets = []string{"A", "A"} }, "listed twice"},
		{func(p *Plan) { p.Secrets = []string{"1x"} }, "not a secret name"},
		{func(p *Plan) { p.Image = &Image{Kernel: "abc"} }, "image.kernel"},
		{func(p *Plan) { p.Parent = "x" }, "parent:"},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			p := NewPlan(t0)
			c.edit(p)
			if err := p.Check(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Check: %v, want %q", err, c.want)
			}
		})
	}
	if err := NewPlan(t0).Check(); err != nil {
		t.Fatalf("the skeleton: %v", err)
	}
}

func TestKeys(t *testing.T) {
	k := Keyring{Dir: t.TempDir()}
	if _, err := k.CreateKey("Bad Name"); err == nil {
		t.Fatal("a bad key name was taken")
	}
	if _, err := k.CreateKey("ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := k.CreateKey("ops"); err == nil || !strings.Contains(err.Error(), "never replaced") {
		t.Fatalf("a second key of the same name: %v", err)
	}
	if _, err := k.Key("nope"); err == nil || !strings.Contains(err.Error(), "nexus key create nope") {
		t.Fatalf("a missing key: %v", err)
	}
	os.Chmod(filepath.Join(k.Dir, "keys", "ops.key"), 0o644)
	if _, err := k.Key("ops"); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("a key others can read: %v", err)
	}
	a1, err := k.AdmissionKey()
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := k.AdmissionKey()
	if !a1.Equal(a2) {
		t.Fatal("the admission key changed between uses")
	}
	if _, err := k.Trust([]byte("ssh-ed25519 AAAA")); err == nil {
		t.Fatal("a foreign key line was trusted")
	}
	if got, _ := k.Trusted(); len(got) != 0 {
		t.Fatalf("trusted %v with nothing added", got)
	}
}

func TestIdentityToken(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	otherPub, _, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	want := Token{NodeID: "N", VMID: "V", BootID: "B", PlanDigest: "D", IssuedAt: now, ExpiresAt: now.Add(TokenLifetime)}
	tok, err := SignToken(want, priv)
	if err != nil {
		t.Fatal(err)
	}
	got, err := VerifyToken(tok, pub, now.Add(time.Minute))
	if err != nil || *got != want {
		t.Fatalf("VerifyToken = %+v, %v; want %+v", got, err, want)
	}
	parts := strings.Split(tok, ".")
	forged, _ := json.Marshal(Token{NodeID: "N", VMID: "V", BootID: "B2", IssuedAt: now, ExpiresAt: now.Add(TokenLifetime)})
	for _, tt := range []struct {
		name, tok string
		pub       ed25519.PublicKey
		at        time.Time
		want      string
	}{
		{"another key", tok, otherPub, now, "does not verify"},
		{"another boot", parts[0] + "." + b64.EncodeToString(forged) + "." + parts[2], pub, now, "does not verify"},
		{"expired", tok, pub, now.Add(TokenLifetime), "expired"},
		{"future", tok, pub, now.Add(-time.Hour), "in the future"},
		{"not a token", "abc", pub, now, "not an identity token"},
		{"cut signature", parts[0] + "." + parts[1] + "." + parts[2][:10], pub, now, "malformed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := VerifyToken(tt.tok, tt.pub, tt.at); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("VerifyToken = %v, want %q", err, tt.want)
			}
		})
	}
}

// flipUnusedBits respells the last character of a base64 text whose
// final group has bits past the last whole byte: the same bytes to a lax
// decoder, another string.
func flipUnusedBits(t *testing.T, s string) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	trim := strings.TrimRight(s, "=")
	last := strings.IndexByte(alphabet, trim[len(trim)-1])
	if last < 0 {
		last = strings.IndexByte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", trim[len(trim)-1])
	}
	std := strings.ContainsAny(s, "+/=")
	abc := alphabet
	if std {
		abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	}
	respelled := trim[:len(trim)-1] + string(abc[last^1]) + s[len(trim):]
	if respelled == s {
		t.Fatal("nothing to flip")
	}
	return respelled
}

// TestOneSpellingPerSignature: a token or a signed plan whose signature
// is respelled (unused bits, an inserted line break) is refused, though
// a lax decoder reads the same bytes.
func TestOneSpellingPerSignature(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	tok, err := SignToken(Token{NodeID: "N", VMID: "V", BootID: "B", IssuedAt: now, ExpiresAt: now.Add(TokenLifetime)}, priv)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(tok, ".")
	// 64 bytes of signature are 86 characters, the last carrying 4 unused bits.
	for name, forged := range map[string]string{
		"unused bits":           parts[0] + "." + parts[1] + "." + flipUnusedBits(t, parts[2]),
		"a line break in it":    parts[0] + "." + parts[1] + "." + parts[2][:40] + "\n" + parts[2][40:],
		"a line break, payload": parts[0] + "." + parts[1][:10] + "\r\n" + parts[1][10:] + "." + parts[2],
	} {
		t.Run("token/"+name, func(t *testing.T) {
			if forged == tok {
				t.Fatal("the forgery is the token")
			}
			if _, err := VerifyToken(forged, pub, now); err == nil {
				t.Fatalf("VerifyToken accepted %q, a respelling of %q", forged, tok)
			}
		})
	}

	_, kpriv, trusted := keyring(t)
	signed, err := Sign(NewPlan(t0), kpriv, "ops")
	if err != nil {
		t.Fatal(err)
	}
	var s Signed
	json.Unmarshal(signed, &s)
	for name, edit := range map[string]func(s *Signed){
		"unused bits":   func(s *Signed) { s.Signature = flipUnusedBits(t, s.Signature) },
		"a line break":  func(s *Signed) { s.Signature = s.Signature[:20] + "\n" + s.Signature[20:] },
		"key respelled": func(s *Signed) { s.PublicKey = flipUnusedBits(t, s.PublicKey) },
	} {
		t.Run("plan/"+name, func(t *testing.T) {
			c := s
			edit(&c)
			b, _ := json.Marshal(c)
			if _, err := Verify(b, trusted, t0); err == nil || !strings.Contains(err.Error(), "bad signature") {
				t.Fatalf("Verify of a respelled signature: %v, want bad signature", err)
			}
		})
	}
}

// TestDuplicateKeysRefused: a plan, or the signed file around it, that
// names a key twice (or twice in different case) is refused, so no
// reader can see another plan than nexus does. The signature is made
// over the plan Go's decoder would read, so only this check stops it.
func TestDuplicateKeysRefused(t *testing.T) {
	_, priv, trusted := keyring(t)
	p := NewPlan(t0)
	p.Limits.RAMMB = 8192
	signed, err := Sign(p, priv, "ops")
	if err != nil {
		t.Fatal(err)
	}
	var s Signed
	json.Unmarshal(signed, &s)
	var compact bytes.Buffer
	json.Compact(&compact, s.Plan)
	plan := compact.String()
	if !strings.Contains(plan, `"ram_mb":8192`) {
		t.Fatalf("the canonical plan is %s", plan)
	}
	wrap := func(plan string) []byte {
		return []byte(`{"plan":` + plan + `,"authority":"ops","public_key":"` + s.PublicKey + `","signature":"` + s.Signature + `"}`)
	}
	// Sanity: the file as built verifies.
	if _, err := Verify(wrap(plan), trusted, t0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"a nested key twice", wrap(strings.Replace(plan, `"ram_mb":8192`, `"ram_mb":512,"ram_mb":8192`, 1)), `"plan.limits.ram_mb" appears twice`},
		{"a nested key in two cases", wrap(strings.Replace(plan, `"ram_mb":8192`, `"RAM_MB":512,"ram_mb":8192`, 1)), "differ only in case"},
		{"a top-level key twice", wrap(strings.Replace(plan, `"limits":`, `"limits":{"ram_mb":512},"limits":`, 1)), `"plan.limits" appears twice`},
		{"the signature twice", bytes.Replace(wrap(plan), []byte(`"signature":`), []byte(`"signature":"AAAA","signature":`), 1), `"signature" appears twice`},
		{"the plan twice", bytes.Replace(wrap(plan), []byte(`"plan":`), []byte(`"plan":{},"plan":`), 1), `"plan" appears twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Verify(tc.b, trusted, t0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Verify: %v, want %q", err, tc.want)
			}
		})
	}
	if _, err := DecodePlan([]byte(`{"version":1,"version":1}`)); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("DecodePlan of a key twice: %v", err)
	}
}

// FuzzVerify: whatever the bytes, Verify and VerifyToken return without
// panicking, and a document with a key named twice never verifies.
func FuzzVerify(f *testing.F) {
	for _, s := range []string{`{}`, `{"plan":{},"plan":{}}`, `{"plan":{"limits":{"ram_mb":1,"RAM_MB":2}}}`,
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`, `{"a":`, `nxid1.e30.AAAA`} {
		f.Add([]byte(s))
	}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	f.Fuzz(func(t *testing.T, b []byte) {
		Verify(b, []Authority{{Name: "x", Key: pub}}, t0)
		VerifyToken(string(b), pub, t0)
		if err := checkDuplicateKeys(b); err == nil {
			if !json.Valid(b) {
				t.Fatalf("checkDuplicateKeys accepted %q, which is not JSON", b)
			}
		}
	})
}
