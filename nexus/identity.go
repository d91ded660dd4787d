package nexus

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
	"github.com/nethersandbox/nether/runner"
)

// Identity and secrets. Every run of a sandbox's nether (a boot, a
// restore, a wake) gets a boot id of its own, and with it an identity
// token signed by the admission key; a pool claim gets another of each.
// nether hands both to the guest (/run/nether/identity), with the
// secrets the operation was given (/run/secrets), before the first
// command. Secrets exist in nexus only for the operation that delivers
// them: they reach nether through a memory file descriptor, never a file
// on disk, and the store keeps their names only.

// evSecrets is the audit record of a secret delivery (names only).
const evSecrets = "secrets"

// WithSecrets returns a Nexus whose next start, fork or resume delivers
// secrets (name to value) to the sandbox. Under admission the plan must
// list every name.
func (n *Nexus) WithSecrets(secrets map[string][]byte) *Nexus {
	c := *n
	c.secrets = secrets
	return &c
}

// CheckSecrets refuses a set of secrets nether would refuse (names,
// count, size), before anything starts.
func CheckSecrets(secrets map[string][]byte) error { return runner.CheckSecrets(secrets) }

// secretNames are the names of what n delivers, sorted.
func (n *Nexus) secretNames() []string { return runner.SecretNames(n.secrets) }

// unlistedSecrets names the secrets the plan does not list.
func unlistedSecrets(names, listed []string) []string {
	var out []string
	for _, nm := range names {
		if !slices.Contains(listed, nm) {
			out = append(out, nm)
		}
	}
	return out
}

// identityToken signs sb's identity in boot with the admission key. It
// is good for trust.TokenLifetime, and never past the plan's not_after.
func (n *Nexus) identityToken(sb *Sandbox, boot string) (string, error) {
	key, err := n.Keyring().AdmissionKey()
	if err != nil {
		return "", fmt.Errorf("the admission key: %w", err)
	}
	now := time.Now()
	t := trust.Token{NodeID: n.node, VMID: sb.ID, BootID: boot, PlanDigest: sb.Plan, IssuedAt: now, ExpiresAt: now.Add(trust.TokenLifetime)}
	if sb.Plan != "" {
		var p *trust.Plan
		n.db.View(func(tx *store.Tx) error { p, err = storedPlan(tx, sb.Plan); return err })
		if p != nil && p.NotAfter.Before(t.ExpiresAt) && p.NotAfter.After(now) {
			t.ExpiresAt = p.NotAfter
		}
	}
	return trust.SignToken(t, key)
}

// delivered records what a run that came up holds of secrets: the names
// this operation delivered (audited), none for a boot or fork given none,
// and a woken park's own when its wake gave none (its guest kept them).
func (n *Nexus) delivered(sb *Sandbox, wake bool) {
	names := n.secretNames()
	switch {
	case len(names) > 0:
		sb.Secrets = names
		rec := sandboxRecord(evSecrets, sb, "")
		rec.Detail = strings.Join(names, ",")
		n.record(rec, nil)
	case !wake:
		sb.Secrets = nil
	}
}
