package nexus

import (
	"context"
	"fmt"
	"strings"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
	"github.com/nethersandbox/nether/runner"
)

// Snapshot classes. A clean snapshot holds nothing of a tenant's: it can
// be forked under any admitted plan whose image matches, and feed pools.
// Every other snapshot is dirty: it belongs to its lineage, and a fork of
// it is admitted only under a plan that descends from the one it was
// captured under (attenuate.go).
const (
	ClassClean = "clean"
	ClassDirty = "dirty"
)

// SnapshotClass is a snapshot's class ("" in records from before
// classes: dirty).
func SnapshotClass(s *Snapshot) string { return classOf(s) }

func classOf(s *Snapshot) string {
	if s.Class == ClassClean {
		return ClassClean
	}
	return ClassDirty
}

// SnapshotCreateClean captures a clean snapshot, or refuses, naming why,
// a sandbox that may hold a tenant's state.
func (n *Nexus) SnapshotCreateClean(ctx context.Context, ref, name string) (*Snapshot, error) {
	return n.snapshotCreate(ctx, ref, name, true)
}

// cleanRefusal says why a sandbox cannot give a clean snapshot ("" when
// it can): a plan that lists secrets or grants a plane, settings that
// open one, or traffic its NIC or planes carried (from nether's
// __stats__).
func cleanRefusal(sb *Sandbox, plan *trust.Plan, stats map[string]int64) string {
	var why []string
	if len(sb.Secrets) > 0 {
		why = append(why, "it holds secrets ("+strings.Join(sb.Secrets, ", ")+")")
	}
	if plan != nil && len(plan.Secrets) > 0 {
		why = append(why, "its plan hands it secrets ("+strings.Join(plan.Secrets, ", ")+")")
	}
	if plan != nil && (plan.Grants.DataPlane || plan.Grants.Egress) {
		why = append(why, "its plan grants it a data or egress plane")
	}
	if sb.Config.AppPort != 0 || sb.Config.EgressPort != 0 {
		why = append(why, "it has a data or egress plane (app_port, egress_port)")
	}
	if stats["net_tx"] > 0 || stats["net_rx"] > 0 {
		why = append(why, fmt.Sprintf("its network card carried traffic (net_tx=%d net_rx=%d)", stats["net_tx"], stats["net_rx"]))
	}
	if stats["data_conns"] > 0 {
		why = append(why, fmt.Sprintf("it served %d data or egress connections", stats["data_conns"]))
	}
	return strings.Join(why, "; ")
}

// checkClean refuses a clean capture of sb, naming why.
func (n *Nexus) checkClean(ctx context.Context, sb *Sandbox) error {
	var plan *trust.Plan
	if sb.Plan != "" {
		err := n.db.View(func(tx *store.Tx) error {
			var err error
			plan, err = storedPlan(tx, sb.Plan)
			return err
		})
		if err != nil {
			return fmt.Errorf("%w: a clean snapshot of %s: its %w", ErrRefused, sb.Ref(), err)
		}
	}
	var stats runner.Stats
	if err := n.verb(ctx, sb, func(c runner.Conn) (err error) { stats, err = c.Stats(ctx); return err }); err != nil {
		return err
	}
	if why := cleanRefusal(sb, plan, stats); why != "" {
		return fmt.Errorf("%w: a clean snapshot of %s: %s; take a dirty one (without --clean), which only its lineage can fork", ErrRefused, sb.Ref(), why)
	}
	return nil
}
