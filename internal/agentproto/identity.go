package agentproto

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Identity is who a sandbox is in this boot, as the guest sees it at
// /run/nether/identity: the host it runs on, the sandbox, this boot (new
// for every boot, restore, wake and claim), the digest of the plan that
// admitted it, and a token signed by the orchestrator that says all of
// that to a service the guest calls. The agent writes what it is given;
// it checks only that each field fits on one line of that file.
type Identity struct {
	NodeID     string `json:"node_id,omitempty"`
	VMID       string `json:"vm_id,omitempty"`
	BootID     string `json:"boot_id,omitempty"`
	PlanDigest string `json:"plan_digest,omitempty"`
	Token      string `json:"token,omitempty"`
}

// MaxIdentityField bounds one field of an Identity (a token is the
// longest, a few hundred bytes).
const MaxIdentityField = 2048

// Check says why id cannot be written as /run/nether/identity, or nil.
func (id Identity) Check() error {
	for _, f := range id.fields() {
		if len(f[1]) > MaxIdentityField {
			return fmt.Errorf("identity %s is %d bytes; at most %d", f[0], len(f[1]), MaxIdentityField)
		}
		for i := 0; i < len(f[1]); i++ {
			if c := f[1][i]; c < 0x21 || c > 0x7e {
				return fmt.Errorf("identity %s holds byte 0x%02x at %d; printable ASCII only", f[0], c, i)
			}
		}
	}
	return nil
}

func (id Identity) fields() [][2]string {
	return [][2]string{{"node_id", id.NodeID}, {"vm_id", id.VMID}, {"boot_id", id.BootID},
		{"plan_digest", id.PlanDigest}, {"token", id.Token}}
}

// File is the text of /run/nether/identity: one key=value line per
// field that is set, in a fixed order, so a shell can read it with
// `. /run/nether/identity` or grep.
func (id Identity) File() string {
	var b strings.Builder
	for _, f := range id.fields() {
		if f[1] != "" {
			fmt.Fprintf(&b, "%s=%s\n", f[0], f[1])
		}
	}
	return b.String()
}

// Secrets are what a sandbox's admission supplied, by name, delivered by
// the agent into /run/secrets/NAME (guest memory only). A value is a
// []byte, never a string, so that whoever is done with it can zero it
// (Wipe): memory a program frees keeps its bytes until it is reused, and
// guest memory is what a snapshot saves and a fork reads. On the wire a
// value is base64, as a Text is.
type Secrets map[string][]byte

// Wipe zeroes every value in place. The map keeps its names.
func (s Secrets) Wipe() {
	for _, v := range s {
		clear(v)
	}
}

// They travel in one request's metadata, so their sum is bounded well
// under a frame.
const (
	MaxSecrets     = 32
	MaxSecretName  = 64
	MaxSecretBytes = 16 << 10 // all values together
)

// CheckSecretName says why name cannot name a secret file, or nil: a
// single file name of letters, digits, '_', '-' and '.', not starting
// with '.', so it can never climb out of /run/secrets or hide there.
func CheckSecretName(name string) error {
	if name == "" {
		return fmt.Errorf("a secret name cannot be empty")
	}
	if len(name) > MaxSecretName {
		return fmt.Errorf("secret name %.20q... is %d bytes; at most %d", name, len(name), MaxSecretName)
	}
	if name[0] == '.' {
		return fmt.Errorf("secret name %q starts with '.'", name)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-', r == '.':
		default:
			return fmt.Errorf("secret name %q holds %q; use letters, digits, '_', '-' and '.'", name, r)
		}
	}
	return nil
}

// CheckSecrets says why a set of secrets cannot be delivered, or nil.
func CheckSecrets(s Secrets) error {
	if len(s) > MaxSecrets {
		return fmt.Errorf("%d secrets; at most %d", len(s), MaxSecrets)
	}
	total := 0
	for _, name := range SecretNames(s) {
		if err := CheckSecretName(name); err != nil {
			return err
		}
		total += len(s[name])
	}
	if total > MaxSecretBytes {
		return fmt.Errorf("the secrets' values come to %d bytes; at most %d together", total, MaxSecretBytes)
	}
	return nil
}

// SecretNames returns the names of s, sorted: what logs and audit
// records show of secrets (never a value).
func SecretNames(s Secrets) []string {
	names := make([]string, 0, len(s))
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Provisioned is the word a restore handshake's or provision's status
// ends with when the agent wrote the identity and secrets it was sent.
// An agent from before identity delivery answers without it, and the
// host refuses to go on rather than run a sandbox without its secrets.
const Provisioned = "provisioned"

// maxSecretsEncoding bounds what ReadSecrets reads: the values' limit in
// base64 plus room for names and punctuation.
const maxSecretsEncoding = MaxSecretBytes*2 + MaxSecrets*(MaxSecretName+8) + 64

// EncodeSecrets is how an orchestrator hands nether a sandbox's secrets
// (nether.conf's secrets_fd): a JSON object of name to base64 value.
func EncodeSecrets(s Secrets) []byte {
	b, _ := json.Marshal(s) // cannot fail: strings and bytes
	return b
}

// ReadSecrets reads EncodeSecrets' form from r, checked
// (CheckSecrets). Nothing of a value is ever in its errors, and the
// encoded bytes it read are zeroed before it returns.
func ReadSecrets(r io.Reader) (Secrets, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSecretsEncoding+1))
	defer clear(b)
	if err != nil {
		return nil, fmt.Errorf("reading the secrets: %w", err)
	}
	if len(b) > maxSecretsEncoding {
		return nil, fmt.Errorf("the secrets are over %d bytes encoded", maxSecretsEncoding)
	}
	var s Secrets
	if err := json.Unmarshal(b, &s); err != nil {
		// json's messages quote no input beyond a character.
		return nil, fmt.Errorf("the secrets are not a JSON object of name to base64 value: %w", err)
	}
	if err := CheckSecrets(s); err != nil {
		s.Wipe()
		return nil, err
	}
	return s, nil
}
