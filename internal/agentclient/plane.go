package agentclient

import (
	"context"
	"fmt"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// Connect opens a data-plane stream, which the agent connects to the
// tenant's server on the guest's 127.0.0.1:port. It waits for the agent.
func (c *Client) Connect(ctx context.Context, port uint16) (*channel.Stream, error) {
	if err := c.WaitUp(ctx); err != nil {
		return nil, err
	}
	return c.open(agentproto.Request{Op: agentproto.OpConnect, Port: port})
}

// Listen puts the guest's egress listener on 127.0.0.1:port (0 closes
// it) and waits for the agent's answer.
func (c *Client) Listen(ctx context.Context, port uint16) error {
	if err := c.WaitUp(ctx); err != nil {
		return err
	}
	st, err := c.open(agentproto.Request{Op: agentproto.OpListen, Port: port})
	if err != nil {
		return err
	}
	st.CloseWrite(nil) // the request is all there is to say
	if _, err := drain(ctx, st); err != nil {
		st.Reset("abandoned")
		return fmt.Errorf("setting the guest's egress listener to port %d: %w", port, AgentError(err))
	}
	return nil
}
