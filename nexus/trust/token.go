package trust

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// An identity token is nexus's signed statement of who a sandbox is in
// one boot: {node_id, vm_id, boot_id, plan_digest} and when the statement
// was made and stops being good. The guest finds it in
// /run/nether/identity; a service the guest calls checks it against the
// public key `nexus trust pubkey` prints (VerifyToken, or any ed25519
// library), so it learns which admitted boot is calling, never just
// "someone with a copy of that memory".
//
// The form is three dot-separated parts, in base64url without padding:
//
//	nether-identity-v1.<payload JSON>.<ed25519 signature>
//
// The signature covers "nether-identity-v1." followed by the payload
// part, exactly as it stands in the token.

// TokenPrefix starts every identity token.
const TokenPrefix = "nether-identity-v1"

// TokenLifetime is how long a token is good for. It is short so a copy
// taken out of a sandbox stops working soon; every boot, restore, wake
// and claim gets a new one, and the plan's own window caps it.
const TokenLifetime = time.Hour

// Token is the statement a token signs.
type Token struct {
	NodeID     string    `json:"node_id"`
	VMID       string    `json:"vm_id"`
	BootID     string    `json:"boot_id"`
	PlanDigest string    `json:"plan_digest,omitempty"` // "" for an unadmitted sandbox
	IssuedAt   time.Time `json:"iat"`
	ExpiresAt  time.Time `json:"exp"`
}

// b64 is strict: bits past the last whole byte must be zero, so each
// token has exactly one spelling. A lax decoder would verify a signature
// whose last character differs only in those bits: two strings, one
// token, and two entries in anything keyed by the token's text.
var b64 = base64.RawURLEncoding.Strict()

// SignToken signs t with priv (nexus's admission key).
func SignToken(t Token, priv ed25519.PrivateKey) (string, error) {
	if t.NodeID == "" || t.VMID == "" || t.BootID == "" {
		return "", errors.New("identity token: node_id, vm_id and boot_id are all needed")
	}
	if !t.ExpiresAt.After(t.IssuedAt) {
		return "", errors.New("identity token: it would expire before it is issued")
	}
	t.IssuedAt, t.ExpiresAt = t.IssuedAt.UTC().Truncate(time.Second), t.ExpiresAt.UTC().Truncate(time.Second)
	payload, err := json.Marshal(t)
	if err != nil {
		return "", err
	}
	signed := TokenPrefix + "." + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(ed25519.Sign(priv, []byte(signed))), nil
}

// decodeExactly decodes s, refusing any spelling but the one enc writes
// for those bytes: a strict decoder still skips line breaks inside s.
func decodeExactly(enc *base64.Encoding, s string) ([]byte, error) {
	b, err := enc.DecodeString(s)
	if err != nil {
		return nil, err
	}
	if enc.EncodeToString(b) != s {
		return nil, errors.New("not in canonical form")
	}
	return b, nil
}

// VerifyToken checks token's signature by pub and that now is inside its
// window, and returns what it states.
func VerifyToken(token string, pub ed25519.PublicKey, now time.Time) (*Token, error) {
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 || parts[0] != TokenPrefix {
		return nil, fmt.Errorf("not an identity token (want %s.<payload>.<signature>)", TokenPrefix)
	}
	payload, err := decodeExactly(b64, parts[1])
	if err != nil {
		return nil, fmt.Errorf("identity token: the payload is not base64url: %w", err)
	}
	sig, err := decodeExactly(b64, parts[2])
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, errors.New("identity token: the signature is malformed")
	}
	if !ed25519.Verify(pub, []byte(parts[0]+"."+parts[1]), sig) {
		return nil, errors.New("identity token: the signature does not verify with this key")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	var t Token
	if err := dec.Decode(&t); err != nil {
		return nil, fmt.Errorf("identity token: the payload: %w", err)
	}
	switch {
	case now.Before(t.IssuedAt.Add(-time.Minute)): // a minute of clock skew
		return &t, fmt.Errorf("identity token: issued at %s, in the future", t.IssuedAt.Format(time.RFC3339))
	case !now.Before(t.ExpiresAt):
		return &t, fmt.Errorf("identity token: expired at %s", t.ExpiresAt.Format(time.RFC3339))
	}
	return &t, nil
}
