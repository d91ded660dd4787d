package agentclient

import (
	"context"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// Reseed has the agent mix seed into the guest kernel's entropy pool and
// reseed the CRNG from the pool, and waits for its answer: once it
// returns nil, what the guest draws from its CRNG no longer follows from
// any state it shared with another guest restored from the same memory.
// An agent that predates reseeding refuses it by name; that is an error
// too, never a silent success.
func (c *Client) Reseed(ctx context.Context, seed []byte) error {
	return c.ask(ctx, agentproto.Request{Op: agentproto.OpReseed, Seed: agentproto.Text(seed)}, "reseeding the guest CRNG", "ok")
}
