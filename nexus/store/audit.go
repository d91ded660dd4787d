package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The audit chain: an append-only list of what nexus did and refused,
// each record carrying the hash of the one before it, and the store's
// meta bucket the hash of the last. A record altered or removed breaks
// the chain at that record; the last one removed (or the chain cut short)
// no longer matches the head. Whoever can write the state directory can
// rebuild the whole chain, so the chain proves order and completeness
// against mistakes and against tools that do not know it, not against
// the directory's owner; a copy of the head kept elsewhere (VerifyAudit
// prints it) makes a rewrite visible too.

var bAudit = []byte("audit") // big-endian seq -> record JSON

const metaAuditHead = "audit_head" // "<seq> <hex sha256 of that record>"

// AuditRecord is one entry of the chain.
type AuditRecord struct {
	Seq   uint64    `json:"seq"`
	Time  time.Time `json:"time"`
	Event string    `json:"event"` // create, boot, restore, fork, claim, snapshot, park, wake, stop, rm, refuse ...
	// Outcome is "ok", or what went wrong (the refusal's reason).
	Outcome string `json:"outcome"`
	// The identity the event concerns, and what caused it.
	Node     string `json:"node,omitempty"`
	Sandbox  string `json:"sandbox,omitempty"`
	Boot     string `json:"boot,omitempty"`
	Plan     string `json:"plan,omitempty"`     // the plan's digest
	Parent   string `json:"parent,omitempty"`   // the sandbox it came from
	Snapshot string `json:"snapshot,omitempty"` // the checkpoint it came from or made
	Detail   string `json:"detail,omitempty"`
	// Prev is the hex sha256 of the previous record as stored ("" for
	// the first).
	Prev string `json:"prev"`
}

func auditKey(seq uint64) []byte {
	var k [8]byte
	binary.BigEndian.PutUint64(k[:], seq)
	return k[:]
}

func auditHash(raw []byte) string {
	h := sha256.Sum256(raw)
	return hex.EncodeToString(h[:])
}

// AppendAudit adds records to the end of the chain, numbering and
// linking them; each gets its Seq and Prev filled in.
func (t *Tx) AppendAudit(recs ...*AuditRecord) error {
	b, err := t.tx.CreateBucketIfNotExists(bAudit)
	if err != nil {
		return err
	}
	var seq uint64
	prev := ""
	if head := t.Meta(metaAuditHead); head != "" {
		if _, err := fmt.Sscanf(head, "%d %s", &seq, &prev); err != nil {
			return fmt.Errorf("the audit chain's head %q is damaged: %w", head, err)
		}
	}
	for _, r := range recs {
		seq++
		r.Seq, r.Prev = seq, prev
		if r.Time.IsZero() {
			r.Time = time.Now().UTC()
		}
		raw, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if err := b.Put(auditKey(seq), raw); err != nil {
			return err
		}
		prev = auditHash(raw)
	}
	return t.PutMeta(metaAuditHead, fmt.Sprintf("%d %s", seq, prev))
}

// Audit reads the records in order; with sandbox set, only those that
// name it (as the sandbox or as the parent).
func (t *Tx) Audit(sandbox string) ([]*AuditRecord, error) {
	b := t.bucket(bAudit)
	if b == nil {
		return nil, nil
	}
	var out []*AuditRecord
	err := b.ForEach(func(k, raw []byte) error {
		r := new(AuditRecord)
		if err := json.Unmarshal(raw, r); err != nil {
			return fmt.Errorf("audit record %d is damaged: %w", binary.BigEndian.Uint64(k), err)
		}
		if sandbox == "" || r.Sandbox == sandbox || r.Parent == sandbox {
			out = append(out, r)
		}
		return nil
	})
	return out, err
}

// ErrAuditBroken is what VerifyAudit returns for a chain that was
// altered, cut or had records removed.
var ErrAuditBroken = errors.New("the audit chain is broken")

// AuditHead is the end of a verified chain.
type AuditHead struct {
	Records uint64 `json:"records"`
	Hash    string `json:"hash"` // hex sha256 of the last record
}

// VerifyAudit walks the whole chain: every record in sequence from 1,
// each linked to the hash of the one before, the last matching the
// stored head. It names the first record that fails.
func (t *Tx) VerifyAudit() (AuditHead, error) {
	var head AuditHead
	var wantSeq uint64
	wantHead := t.Meta(metaAuditHead)
	if wantHead != "" {
		var h string
		if _, err := fmt.Sscanf(wantHead, "%d %s", &wantSeq, &h); err != nil {
			return head, fmt.Errorf("%w: its head %q is damaged", ErrAuditBroken, wantHead)
		}
	}
	b := t.bucket(bAudit)
	if b == nil {
		if wantSeq != 0 {
			return head, fmt.Errorf("%w: the head names record %d and there are no records", ErrAuditBroken, wantSeq)
		}
		return head, nil
	}
	var r struct {
		Seq  uint64 `json:"seq"`
		Prev string `json:"prev"`
	}
	prev := ""
	c := b.Cursor()
	for k, raw := c.First(); k != nil; k, raw = c.Next() {
		key := binary.BigEndian.Uint64(k)
		r.Seq, r.Prev = 0, ""
		if len(k) != 8 || json.Unmarshal(raw, &r) != nil {
			return head, fmt.Errorf("%w: record %d is not a record (damaged)", ErrAuditBroken, key)
		}
		switch {
		case key != head.Records+1:
			return head, fmt.Errorf("%w: record %d is missing (the next is %d)", ErrAuditBroken, head.Records+1, key)
		case r.Seq != key:
			return head, fmt.Errorf("%w: record %d says it is record %d (altered)", ErrAuditBroken, key, r.Seq)
		case r.Prev != prev:
			return head, fmt.Errorf("%w: record %d does not follow record %d (record %d was altered)", ErrAuditBroken, key, key-1, key-1)
		}
		prev = auditHash(raw)
		head.Records, head.Hash = key, prev
	}
	if got := fmt.Sprintf("%d %s", head.Records, head.Hash); wantHead != "" && got != wantHead || wantHead == "" && head.Records != 0 {
		if head.Records < wantSeq {
			return head, fmt.Errorf("%w: the chain ends at record %d and its head names record %d (records %d-%d removed)", ErrAuditBroken, head.Records, wantSeq, head.Records+1, wantSeq)
		}
		return head, fmt.Errorf("%w: record %d does not match the chain's head (altered or added outside nexus)", ErrAuditBroken, head.Records)
	}
	return head, nil
}

var bNonces = []byte("nonces") // plan nonce -> its plan's not_after (RFC 3339)

// ErrReplay is a plan nonce that was used before.
var ErrReplay = errors.New("the plan's nonce was used before (a replay)")

// UseNonce records a plan's nonce as spent, refusing one spent before.
// A nonce is kept until its plan has expired (a week after, for clock
// steps), when it can no longer be replayed anyway.
func (t *Tx) UseNonce(nonce string, notAfter, now time.Time) error {
	b, err := t.tx.CreateBucketIfNotExists(bNonces)
	if err != nil {
		return err
	}
	if b.Get([]byte(nonce)) != nil {
		return fmt.Errorf("%w: nonce %s", ErrReplay, nonce)
	}
	// Forget nonces long expired, a few at a time.
	c := b.Cursor()
	dropped := 0
	for k, v := c.First(); k != nil && dropped < 64; k, v = c.Next() {
		if until, err := time.Parse(time.RFC3339Nano, string(v)); err == nil && now.After(until.Add(7*24*time.Hour)) {
			if err := c.Delete(); err != nil {
				return err
			}
			dropped++
		}
	}
	return b.Put([]byte(nonce), []byte(notAfter.UTC().Format(time.RFC3339Nano)))
}

var bPlans = []byte("plans") // plan digest -> the plan's canonical JSON

// PutPlan keeps an admitted plan, so that the plans of its children can be
// held to it.
func (t *Tx) PutPlan(digest string, canonical []byte) error {
	b, err := t.tx.CreateBucketIfNotExists(bPlans)
	if err != nil {
		return err
	}
	return b.Put([]byte(digest), canonical)
}

// Plan reads an admitted plan's canonical JSON (nil when unknown).
func (t *Tx) Plan(digest string) []byte {
	if b := t.bucket(bPlans); b != nil {
		return bytes.Clone(b.Get([]byte(digest)))
	}
	return nil
}

var bReservations = []byte("reservations") // plan digest -> Reservation JSON

// Reservation holds a fork's place in its parent plan's grants from its
// admission until its children's records exist: N children admitted
// under one plan digest, until Expires (a nexus that died mid-fork frees
// its place then).
type Reservation struct {
	N       int       `json:"n"`
	Expires time.Time `json:"expires"`
}

// Reserve records that n children are being made under the plan digest.
func (t *Tx) Reserve(digest string, n int, expires time.Time) error {
	b, err := t.tx.CreateBucketIfNotExists(bReservations)
	if err != nil {
		return err
	}
	v, _ := json.Marshal(Reservation{N: n, Expires: expires.UTC()})
	return b.Put([]byte(digest), v)
}

// Reservations returns the places held at now, by plan digest.
func (t *Tx) Reservations(now time.Time) (map[string]int, error) {
	out := map[string]int{}
	b := t.bucket(bReservations)
	if b == nil {
		return out, nil
	}
	err := b.ForEach(func(k, v []byte) error {
		var r Reservation
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("reservation %s: %w", k, err)
		}
		if now.Before(r.Expires) {
			out[string(k)] = r.N
		}
		return nil
	})
	return out, err
}

// DropReservation frees the place held under the plan digest (its
// children's records now count for themselves, or the fork failed).
func (t *Tx) DropReservation(digest string) error {
	if b := t.bucket(bReservations); b != nil {
		return b.Delete([]byte(digest))
	}
	return nil
}
