package control

import (
	"context"
	"fmt"
	"strings"

	"github.com/nethersandbox/nether/internal/cmdline"
)

// claim runs __claim__ <sandbox_id> <hostname> [key=value...]. Unlike the other driving
// commands it does not wait for the agent: a pool claims a sandbox it
// knows is up, and a claim sent before the restore finished is refused
// by the backend, saying so, rather than held. Neither the client leaving
// nor Stop cancels it (Stop ends its reply): a claim half done would
// leave a guest whose identity the host does not know, so whether one in
// progress goes on is the session's call, through the root context.
func (t *task) claim(cmd cmdline.Command) {
	c := t.c
	ctx, cancel := context.WithCancel(c.s.ctx)
	defer cancel()
	req, err := parseClaim(cmd.Args)
	if err != nil {
		t.reply("ERR claim: "+oneLine(err.Error()), -1)
		return
	}
	body, err := c.s.backend.Claim(ctx, req)
	if err != nil {
		t.reply("ERR claim: "+oneLine(err.Error()), -1)
		return
	}
	t.reply(body, 0)
}

// ClaimRequest is a __claim__'s arguments: the sandbox id and hostname,
// then, as key=value words, the boot identity an orchestrator that
// admitted the claim hands in (node_id, boot_id, plan_digest, token);
// the backend mints a boot id when none is given.
type ClaimRequest struct {
	SandboxID, Hostname               string
	NodeID, BootID, PlanDigest, Token string
}

// parseClaim reads a __claim__'s words; the values are the backend's to
// check (they follow nether.conf's rules for the same keys).
func parseClaim(args []string) (ClaimRequest, error) {
	r := ClaimRequest{SandboxID: args[0], Hostname: args[1]}
	seen := map[string]bool{}
	for _, a := range args[2:] {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			return r, fmt.Errorf("%.40q: want key=value (node_id, boot_id, plan_digest, token)", a)
		}
		if seen[k] {
			return r, fmt.Errorf("%s given twice", k)
		}
		seen[k] = true
		switch k {
		case "node_id":
			r.NodeID = v
		case "boot_id":
			r.BootID = v
		case "plan_digest":
			r.PlanDigest = v
		case "token":
			r.Token = v
		default:
			return r, fmt.Errorf("unknown claim key %.40q (want node_id, boot_id, plan_digest, token)", k)
		}
	}
	return r, nil
}
