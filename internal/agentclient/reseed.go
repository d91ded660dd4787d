package agentclient

import (
	"context"
	"fmt"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// Reseed has the agent mix seed into the guest kernel's entropy pool and
// reseed the CRNG from the pool, and waits for its answer: once it
// returns nil, what the guest draws from its CRNG no longer follows from
// any state it shared with another guest restored from the same memory.
// An agent that predates reseeding refuses it by name; that is an error
// too, never a silent success.
func (c *Client) Reseed(ctx context.Context, seed []byte) error {
	st, err := c.open(agentproto.Request{Op: agentproto.OpReseed, Seed: agentproto.Text(seed)})
	if err != nil {
		return err
	}
	st.CloseWrite(nil)
	if _, err := drain(ctx, st); err != nil {
		st.Reset("host gave up on the reseed")
		return fmt.Errorf("reseeding the guest CRNG: %w", AgentError(err))
	}
	if got := string(st.Status()); got != "ok" {
		return fmt.Errorf("reseeding the guest CRNG: agent answered %q, want \"ok\"", truncate(got, 80))
	}
	return nil
}
