package nexus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
)

// Audit events, as the chain names them.
const (
	evCreate   = "create"
	evBoot     = "boot"
	evFork     = "fork"    // a child restored from a snapshot on request
	evRestore  = "restore" // a warm pool's member restored ahead of a claim
	evClaim    = "claim"
	evSnapshot = "snapshot"
	evPark     = "park"
	evWake     = "wake"
	evStop     = "stop"
	evRemove   = "rm"
	// evSnapshotRemove is a snapshot's removal (or its refusal while
	// sandboxes depend on it).
	evSnapshotRemove = "snapshot-rm"
	evKeyCreate      = "key-create"
	evTrustAdd       = "trust-add"
)

// audit appends a record of what happened to sb (nil for an operation
// that never found its sandbox) to the chain. err is the operation's
// outcome.
func (n *Nexus) audit(event string, sb *Sandbox, snapshot string, err error) {
	n.record(sandboxRecord(event, sb, snapshot), err)
}

// sandboxRecord is a record of event for sb (nil: none) and the snapshot
// it made, or else the one it came from.
func sandboxRecord(event string, sb *Sandbox, snapshot string) *store.AuditRecord {
	rec := &store.AuditRecord{Event: event, Snapshot: snapshot}
	if sb != nil {
		rec.Sandbox, rec.Parent, rec.Boot, rec.Plan = sb.ID, sb.Parent, sb.Boot, sb.Plan
		if snapshot == "" {
			rec.Snapshot = sb.Snapshot
		}
	}
	return rec
}

// record appends rec, with this node and err as its outcome, to the
// chain. A record that cannot be written is logged, since the operation
// has happened either way.
func (n *Nexus) record(rec *store.AuditRecord, err error) {
	n.stamp(rec, err)
	if werr := n.db.Update(func(tx *store.Tx) error { return tx.AppendAudit(rec) }); werr != nil {
		n.log.Error("audit: the record could not be written", "event", rec.Event, "err", werr)
	}
}

// stamp fills in rec's node and its outcome, err.
func (n *Nexus) stamp(rec *store.AuditRecord, err error) *store.AuditRecord {
	rec.Node, rec.Outcome = n.node, "ok"
	if err != nil {
		rec.Outcome = err.Error()
	}
	return rec
}

// AuditList returns the chain's records, only those naming ref (a
// sandbox's name or id, as the sandbox or as the parent) when it is set.
// A sandbox that was removed is found by its id.
func (n *Nexus) AuditList(ctx context.Context, ref string) ([]*store.AuditRecord, error) {
	var out []*store.AuditRecord
	err := n.db.View(func(tx *store.Tx) error {
		id := ref
		if ref != "" {
			if sb, err := tx.FindSandbox(ref); err == nil {
				id = sb.ID
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		var err error
		out, err = tx.Audit(id)
		return err
	})
	return out, err
}

// AuditVerify checks the whole chain and returns its head.
func (n *Nexus) AuditVerify(ctx context.Context) (store.AuditHead, error) {
	var head store.AuditHead
	err := n.db.View(func(tx *store.Tx) error {
		var err error
		head, err = tx.VerifyAudit()
		return err
	})
	return head, err
}

// NodeID is this state directory's node: minted once, kept in the store.
func (n *Nexus) NodeID() string { return n.node }

const metaNodeID = "node_id"

// loadNodeID reads the node id, minting it on the state directory's
// first use.
func (n *Nexus) loadNodeID() error {
	return n.db.Update(func(tx *store.Tx) error {
		if n.node = tx.Meta(metaNodeID); n.node == "" {
			n.node = newID()
			return tx.PutMeta(metaNodeID, n.node)
		}
		return nil
	})
}

// Keyring is the state directory's plan keys and trusted authorities.
func (n *Nexus) Keyring() trust.Keyring { return trust.Keyring{Dir: n.dir} }

// CreateKey makes a plan key pair (audited) and returns its public key's
// path.
func (n *Nexus) CreateKey(name string) (string, error) {
	path, err := n.Keyring().CreateKey(name)
	n.record(&store.AuditRecord{Event: evKeyCreate, Detail: "key " + name}, err)
	return path, err
}

// Trust adds a plan authority (audited).
func (n *Nexus) Trust(line []byte) (trust.Authority, error) {
	a, err := n.Keyring().Trust(line)
	n.record(&store.AuditRecord{Event: evTrustAdd, Detail: fmt.Sprintf("authority %s (%q)", a.Fingerprint, a.Name)}, err)
	return a, err
}
