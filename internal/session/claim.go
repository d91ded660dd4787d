package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/control"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// A warm pool keeps forks of one base restored and idle, and hands one to
// a user with __claim__: the fork becomes a sandbox nobody else was. What
// makes it so is what a fork's restore changes, changed again on the
// running guest: the sandbox id and hostname (handed in), a fresh
// machine-id and session epoch (one handshake, as after a restore, so the
// agent refuses anything stamped for the pool member), and a CRNG that no
// longer shares state with the pool member's siblings, whatever
// fork_reseed says. A restore gets that last one from a new VM generation
// id, which the guest's vmgenid driver answers by reseeding; QEMU 7.2
// cannot change the id of a running machine (the device's guid is fixed
// once it is realized), so a claim has the agent mix host randomness into
// the kernel's pool and force the reseed itself. Lineage stays: the
// parent is still the base.

// Claim implements control.Backend.
func (s *Session) Claim(ctx context.Context, c control.ClaimRequest) (string, error) {
	began := time.Now()
	sandboxID, hostname := c.SandboxID, c.Hostname
	if err := conf.CheckSandboxID(sandboxID); err != nil {
		return "", fmt.Errorf("sandbox_id: %w", err)
	}
	if err := conf.CheckHostname(hostname); err != nil {
		return "", fmt.Errorf("hostname: %w", err)
	}
	boot, err := claimedBoot(c, s.getView().boot)
	if err != nil {
		return "", err
	}
	if err := s.claimable(ctx); err != nil {
		return "", err
	}
	// One identity at a time: a capture records the identity, so none
	// may run while it changes, and two claims must not both pass the
	// claimed check below.
	if !s.captureMu.TryLock() {
		return "", errors.New("a snapshot or park is in progress; claim once it has ended")
	}
	defer s.captureMu.Unlock()
	// The sandbox id and hostname are the orchestrator's to choose, as
	// in nether.conf: one may keep a member's id that it never showed
	// anyone (nexus does). What no orchestrator could choose, nether makes
	// new: the machine-id, the epoch, the CRNG state.
	was := s.getView()
	if was.claimed {
		return "", fmt.Errorf("already claimed, as %s: a fork is claimed once", was.identity.SandboxID)
	}
	// The new epoch must not strand a request of the pool member's in
	// flight (its reply would never come), and what the claimer runs
	// must start in the new session.
	if err := waitGate(ctx, quiescentWait, s.comps.quiescent); err != nil {
		return "", fmt.Errorf("a command or transfer is running (%v); claim once it has ended", err)
	}

	// First, because nothing of the guest's identity has changed if it
	// fails: the sandbox stays unclaimed. (A reseed that did happen
	// costs nothing.)
	seedStart := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.opt.HandshakeTimeout)
	err = s.agent.Reseed(rctx, randomBytes(agentproto.MinSeed))
	cancel()
	if err != nil {
		return "", err
	}
	seedTook := time.Since(seedStart)

	hsStart := time.Now()
	hctx, cancel := context.WithTimeout(ctx, s.opt.HandshakeTimeout)
	defer cancel()
	mac := s.newGuestMAC()
	req := agentproto.Request{Fork: true, Hostname: hostname, MachineID: randomHex(16), MAC: macText(mac),
		Identity: boot.of(sandboxID)}
	var provisioned bool
	provisioned, err = s.agent.Handshake(hctx, req)
	if err == nil {
		err = s.tookMAC(mac)
	}
	if err != nil {
		// The guest may now serve an epoch, hostname and machine-id the
		// host does not know it took: it can be neither driven nor
		// handed to anyone, so the sandbox ends.
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("the guest's agent did not answer within %s", s.opt.HandshakeTimeout)
		}
		s.log.Error("claim: the handshake failed; ending the sandbox", "sandbox", sandboxID, "hostname", hostname, "err", err)
		s.life("claim failed sandbox=%s hostname=%s: %v", sandboxID, hostname, err)
		go s.stop(meter.ReasonError)
		return "", fmt.Errorf("the guest did not take its new identity (%v); the sandbox is ending", err)
	}
	hsTook := time.Since(hsStart)
	s.logProvisioned(provisioned, req)
	s.setView(func(v *view) {
		v.identity.SandboxID, v.identity.Hostname = sandboxID, hostname
		v.boot = boot
		v.claimed = true
	})
	reset := s.resetPlaneConns()
	took := time.Since(began)
	s.life("claimed sandbox=%s hostname=%s", sandboxID, hostname)
	s.log.Info("claimed", "sandbox", sandboxID, "hostname", hostname, "was", was.identity.SandboxID,
		"claim_ms", ms(took), "reseed_ms", ms(seedTook), "handshake_ms", ms(hsTook), "plane_conns_reset", reset, "boot", boot.bootID)
	return fmt.Sprintf("OK claimed %s %s", sandboxID, hostname), nil
}

// claimable refuses what can never be claimed, or not yet. A restore
// has finished for a claim once its handshake is done (the agent is up:
// commands run, __info__ says agent=connected); what the restore does
// after that (the guest's egress listener) takes milliseconds, and the
// claim waits for it rather than refuse a sandbox that answers commands.
func (s *Session) claimable(ctx context.Context) error {
	switch {
	case !s.cfg.Restore:
		return errors.New("only a fork of a base can be claimed; this sandbox booted")
	case s.art.Meta.Kind != snapshot.KindBase:
		return errors.New("only a fork of a base can be claimed; this sandbox woke from a park, which keeps its identity")
	}
	if v := s.getView(); v.claimed {
		return fmt.Errorf("already claimed, as %s: a fork is claimed once", v.identity.SandboxID)
	}
	notYet := errors.New("the restore has not finished; claim once the sandbox answers commands")
	select {
	case <-s.ready:
	default:
		return notYet
	}
	select {
	case <-s.agent.Up():
	default:
		return notYet
	}
	select {
	case <-s.restored:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the restore to finish: %w", context.Cause(ctx))
	}
}

// resetPlaneConns resets the data and egress connections open at a claim,
// as a fork resets those its base had: they were opened for the pool
// member (the platform's traffic to it, its tenant's calls out), and none
// may carry over to the claimer. It returns how many it reset.
func (s *Session) resetPlaneConns() int {
	n := 0
	for _, st := range s.mux.Streams() {
		if _, ok := planeStream(st); ok {
			st.Reset("the sandbox was claimed: a connection of the pool member's")
			n++
		}
	}
	return n
}

// ms is d in milliseconds with microsecond precision, for logs.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// claimedBoot is the boot identity a claim gives: what the claim hands
// in, held to nether.conf's rules for the same keys, and a boot id of its
// own when none is handed in: a claim is a new boot of the sandbox, and
// it never keeps the pool member's. The node is the host's: kept when
// the claim does not name it.
func claimedBoot(c control.ClaimRequest, was bootIdentity) (bootIdentity, error) {
	b := bootIdentity{nodeID: was.nodeID, bootID: c.BootID, planDigest: c.PlanDigest, token: c.Token}
	if c.NodeID != "" {
		if err := conf.CheckNodeID(c.NodeID); err != nil {
			return b, fmt.Errorf("node_id: %w", err)
		}
		b.nodeID = c.NodeID
	}
	if b.bootID == "" {
		b.bootID = ulid.Make().String()
	} else if err := conf.CheckBootID(b.bootID); err != nil {
		return b, fmt.Errorf("boot_id: %w", err)
	}
	if b.bootID == was.bootID {
		return b, fmt.Errorf("boot_id %s is the pool member's own; a claim is a new boot", b.bootID)
	}
	if b.planDigest != "" {
		if err := conf.CheckPlanDigest(b.planDigest); err != nil {
			return b, fmt.Errorf("plan_digest: %w", err)
		}
	}
	if b.token != "" {
		if err := conf.CheckIdentityToken(b.token); err != nil {
			return b, fmt.Errorf("token: %w", err)
		}
	}
	return b, nil
}
