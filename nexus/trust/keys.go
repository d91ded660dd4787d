package trust

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The key files. A public key is one line, "nexus-ed25519 <base64> <name>",
// which `nexus trust add` reads and `nexus trust pubkey` prints; a private
// key is "NEXUS-ED25519-PRIVATE <base64 seed>", mode 0600, in the state
// directory only.
const (
	pubPrefix  = "nexus-ed25519"
	privPrefix = "NEXUS-ED25519-PRIVATE"
)

// Keyring is the state directory's keys: keys/ (the plan keys made
// here), trusted/ (the plan authorities it trusts) and admission.key
// (nexus's own key, which signs identity tokens).
type Keyring struct{ Dir string }

var keyNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ErrUntrusted is a signature by a key the state directory does not
// trust.
var ErrUntrusted = errors.New("untrusted plan authority")

// Authority is a trusted plan key.
type Authority struct {
	Name        string            `json:"name"`
	Fingerprint string            `json:"fingerprint"`
	Key         ed25519.PublicKey `json:"-"`
}

// Fingerprint names a public key: the first 16 hex digits of its sha256.
func Fingerprint(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:8])
}

// FormatPublic is a public key's line.
func FormatPublic(pub ed25519.PublicKey, name string) string {
	return fmt.Sprintf("%s %s %s\n", pubPrefix, base64.StdEncoding.EncodeToString(pub), name)
}

// ParsePublic reads a public key's line.
func ParsePublic(b []byte) (ed25519.PublicKey, string, error) {
	f := strings.Fields(string(b))
	if len(f) < 2 || len(f) > 3 || f[0] != pubPrefix {
		return nil, "", fmt.Errorf("not a nexus public key (want one line: %s <base64> [name])", pubPrefix)
	}
	raw, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, "", errors.New("not a nexus public key: its key is not 32 bytes of base64")
	}
	name := ""
	if len(f) == 3 {
		name = f[2]
	}
	return ed25519.PublicKey(raw), name, nil
}

func (k Keyring) keyPath(name string) string { return filepath.Join(k.Dir, "keys", name+".key") }

// CreateKey makes a plan key pair named name and returns its public key's
// path. It never replaces a key.
func (k Keyring) CreateKey(name string) (string, error) {
	if !keyNameRE.MatchString(name) {
		return "", fmt.Errorf("key name %q: use 1-64 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", err
	}
	if err := writeKey(k.keyPath(name), priv); err != nil {
		return "", err
	}
	pubPath := filepath.Join(k.Dir, "keys", name+".pub")
	if err := os.WriteFile(pubPath, []byte(FormatPublic(pub, name)), 0o644); err != nil {
		return "", fmt.Errorf("writing %s: %w", pubPath, err)
	}
	return pubPath, nil
}

// writeKey writes a private key, refusing to replace one.
func writeKey(path string, priv ed25519.PrivateKey) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%s exists: a key is never replaced", path)
	}
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	_, err = fmt.Fprintf(f, "%s %s\n", privPrefix, base64.StdEncoding.EncodeToString(priv.Seed()))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// readKey reads a private key, refusing one that others can read.
func readKey(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %04o); a private key must be 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] != privPrefix {
		return nil, fmt.Errorf("%s is not a nexus private key", path)
	}
	seed, err := base64.StdEncoding.DecodeString(f[1])
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s is not a nexus private key (its seed is damaged)", path)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// Key reads the plan key named name.
func (k Keyring) Key(name string) (ed25519.PrivateKey, error) {
	if !keyNameRE.MatchString(name) {
		return nil, fmt.Errorf("key name %q is not a key name", name)
	}
	priv, err := readKey(k.keyPath(name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no key named %q in %s (nexus key create %s makes one)", name, filepath.Join(k.Dir, "keys"), name)
	}
	return priv, err
}

// AdmissionKey is nexus's own key, made on first use.
func (k Keyring) AdmissionKey() (ed25519.PrivateKey, error) {
	path := filepath.Join(k.Dir, "admission.key")
	priv, err := readKey(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err = ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		if err := writeKey(path, priv); err != nil {
			// Another nexus made it first: read theirs.
			if p2, rerr := readKey(path); rerr == nil {
				return p2, nil
			}
			return nil, err
		}
		return priv, nil
	}
	return priv, err
}

// Trust adds a plan authority's public key (its line) and returns it.
// Trusting a key twice changes nothing.
func (k Keyring) Trust(line []byte) (Authority, error) {
	pub, name, err := ParsePublic(line)
	if err != nil {
		return Authority{}, err
	}
	a := Authority{Name: name, Fingerprint: Fingerprint(pub), Key: pub}
	dir := filepath.Join(k.Dir, "trusted")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return a, err
	}
	path := filepath.Join(dir, a.Fingerprint+".pub")
	if err := os.WriteFile(path, []byte(FormatPublic(pub, name)), 0o644); err != nil {
		return a, fmt.Errorf("writing %s: %w", path, err)
	}
	return a, nil
}

// Trusted lists the trusted plan authorities; none means admission is
// off.
func (k Keyring) Trusted() ([]Authority, error) {
	files, err := filepath.Glob(filepath.Join(k.Dir, "trusted", "*.pub"))
	if err != nil {
		return nil, err
	}
	var out []Authority
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		pub, name, err := ParsePublic(b)
		if err != nil {
			return nil, fmt.Errorf("trusted key %s: %w", f, err)
		}
		out = append(out, Authority{Name: name, Fingerprint: Fingerprint(pub), Key: pub})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Fingerprint < out[j].Fingerprint })
	return out, nil
}

// Signed is a plan as its authority signed it: the file `nexus plan sign`
// writes and `--plan` reads.
type Signed struct {
	Plan json.RawMessage `json:"plan"`
	// Authority names the key (as its owner called it); the key itself
	// is what is checked.
	Authority string `json:"authority"`
	PublicKey string `json:"public_key"` // base64
	Signature string `json:"signature"`  // base64 ed25519 over the canonical plan
}

// Sign signs a plan that passes Check.
func Sign(p *Plan, priv ed25519.PrivateKey, name string) ([]byte, error) {
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("the plan is not valid: %w", err)
	}
	c := p.Canonical()
	s := Signed{Plan: c, Authority: name,
		PublicKey: base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)),
		Signature: base64.StdEncoding.EncodeToString(ed25519.Sign(priv, c))}
	return json.MarshalIndent(s, "", "  ")
}

// Verified is a plan that passed Verify.
type Verified struct {
	Plan      *Plan
	Digest    string
	Authority Authority
}

// Verify checks a signed plan: its signature, by an authority in trusted,
// over exactly the plan's fields; the plan's own fields; and its
// validity window at now. Every refusal says why.
func Verify(b []byte, trusted []Authority, now time.Time) (*Verified, error) {
	if err := checkDuplicateKeys(b); err != nil {
		return nil, fmt.Errorf("not a signed plan: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s Signed
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("not a signed plan: %w", err)
	}
	p, err := DecodePlan(s.Plan)
	if err != nil {
		return nil, err
	}
	// Strict: one key and one signature have one spelling each, so a
	// signed plan cannot be respelled into another file that verifies.
	raw, err := decodeExactly(base64.StdEncoding, s.PublicKey)
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return nil, errors.New("bad signature: public_key is not an ed25519 key")
	}
	pub := ed25519.PublicKey(raw)
	sig, err := decodeExactly(base64.StdEncoding, s.Signature)
	if err != nil || !ed25519.Verify(pub, p.Canonical(), sig) {
		return nil, errors.New("bad signature: the plan was not signed by the key it names, or was changed after signing")
	}
	var auth *Authority
	for i := range trusted {
		if trusted[i].Key.Equal(pub) {
			auth = &trusted[i]
		}
	}
	if auth == nil {
		return nil, fmt.Errorf("%w: the plan is signed by key %s (%q), which this state directory does not trust (nexus trust add)", ErrUntrusted, Fingerprint(pub), s.Authority)
	}
	if err := p.Check(); err != nil {
		return nil, fmt.Errorf("the plan is not valid: %w", err)
	}
	switch {
	case now.Before(p.NotBefore):
		return nil, fmt.Errorf("the plan is not yet valid: not_before is %s", p.NotBefore.Format(time.RFC3339))
	case !now.Before(p.NotAfter):
		return nil, fmt.Errorf("the plan has expired: not_after was %s", p.NotAfter.Format(time.RFC3339))
	}
	return &Verified{Plan: p, Digest: p.Digest(), Authority: *auth}, nil
}
