package nexus

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
)

// A warm pool keeps children of a snapshot restored and running, so a
// fork of that snapshot is a claim: one member takes the identity of the
// child asked for (nether's __claim__: a hostname, machine-id, session
// epoch and a CRNG reseeded from host randomness, none of which another
// member or an earlier claim had) and the pool is topped up behind it. A member's sandbox id is minted for it and
// never shown before the claim, so the claimed child keeps it.

// PoolSet sets snapshot ref's pool to size members (0 empties it) and
// brings it there: new members are restored, surplus ones removed.
func (n *Nexus) PoolSet(ctx context.Context, ref string, size int) (*store.Pool, error) {
	if size < 0 || size > 256 {
		return nil, fmt.Errorf("pool size %d: want 0 to 256", size)
	}
	snap, err := n.SnapshotInspect(ctx, ref)
	if err != nil {
		return nil, err
	}
	if snap.Digest == "" {
		return nil, fmt.Errorf("snapshot %s is still being written", snap.Ref())
	}
	if err := verify(snap); err != nil {
		return nil, err
	}
	p := &store.Pool{Snapshot: snap.ID, Size: size}
	if err := n.db.Update(func(tx *store.Tx) error { return tx.PutPool(p) }); err != nil {
		return nil, err
	}
	return p, n.fillPool(ctx, snap.ID)
}

// PoolStatus is a pool and how many of its members are up now.
type PoolStatus struct {
	store.Pool
	Members int `json:"members"` // restored or restoring
	Ready   int `json:"ready"`   // their guests answer: claimable now
}

// Pools lists the pools with their members.
func (n *Nexus) Pools(ctx context.Context) ([]*PoolStatus, error) {
	out := []*PoolStatus{} // empty, not nil: JSON []
	err := n.db.View(func(tx *store.Tx) error {
		ps, err := tx.Pools()
		if err != nil {
			return err
		}
		for _, p := range ps {
			ms, err := n.members(tx, p.Snapshot)
			if err != nil {
				return err
			}
			st := &PoolStatus{Pool: *p, Members: len(ms)}
			for _, sb := range ms {
				if sb.Lease == nil && n.alive(sb) && n.ready(sb) {
					st.Ready++
				}
			}
			out = append(out, st)
		}
		return nil
	})
	return out, err
}

// PoolReady is how many members of snapshot snapID's pool are restored
// and claimable now.
func (n *Nexus) PoolReady(ctx context.Context, snapID string) int {
	ps, err := n.Pools(ctx)
	if err != nil {
		return 0
	}
	for _, p := range ps {
		if p.Snapshot == snapID {
			return p.Ready
		}
	}
	return 0
}

// members are snap's pool members: ready ones are running with no lease.
func (n *Nexus) members(tx *store.Tx, snapID string) ([]*Sandbox, error) {
	sbs, err := tx.Sandboxes()
	if err != nil {
		return nil, err
	}
	var out []*Sandbox
	for _, sb := range sbs {
		if sb.Pool == snapID {
			out = append(out, sb)
		}
	}
	return out, nil
}

// fillPool restores members until the pool has its size, and removes
// members over it and members whose nethers died.
func (n *Nexus) fillPool(ctx context.Context, snapID string) error {
	var snap *Snapshot
	want, have := 0, 0
	var surplus []*Sandbox
	err := n.db.View(func(tx *store.Tx) error {
		s, err := tx.Snapshot(snapID)
		if err != nil {
			return err
		}
		snap = s
		pools, err := tx.Pools()
		if err != nil {
			return err
		}
		for _, p := range pools {
			if p.Snapshot == snapID {
				want = p.Size
			}
		}
		ms, err := n.members(tx, snapID)
		var up []*Sandbox
		for _, sb := range ms {
			if sb.Lease == nil && (sb.State != lifecycle.Running || !n.alive(sb)) {
				// A member whose nether died is no member: it would
				// count toward the size and never be claimed.
				surplus = append(surplus, sb)
				continue
			}
			up = append(up, sb)
		}
		have = len(up)
		for i := want; i < len(up); i++ {
			surplus = append(surplus, up[i])
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, sb := range surplus {
		if err := n.Remove(ctx, sb.ID, true); err != nil {
			return err
		}
	}
	if have >= want {
		return nil
	}
	names := make([]string, want-have)
	_, err = n.birth(ctx, snap, snap.Config, snap.Source, names, snap.ID, "", nil)
	return err
}

// claimFromPool claims up to len(names) ready members of snap's pool,
// giving each the identity of the child asked for.
func (n *Nexus) claimFromPool(ctx context.Context, snap *Snapshot, names []string, plan string) ([]*Sandbox, error) {
	var out []*Sandbox
	for _, name := range names {
		sb, err := n.takeMember(snap.ID)
		if err != nil || sb == nil {
			return out, err
		}
		t0 := time.Now()
		sb.Name, sb.Pool, sb.Plan = name, "", plan
		sb.Hostname = hostnameFor(sb)
		// A claim is a new boot of the member: its own boot id and token.
		prevBoot := sb.Boot
		sb.Boot = newID()
		var tok string
		if tok, err = n.identityToken(sb, sb.Boot); err == nil {
			req := runner.ClaimRequest{SandboxID: sb.ID, Hostname: sb.Hostname, NodeID: n.node, BootID: sb.Boot, Token: tok, PlanDigest: sb.Plan}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = n.verb(cctx, sb, func(c runner.Conn) error { return c.Claim(cctx, req) })
			cancel()
		}
		if err != nil {
			sb.Boot = prevBoot
		}
		n.audit(evClaim, sb, "", err)
		if err != nil {
			// A member that cannot be claimed is no member: remove it,
			// and try the next (or fork cold).
			n.log.Warn("a pool member could not be claimed; removing it", "sandbox", sb.ID, "err", err)
			n.terminate(sb, 10*time.Second)
			n.db.Update(func(tx *store.Tx) error { return n.unbirth(tx, sb) })
			continue
		}
		if err := n.release(sb); err != nil {
			return out, err
		}
		n.log.Info("claimed a pool member", "sandbox", sb.ID, "name", name, "took", time.Since(t0))
		out = append(out, sb)
	}
	return out, nil
}

// takeMember leases a ready member of snapID's pool for a claim, or
// returns nil when there is none.
func (n *Nexus) takeMember(snapID string) (*Sandbox, error) {
	var got *Sandbox
	err := n.db.Update(func(tx *store.Tx) error {
		ms, err := n.members(tx, snapID)
		if err != nil {
			return err
		}
		for _, sb := range ms {
			if sb.State != lifecycle.Running || sb.Lease != nil || !n.alive(sb) || !n.ready(sb) {
				continue
			}
			sb.Lease = &store.Lease{Op: "claim", Holder: os.Getpid(), Expires: time.Now().Add(time.Minute)}
			got = sb
			return tx.PutSandbox(sb)
		}
		return nil
	})
	return got, err
}

// ready says whether a sandbox's agent answers now.
func (n *Nexus) ready(sb *Sandbox) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c, err := n.run.Dial(ctx, n.sandboxDir(sb.ID))
	if err != nil {
		return false
	}
	defer c.Close()
	return c.Info().AgentConnected()
}

// refillDelay is how long a refill waits after a claim. A restore is
// heavy (an engine process, its memory mapped in) and the claimed child's
// first requests come at once: on a small host the refill would take the
// CPU they need. A pool drained faster than this refills later; forks
// then restore cold, as without a pool.
var refillDelay = 2 * time.Second // a var: tests shorten it

// topUp refills snapID's pool after refillDelay without making the caller
// wait: in a detached `nexus pool fill` when the caller is a command about
// to exit (Options.SelfForFill), else on a goroutine.
func (n *Nexus) topUp(snapID string) {
	if n.self != "" {
		cmd := exec.Command(n.self, "--state-dir", n.dir, "pool", "fill", "--after", refillDelay.String(), snapID)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		cmd.Env = os.Environ()
		if n.nether != "" {
			cmd.Env = append(cmd.Env, "NEXUS_NETHER="+n.nether)
		}
		if err := cmd.Start(); err == nil {
			go cmd.Wait()
			return
		}
	}
	go func() {
		time.Sleep(refillDelay)
		if err := n.fillPool(context.Background(), snapID); err != nil {
			n.log.Error("topping up a pool", "snapshot", snapID, "err", err)
		}
	}()
}

// PoolFill is `nexus pool fill`: bring a pool to its size and return.
func (n *Nexus) PoolFill(ctx context.Context, ref string) error {
	snap, err := n.SnapshotInspect(ctx, ref)
	if err != nil {
		return err
	}
	return n.fillPool(ctx, snap.ID)
}
