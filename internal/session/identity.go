package session

import (
	"github.com/nethersandbox/nether/internal/agentproto"
)

// provisionRequest is what the guest is handed of this boot: its
// identity (agentproto.Identity) and the sandbox's secrets. A boot sends
// it as OpProvision after the hello; a restore and a claim carry the
// same fields in their handshake.
func (s *Session) provisionRequest() agentproto.Request {
	v := s.getView()
	req := agentproto.Request{Identity: v.boot.of(v.identity.SandboxID)}
	if len(s.opt.Secrets) > 0 {
		req.Secrets = s.opt.Secrets
	}
	return req
}

// logProvisioned says what the guest took of req: the names of the
// secrets (never a value), or that an agent from before identity
// delivery wrote no identity file.
func (s *Session) logProvisioned(provisioned bool, req agentproto.Request) {
	if !provisioned {
		s.log.Warn("the restored guest's agent predates identity delivery: /run/nether/identity is not written (capture the snapshot again with this nether's guest image)")
		return
	}
	if len(req.Secrets) > 0 {
		s.log.Info("secrets delivered", "names", agentproto.SecretNames(req.Secrets))
	}
}

// of is the identity the guest of sandbox vmID holds in this boot.
func (b bootIdentity) of(vmID string) *agentproto.Identity {
	return &agentproto.Identity{NodeID: b.nodeID, VMID: vmID, BootID: b.bootID, PlanDigest: b.planDigest, Token: b.token}
}
