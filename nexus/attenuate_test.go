package nexus

import (
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
)

func planAt(edit func(p *trust.Plan)) *trust.Plan {
	p := trust.NewPlan(time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
	edit(p)
	return p
}

// A lineage in the store: parent plan P (2 descendants, a fork budget of
// 1024 MiB), a child sandbox admitted under C (a child of P), and a
// grandchild under G (a child of C).
func lineage(t *testing.T) (*store.Store, *trust.Plan, string) {
	t.Helper()
	db, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := planAt(func(p *trust.Plan) {
		p.Limits.RAMMB = 1024
		p.Network = trust.Network{Net: true, Allow: []string{"10.0.0.0/8"}, Block: []string{"10.9.0.0/16"}}
		p.Grants = trust.Grants{MaxDescendants: 3, ForkBudget: trust.Limits{RAMMB: 1024}, DataPlane: true}
		p.Secrets = []string{"TOKEN"}
	})
	pd := p.Digest()
	c := planAt(func(c *trust.Plan) { c.Parent, c.Limits.RAMMB, c.Grants.MaxDescendants = pd, 512, 1 })
	g := planAt(func(g *trust.Plan) { g.Parent, g.Limits.RAMMB = c.Digest(), 256 })
	err = db.Update(func(tx *store.Tx) error {
		for _, pl := range []*trust.Plan{p, c, g} {
			if err := tx.PutPlan(pl.Digest(), pl.Canonical()); err != nil {
				return err
			}
		}
		if err := tx.PutSandbox(&store.Sandbox{ID: "01CHILD0000000000000000000", Plan: c.Digest()}); err != nil {
			return err
		}
		return tx.PutSandbox(&store.Sandbox{ID: "01GRANDCHILD00000000000000", Plan: g.Digest()})
	})
	if err != nil {
		t.Fatal(err)
	}
	return db, p, pd
}

func TestAttenuation(t *testing.T) {
	db, parent, pd := lineage(t)
	child := func(edit func(c *trust.Plan)) *trust.Plan {
		return planAt(func(c *trust.Plan) {
			c.Parent, c.Limits.RAMMB = pd, 256
			c.Limits.MaxRuntimeS = parent.Limits.MaxRuntimeS
			c.Network.Block = []string{"10.9.0.0/16"}
			c.Secrets = []string{"TOKEN"}
			if edit != nil {
				edit(c)
			}
		})
	}
	cases := []struct {
		name     string
		plan     *trust.Plan
		children int
		want     string // "" admitted
	}{
		{"a narrower child", child(nil), 1, ""},
		// The parent plan hands its sandbox TOKEN: a dirty snapshot's
		// child plan must list it too.
		{"no secrets", child(func(c *trust.Plan) { c.Secrets = nil }), 1, "secrets: the snapshot is dirty and its plan handed the sandbox TOKEN, which its tenant may have copied into the memory a fork inherits; the child plan must list TOKEN too (it lists none)"},
		{"more RAM than the parent", child(func(c *trust.Plan) { c.Limits.RAMMB = 2048 }), 1, "limits.ram_mb: the child plan asks for 2048, its parent allows 1024"},
		{"an unbounded runtime", child(func(c *trust.Plan) { c.Limits.MaxRuntimeS = 0 }), 1, "limits.max_runtime_s: the child plan asks for no bound"},
		{"a wider allow-list", child(func(c *trust.Plan) {
			c.Network = trust.Network{Net: true, Allow: []string{"0.0.0.0/0"}, Block: []string{"10.9.0.0/16"}}
		}), 1, "network.allow 0.0.0.0/0: outside the parent plan's"},
		{"the parent's block dropped", child(func(c *trust.Plan) { c.Network.Block = nil }), 1, "network.block: the child plan drops its parent's 10.9.0.0/16"},
		{"an egress grant the parent lacks", child(func(c *trust.Plan) { c.Grants.Egress = true }), 1, "grants.egress"},
		{"more descendants than the parent", child(func(c *trust.Plan) { c.Grants.MaxDescendants = 9 }), 1, "grants.max_descendants: the child plan asks for 9"},
		{"a secret the parent does not list", child(func(c *trust.Plan) { c.Secrets = []string{"OTHER"} }), 1, "secrets: OTHER"},
		{"valid longer than the parent", child(func(c *trust.Plan) { c.NotAfter = parent.NotAfter.Add(time.Hour) }), 1, "not_after"},
		{"another parent", child(func(c *trust.Plan) { c.Parent = strings.Repeat("0", 64) }), 1, "parent: the snapshot was captured under plan"},
		{"no parent named", child(func(c *trust.Plan) { c.Parent = "" }), 1, "it names none"},
		// P has a child and a grandchild (2 of 3 descendants) and 512 of
		// its 1024 MiB budget in its one live child.
		{"past max_descendants through the grandchild", child(nil), 2, "grants.max_descendants: plan " + pd[:12] + " allows 3 descendants, it has 2, and the fork adds 2"},
		{"past the fork budget", child(func(c *trust.Plan) { c.Limits.RAMMB = 768 }), 1, "grants.fork_budget.ram_mb: the children's 1280 would pass the budget of 1024"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := db.View(func(tx *store.Tx) error { return attenuate(tx, c.plan, pd, c.children) })
			if c.want == "" {
				if err != nil {
					t.Fatalf("attenuate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("attenuate: %v, want %q", err, c.want)
			}
		})
	}
	// A snapshot captured unadmitted holds no lineage, and a plan cannot
	// claim one for it.
	if err := db.View(func(tx *store.Tx) error { return attenuate(tx, child(func(c *trust.Plan) { c.Parent = "" }), "", 1) }); err != nil {
		t.Fatalf("a fork of an unadmitted snapshot: %v", err)
	}
	if err := db.View(func(tx *store.Tx) error { return attenuate(tx, child(nil), "", 1) }); err == nil {
		t.Fatal("a child plan naming a parent for an unadmitted snapshot was admitted")
	}
}

// A fork admitted but not yet recorded holds its place: a second fork at
// the same moment counts its children; once they are recorded they count
// once, not twice; an expired place counts for nothing.
func TestReservationsHoldAFork(t *testing.T) {
	db, parent, pd := lineage(t)
	child := planAt(func(c *trust.Plan) {
		c.Parent, c.Limits.RAMMB, c.Limits.MaxRuntimeS = pd, 256, parent.Limits.MaxRuntimeS
		c.Network.Block = []string{"10.9.0.0/16"}
		c.Secrets = parent.Secrets
	})
	check := func(n int) error {
		return db.View(func(tx *store.Tx) error { return attenuate(tx, child, pd, n) })
	}
	if err := check(1); err != nil {
		t.Fatalf("one more descendant of 3 (2 live): %v", err)
	}
	other := planAt(func(c *trust.Plan) { c.Parent, c.Limits.RAMMB = pd, 256 })
	db.Update(func(tx *store.Tx) error {
		tx.PutPlan(other.Digest(), other.Canonical())
		return tx.Reserve(other.Digest(), 1, time.Now().Add(time.Minute))
	})
	if err := check(1); err == nil || !strings.Contains(err.Error(), "it has 3, and the fork adds 1") {
		t.Fatalf("with a fork of 1 in flight: %v, want max_descendants refused", err)
	}
	// Its child recorded, under the reservation: still 3, not 4.
	db.Update(func(tx *store.Tx) error {
		return tx.PutSandbox(&store.Sandbox{ID: "01OTHER0000000000000000000", Plan: other.Digest()})
	})
	if err := check(1); err == nil || !strings.Contains(err.Error(), "it has 3, and") {
		t.Fatalf("the reserved child recorded: %v, want it counted once", err)
	}
	db.Update(func(tx *store.Tx) error {
		tx.DeleteSandbox(&store.Sandbox{ID: "01OTHER0000000000000000000"})
		return tx.Reserve(other.Digest(), 1, time.Now().Add(-time.Second))
	})
	if err := check(1); err != nil {
		t.Fatalf("an expired reservation still counts: %v", err)
	}
}
