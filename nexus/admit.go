package nexus

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/nexus/trust"
)

// Admission: once the state directory trusts a plan authority (nexus
// trust add), create, start, fork and resume each need a signed plan
// (WithPlan), checked before any nether starts: the signature by a
// trusted authority, the validity window, a nonce never used before,
// the image that will boot or restore, and the sandbox's settings, which
// the plan fills in and a setting cannot widen. Every admission and
// every refusal goes on the audit chain. Without a trusted authority
// nexus runs sandboxes unadmitted, as before.

// reservationTTL bounds how long an admitted fork holds its place in its
// parent plan's grants before its children are recorded: longer than any
// fork takes, short enough that a nexus killed mid-fork does not hold it
// for long.
const reservationTTL = 10 * time.Minute

// ErrRefused marks an operation admission refused.
var ErrRefused = errors.New("not admitted")

// WithPlan returns a Nexus whose next operations are admitted under the
// signed plan (the file `nexus plan sign` wrote).
//
// One plan admits one request: `nexus create --start` is a create and a
// start of the same sandbox, admitted once.
func (n *Nexus) WithPlan(signed []byte) *Nexus {
	c := *n
	c.plan = signed
	c.admitted = &admittedRun{}
	return &c
}

// admittedRun is the sandbox a WithPlan Nexus admitted, and under which
// digest.
type admittedRun struct{ sandbox, digest string }

// Admission says whether admission is on: the trusted authorities, none
// when it is off.
func (n *Nexus) Admission() ([]trust.Authority, error) { return n.Keyring().Trusted() }

// imageOf is what will run: the kernel and root image digests, "" where
// nexus cannot tell (then a plan that pins it refuses).
type imageOf struct{ kernel, rootfs string }

// forkOf is what a fork's admission holds its plan to: the plan its
// snapshot was captured under ("" unadmitted) and how many children it
// makes (attenuate.go).
type forkOf struct {
	parent   string
	children int
}

// admit checks the plan for op on sb (whose Config the plan fills in and
// bounds) and records the outcome; fork is set for a fork. It returns the
// admitted plan's digest, "" when admission is off.
func (n *Nexus) admit(op string, sb *Sandbox, img func() (imageOf, error), fork *forkOf) (string, error) {
	began := time.Now()
	trusted, err := n.Admission()
	if err != nil {
		return "", err
	}
	refuse := func(err error) (string, error) {
		err = fmt.Errorf("%w: %s of %s: %w", ErrRefused, op, sb.Ref(), err)
		n.auditAdmission("refuse", op, sb, "", err)
		return "", err
	}
	if len(trusted) == 0 {
		if n.plan != nil {
			return refuse(errors.New("no plan authority is trusted in this state directory, so no plan can be checked (nexus trust add)"))
		}
		return "", nil
	}
	if n.plan == nil {
		return refuse(fmt.Errorf("admission is on (%d trusted plan authorities): %s needs a signed plan (--plan)", len(trusted), op))
	}
	if a := n.admitted; a != nil && a.sandbox != "" && a.sandbox == sb.ID && sb.Plan == a.digest {
		return a.digest, nil // the same request's next step
	}
	v, err := trust.Verify(n.plan, trusted, time.Now())
	if err != nil {
		return refuse(err)
	}
	if bad := unlistedSecrets(n.secretNames(), v.Plan.Secrets); len(bad) > 0 {
		return refuse(fmt.Errorf("secrets %s: the plan does not list them (it lists %s)", strings.Join(bad, ", "), orNone(v.Plan.Secrets)))
	}
	if p := v.Plan.Image; p != nil && (p.Kernel != "" || p.RootImage != "") {
		have, err := img()
		if err != nil {
			return refuse(fmt.Errorf("the image: %w", err))
		}
		if p.Kernel != "" && p.Kernel != have.kernel {
			return refuse(fmt.Errorf("image.kernel: the plan pins %s, and %s would run %s", short12(p.Kernel), op, orUnknown(have.kernel)))
		}
		if p.RootImage != "" && p.RootImage != have.rootfs {
			return refuse(fmt.Errorf("image.root_image: the plan pins %s, and %s would run %s", short12(p.RootImage), op, orUnknown(have.rootfs)))
		}
	}
	cfg := sb.Config
	if err := applyPlan(&cfg, v.Plan); err != nil {
		return refuse(err)
	}
	// The nonce last: a plan refused for another reason can be fixed and
	// sent again, a plan admitted never twice. The lineage is checked,
	// and the admission goes on the chain, in the same transaction (one
	// write to disk); a fork's place is held there until its children
	// are recorded.
	admitted := *sb
	admitted.Config, admitted.Plan = cfg, v.Digest
	if err := n.db.Update(func(tx *store.Tx) error {
		if fork != nil {
			if err := attenuate(tx, v.Plan, fork.parent, fork.children); err != nil {
				return err
			}
			if fork.parent != "" {
				// Held until the fork's children are recorded (Fork
				// drops it), so a fork admitted at the same moment
				// counts these children.
				if err := tx.Reserve(v.Digest, fork.children, time.Now().Add(reservationTTL)); err != nil {
					return err
				}
			}
		}
		if err := tx.UseNonce(v.Plan.Nonce, v.Plan.NotAfter, time.Now()); err != nil {
			return err
		}
		if err := tx.PutPlan(v.Digest, v.Plan.Canonical()); err != nil {
			return err
		}
		return tx.AppendAudit(n.stamp(admissionRecord("admit", op, &admitted, v.Digest), nil))
	}); err != nil {
		return refuse(err)
	}
	sb.Config, sb.Plan = cfg, v.Digest
	if n.admitted != nil {
		n.admitted.sandbox, n.admitted.digest = sb.ID, v.Digest
	}
	n.log.Info("admitted", "op", op, "sandbox", sb.Ref(), "plan", short12(v.Digest), "admission_ms", float64(time.Since(began).Microseconds())/1000)
	return v.Digest, nil
}

func short12(d string) string {
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

func orUnknown(d string) string {
	if d == "" {
		return "an image nexus cannot identify"
	}
	return short12(d)
}

func (n *Nexus) auditAdmission(event, op string, sb *Sandbox, digest string, err error) {
	n.record(admissionRecord(event, op, sb, digest), err)
}

// admissionRecord is the record of an admission (or refusal) of op on sb
// under the plan digest.
func admissionRecord(event, op string, sb *Sandbox, digest string) *store.AuditRecord {
	rec := sandboxRecord(event, sb, "")
	rec.Plan, rec.Detail = digest, op
	return rec
}

// applyPlan fills the settings a sandbox leaves open from its plan and
// refuses any the plan does not allow, naming the setting.
func applyPlan(c *Config, p *trust.Plan) error {
	var errs []error
	bound := func(name string, have *int64, limit int64) {
		switch {
		case limit == 0: // the plan leaves it open
		case *have == 0:
			*have = limit
		case *have > limit:
			errs = append(errs, fmt.Errorf("%s %d: the plan allows at most %d", name, *have, limit))
		}
	}
	cpus, ram, disk := int64(c.CPUs), int64(c.RAMMB), int64(c.DiskSizeMB)
	bound("cpus", &cpus, int64(p.Limits.CPUs))
	bound("ram_mb", &ram, int64(p.Limits.RAMMB))
	bound("max_runtime_s", &c.MaxRuntimeS, p.Limits.MaxRuntimeS)
	bound("max_cpu_s", &c.MaxCPUS, p.Limits.MaxCPUS)
	if disk > 0 {
		bound("disk_size_mb", &disk, int64(p.Limits.DiskSizeMB))
	}
	c.CPUs, c.RAMMB, c.DiskSizeMB = int(cpus), int(ram), int(disk)
	if c.Net && !p.Network.Net {
		errs = append(errs, errors.New("net: the plan gives the sandbox no network"))
	}
	if c.Net {
		allow, err := withinAllow(c.NetAllow, p.Network.Allow)
		if err != nil {
			errs = append(errs, err)
		}
		c.NetAllow = allow
		c.NetBlock = joinList(c.NetBlock, p.Network.Block)
	}
	if c.AppPort != 0 && !p.Grants.DataPlane {
		errs = append(errs, errors.New("app_port: the plan grants no data plane"))
	}
	if c.EgressPort != 0 && !p.Grants.Egress {
		errs = append(errs, errors.New("egress_port: the plan grants no egress plane"))
	}
	return errors.Join(errs...)
}

// withinAllow is the allow-list a sandbox runs with: the plan's when it
// asks for none, else its own, each prefix inside one of the plan's.
func withinAllow(have string, plan []string) (string, error) {
	if strings.TrimSpace(have) == "" {
		return strings.Join(plan, ", "), nil
	}
	var outside []string
	for _, s := range splitList(have) {
		h, err := trust.ParsePrefix(s)
		if err != nil {
			return have, fmt.Errorf("net_allow: %w", err)
		}
		if !insideAny(h, plan) {
			outside = append(outside, s)
		}
	}
	if len(outside) > 0 {
		return have, fmt.Errorf("net_allow %s: outside the plan's network.allow (%s)", strings.Join(outside, ", "), orNone(plan))
	}
	return have, nil
}

func insideAny(h netip.Prefix, plan []string) bool {
	for _, s := range plan {
		p, err := trust.ParsePrefix(s)
		if err == nil && p.Bits() <= h.Bits() && p.Contains(h.Addr()) {
			return true
		}
	}
	return false
}

func orNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// joinList is the union of a setting's list and the plan's.
func joinList(have string, plan []string) string {
	out := splitList(have)
	seen := map[string]bool{}
	for _, s := range out {
		seen[s] = true
	}
	for _, s := range plan {
		if !seen[s] {
			out = append(out, s)
			seen[s] = true
		}
	}
	return strings.Join(out, ", ")
}

// bootImage is what a boot of cfg runs: the kernel and root image in the
// guest directory its nether uses, or a custom root image, digested as
// nether digests them for its fingerprint.
func (n *Nexus) bootImage(cfg Config) (imageOf, error) {
	img, err := n.run.BootImage(cfg.GPU, cfg.Rootfs)
	return imageOf{kernel: img.Kernel, rootfs: img.Rootfs}, err
}

// restoreSize fills in the CPUs and RAM a restore of the artifact at dir
// runs with where cfg leaves them to nether's defaults: a restore runs
// with the artifact's, so admission must hold those to the plan (a plan
// of 256 MiB cannot admit a restore of a 512 MiB guest by filling in
// 256). Only under admission: unadmitted records stay as they were.
func (n *Nexus) restoreSize(cfg *Config, dir string) error {
	if cfg.CPUs != 0 && cfg.RAMMB != 0 {
		return nil
	}
	if trusted, err := n.Admission(); err != nil || len(trusted) == 0 {
		return err
	}
	a, err := n.run.Artifact(dir)
	if err != nil {
		return err
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = a.CPUs
	}
	if cfg.RAMMB == 0 {
		cfg.RAMMB = a.RAMMB
	}
	return nil
}

// restoreImage is what a restore of the artifact at dir runs, from its
// fingerprint.
func (n *Nexus) restoreImage(dir string) (imageOf, error) {
	a, err := n.run.Artifact(dir)
	if err != nil {
		return imageOf{}, err
	}
	return imageOf{kernel: a.Kernel, rootfs: a.Rootfs}, nil
}
