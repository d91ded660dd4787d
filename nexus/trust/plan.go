// Package trust is what nexus admits a sandbox under: plans (what a
// sandbox may be and do, signed by a plan authority with ed25519), the
// keys that sign them, and the authorities a state directory trusts.
package trust

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"time"
)

// PlanVersion is the plan format this nexus reads and writes.
const PlanVersion = 1

// Plan says what a sandbox may be and do. Every field is part of what
// the authority signs.
type Plan struct {
	Version   int       `json:"version"`
	Nonce     string    `json:"nonce"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	// Image pins what boots or restores; nil allows any image.
	Image   *Image   `json:"image,omitempty"`
	Limits  Limits   `json:"limits"`
	Network Network  `json:"network"`
	Grants  Grants   `json:"grants"`
	Secrets []string `json:"secrets,omitempty"` // names only, never values
	// Parent is the digest of the plan a child plan narrows ("" for a
	// plan of its own).
	Parent string `json:"parent,omitempty"`
}

// Image pins the guest's files by sha256 (hex); an empty field allows
// any.
type Image struct {
	Kernel    string `json:"kernel,omitempty"`
	RootImage string `json:"root_image,omitempty"`
}

// Limits are a sandbox's resources and budgets; 0 means the nether
// default for CPUs and RAM, and no budget for the rest.
type Limits struct {
	CPUs        int   `json:"cpus"`
	RAMMB       int   `json:"ram_mb"`
	MaxRuntimeS int64 `json:"max_runtime_s"`
	MaxCPUS     int64 `json:"max_cpu_s"`
	DiskSizeMB  int   `json:"disk_size_mb"`
}

// Network is the guest's network and its firewall's lists (CIDR
// prefixes or addresses).
type Network struct {
	Net   bool     `json:"net"`
	Allow []string `json:"allow,omitempty"`
	Block []string `json:"block,omitempty"`
}

// Grants are what the sandbox may open to the platform and what its
// descendants may use.
type Grants struct {
	DataPlane      bool `json:"data_plane"`
	Egress         bool `json:"egress"`
	MaxDescendants int  `json:"max_descendants"`
	// ForkBudget bounds the sum of the limits of all live children.
	ForkBudget Limits `json:"fork_budget"`
}

var (
	nonceRE  = regexp.MustCompile(`^[A-Za-z0-9_-]{16,128}$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	secretRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
)

// Check says what is wrong with a plan's own fields, naming the field.
func (p *Plan) Check() error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if p.Version != PlanVersion {
		bad("version", "%d, this nexus reads version %d", p.Version, PlanVersion)
	}
	if !nonceRE.MatchString(p.Nonce) {
		bad("nonce", "%q is not 16-128 letters, digits, '-' or '_'", p.Nonce)
	}
	if p.NotBefore.IsZero() || p.NotAfter.IsZero() {
		bad("not_after", "not_before and not_after are both required (RFC 3339)")
	} else if !p.NotAfter.After(p.NotBefore) {
		bad("not_after", "%s is not after not_before %s", p.NotAfter.Format(time.RFC3339), p.NotBefore.Format(time.RFC3339))
	}
	if p.Image != nil {
		for field, d := range map[string]string{"image.kernel": p.Image.Kernel, "image.root_image": p.Image.RootImage} {
			if d != "" && !digestRE.MatchString(d) {
				bad(field, "%q is not a sha256 digest (64 lower-case hex digits)", d)
			}
		}
	}
	checkLimits := func(prefix string, l Limits) {
		for field, v := range map[string]int64{"cpus": int64(l.CPUs), "ram_mb": int64(l.RAMMB), "max_runtime_s": l.MaxRuntimeS,
			"max_cpu_s": l.MaxCPUS, "disk_size_mb": int64(l.DiskSizeMB)} {
			if v < 0 {
				bad(prefix+field, "%d is negative", v)
			}
		}
	}
	checkLimits("limits.", p.Limits)
	checkLimits("grants.fork_budget.", p.Grants.ForkBudget)
	if p.Grants.MaxDescendants < 0 {
		bad("grants.max_descendants", "%d is negative", p.Grants.MaxDescendants)
	}
	for _, list := range []struct {
		field string
		v     []string
	}{{"network.allow", p.Network.Allow}, {"network.block", p.Network.Block}} {
		for _, c := range list.v {
			if _, err := ParsePrefix(c); err != nil {
				bad(list.field, "%v", err)
			}
		}
	}
	seen := map[string]bool{}
	for _, s := range p.Secrets {
		if !secretRE.MatchString(s) {
			bad("secrets", "%q is not a secret name (a letter or '_', then letters, digits or '_', at most 64)", s)
		}
		if seen[s] {
			bad("secrets", "%q is listed twice", s)
		}
		seen[s] = true
	}
	if p.Parent != "" && !digestRE.MatchString(p.Parent) {
		bad("parent", "%q is not a plan digest (64 lower-case hex digits)", p.Parent)
	}
	return errors.Join(errs...)
}

// ParsePrefix reads a CIDR prefix or a lone address (as a /32 or /128).
func ParsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix or an address", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix or an address", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// Canonical is the plan's bytes as signed: its JSON, fields in the
// struct's order (Go's encoding is deterministic for a struct).
func (p *Plan) Canonical() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		panic(err) // a struct of plain fields always encodes
	}
	return b
}

// Digest is the sha256 of the canonical plan, in hex: the plan's name in
// audit records, a sandbox's identity and a child plan's parent field.
func (p *Plan) Digest() string {
	h := sha256.Sum256(p.Canonical())
	return hex.EncodeToString(h[:])
}

// DecodePlan reads a plan, refusing fields it does not know (a field the
// signer did not mean cannot ride along unsigned) and keys named twice
// (which readers would resolve differently).
func DecodePlan(b []byte) (*Plan, error) {
	if err := checkDuplicateKeys(b); err != nil {
		return nil, fmt.Errorf("reading the plan: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	p := new(Plan)
	if err := dec.Decode(p); err != nil {
		return nil, fmt.Errorf("reading the plan: %w", err)
	}
	if dec.More() {
		return nil, errors.New("reading the plan: more than one JSON document")
	}
	return p, nil
}

// NewPlan is a valid skeleton: a fresh nonce, valid from now for an
// hour, one CPU and 512 MiB, no network, no grants.
func NewPlan(now time.Time) *Plan {
	var n [16]byte
	rand.Read(n[:])
	now = now.UTC().Truncate(time.Second)
	return &Plan{
		Version:   PlanVersion,
		Nonce:     hex.EncodeToString(n[:]),
		NotBefore: now,
		NotAfter:  now.Add(time.Hour),
		Limits:    Limits{CPUs: 1, RAMMB: 512, MaxRuntimeS: 3600},
	}
}
