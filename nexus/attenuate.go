package nexus

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
)

// Attenuation: a fork of a snapshot captured under plan P is admitted
// only under a child plan that names P as its parent and is a subset of
// it, and only while P's grants have room: its descendants (children,
// grandchildren, ...) at most max_descendants, and the sum of its live
// children's limits within fork_budget. A snapshot captured unadmitted
// has no parent plan to hold a fork to.

// attenuate checks child, for a fork of n more children, against the
// plan parentDigest names.
func attenuate(tx *store.Tx, child *trust.Plan, parentDigest string, n int) error {
	if parentDigest == "" {
		if child.Parent != "" {
			return fmt.Errorf("parent: the plan names parent plan %s, and the snapshot was captured unadmitted", short12(child.Parent))
		}
		return nil
	}
	if child.Parent != parentDigest {
		return fmt.Errorf("parent: the snapshot was captured under plan %s, and a fork's plan must name it as its parent (it names %s)", short12(parentDigest), orNoneDigest(child.Parent))
	}
	parent, err := storedPlan(tx, parentDigest)
	if err != nil {
		return fmt.Errorf("parent: %w", err)
	}
	if err := errors.Join(subset(child, parent), keepsSecrets(child, parent)); err != nil {
		return err
	}
	return withinGrants(tx, child, parent, parentDigest, n)
}

// keepsSecrets refuses a child plan that does not list every secret its
// parent plan lists. attenuate runs for dirty snapshots only, and a
// dirty snapshot holds whatever its tenant made of its secrets (a copy
// in a process, a file under /tmp, an environment variable): nether
// leaves none of its own in a base, but a fork inherits the tenant's
// memory whole. A child plan that does not list a secret must not get
// it that way; a clean snapshot, which never held one, forks under any.
func keepsSecrets(c, p *trust.Plan) error {
	missing := unlistedSecrets(p.Secrets, c.Secrets)
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("secrets: the snapshot is dirty and its plan handed the sandbox %s, which its tenant may have copied into the memory a fork inherits; the child plan must list %s too (it lists %s), or fork a clean snapshot of a sandbox that never held a secret",
		strings.Join(p.Secrets, ", "), strings.Join(missing, ", "), orNone(c.Secrets))
}

// storedPlan reads back a plan admission kept.
func storedPlan(tx *store.Tx, digest string) (*trust.Plan, error) {
	raw := tx.Plan(digest)
	if raw == nil {
		return nil, fmt.Errorf("plan %s is not in this state directory's store", short12(digest))
	}
	p, err := trust.DecodePlan(raw)
	if err != nil {
		return nil, fmt.Errorf("plan %s in the store: %w", short12(digest), err)
	}
	return p, nil
}

func orNoneDigest(d string) string {
	if d == "" {
		return "none"
	}
	return short12(d)
}

// subset refuses a child plan wider than its parent, naming the field.
func subset(c, p *trust.Plan) error {
	var errs []error
	wider := func(field string, child, parent int64) {
		// 0 is no bound: a bounded parent needs a bounded child.
		if parent > 0 && (child == 0 || child > parent) {
			errs = append(errs, fmt.Errorf("%s: the child plan asks for %s, its parent allows %d", field, bound(child), parent))
		}
	}
	pairs := []struct {
		prefix string
		c, p   trust.Limits
	}{{"limits.", c.Limits, p.Limits}}
	if c.Grants.MaxDescendants > 0 {
		// A child that may fork passes on no more budget than it got; one
		// that may not has no use for a budget.
		pairs = append(pairs, struct {
			prefix string
			c, p   trust.Limits
		}{"grants.fork_budget.", c.Grants.ForkBudget, p.Grants.ForkBudget})
	}
	for _, l := range pairs {
		wider(l.prefix+"cpus", int64(l.c.CPUs), int64(l.p.CPUs))
		wider(l.prefix+"ram_mb", int64(l.c.RAMMB), int64(l.p.RAMMB))
		wider(l.prefix+"max_runtime_s", l.c.MaxRuntimeS, l.p.MaxRuntimeS)
		wider(l.prefix+"max_cpu_s", l.c.MaxCPUS, l.p.MaxCPUS)
		wider(l.prefix+"disk_size_mb", int64(l.c.DiskSizeMB), int64(l.p.DiskSizeMB))
	}
	if c.Grants.MaxDescendants > p.Grants.MaxDescendants {
		errs = append(errs, fmt.Errorf("grants.max_descendants: the child plan asks for %d, its parent allows %d", c.Grants.MaxDescendants, p.Grants.MaxDescendants))
	}
	if c.Grants.DataPlane && !p.Grants.DataPlane {
		errs = append(errs, errors.New("grants.data_plane: the parent plan grants no data plane"))
	}
	if c.Grants.Egress && !p.Grants.Egress {
		errs = append(errs, errors.New("grants.egress: the parent plan grants no egress plane"))
	}
	if c.Network.Net && !p.Network.Net {
		errs = append(errs, errors.New("network.net: the parent plan gives no network"))
	}
	if c.Network.Net {
		for _, a := range c.Network.Allow {
			pre, err := trust.ParsePrefix(a)
			if err != nil || !insideAny(pre, p.Network.Allow) {
				errs = append(errs, fmt.Errorf("network.allow %s: outside the parent plan's (%s)", a, orNone(p.Network.Allow)))
			}
		}
	}
	for _, b := range p.Network.Block {
		if !slices.Contains(c.Network.Block, b) {
			errs = append(errs, fmt.Errorf("network.block: the child plan drops its parent's %s", b))
		}
	}
	for _, s := range c.Secrets {
		if !slices.Contains(p.Secrets, s) {
			errs = append(errs, fmt.Errorf("secrets: %s is not among the parent plan's", s))
		}
	}
	if c.NotAfter.After(p.NotAfter) {
		errs = append(errs, fmt.Errorf("not_after: the child plan is valid until %s, after its parent's %s", c.NotAfter.UTC().Format("2006-01-02T15:04:05Z"), p.NotAfter.UTC().Format("2006-01-02T15:04:05Z")))
	}
	if p.Image != nil {
		if c.Image == nil || (p.Image.Kernel != "" && c.Image.Kernel != p.Image.Kernel) || (p.Image.RootImage != "" && c.Image.RootImage != p.Image.RootImage) {
			errs = append(errs, errors.New("image: the child plan does not pin its parent's image"))
		}
	}
	return errors.Join(errs...)
}

func bound(v int64) string {
	if v == 0 {
		return "no bound"
	}
	return fmt.Sprint(v)
}

// withinGrants refuses a fork of n children under child that would take
// the parent plan's descendants past max_descendants, or its live
// children's limits past fork_budget. The sandboxes counted are the live
// ones (removing a sandbox gives its share back), found through the
// plans that admitted them.
func withinGrants(tx *store.Tx, child, parent *trust.Plan, parentDigest string, n int) error {
	sbs, err := tx.Sandboxes()
	if err != nil {
		return err
	}
	plans := map[string]*trust.Plan{}
	planOf := func(d string) *trust.Plan {
		if p, ok := plans[d]; ok {
			return p
		}
		p, _ := storedPlan(tx, d) // nil: a lineage nexus cannot follow
		plans[d] = p
		return p
	}
	descendants := 0
	var used trust.Limits
	// count counts k sandboxes admitted under the plan digest d.
	count := func(d string, k int) {
		p := planOf(d)
		if p == nil || k <= 0 {
			return
		}
		if p.Parent == parentDigest {
			used = addLimits(used, p.Limits, k)
		}
		// Up the plan lineage: is parentDigest an ancestor?
		for a, depth := p.Parent, 0; a != "" && depth < 64; depth++ {
			if a == parentDigest {
				descendants += k
				break
			}
			anc := planOf(a)
			if anc == nil {
				break
			}
			a = anc.Parent
		}
	}
	live := map[string]int{}
	for _, sb := range sbs {
		if sb.Plan == "" || sb.Pool != "" {
			continue
		}
		live[sb.Plan]++
		count(sb.Plan, 1)
	}
	// A fork admitted but whose children are not all recorded yet holds
	// its place (Reserve): two forks at the same moment cannot both pass.
	reserved, err := tx.Reservations(time.Now())
	if err != nil {
		return err
	}
	for d, k := range reserved {
		count(d, k-live[d])
	}
	if descendants+n > parent.Grants.MaxDescendants {
		return fmt.Errorf("grants.max_descendants: plan %s allows %d descendants, it has %d, and the fork adds %d", short12(parentDigest), parent.Grants.MaxDescendants, descendants, n)
	}
	total := addLimits(used, child.Limits, n)
	b := parent.Grants.ForkBudget
	var errs []error
	over := func(field string, total, budget int64) {
		if budget > 0 && total > budget {
			errs = append(errs, fmt.Errorf("grants.fork_budget.%s: the children's %d would pass the budget of %d", field, total, budget))
		}
	}
	over("cpus", int64(total.CPUs), int64(b.CPUs))
	over("ram_mb", int64(total.RAMMB), int64(b.RAMMB))
	over("max_runtime_s", total.MaxRuntimeS, b.MaxRuntimeS)
	over("max_cpu_s", total.MaxCPUS, b.MaxCPUS)
	over("disk_size_mb", int64(total.DiskSizeMB), int64(b.DiskSizeMB))
	return errors.Join(errs...)
}

func addLimits(a, b trust.Limits, n int) trust.Limits {
	a.CPUs += n * b.CPUs
	a.RAMMB += n * b.RAMMB
	a.MaxRuntimeS += int64(n) * b.MaxRuntimeS
	a.MaxCPUS += int64(n) * b.MaxCPUS
	a.DiskSizeMB += n * b.DiskSizeMB
	return a
}
