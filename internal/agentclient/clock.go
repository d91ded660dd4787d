package agentclient

import (
	"context"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// now is the host's wall clock; tests replace it.
var now = time.Now

// SetClock sets the guest's wall clock to the host's (OpClock) and waits
// for the agent's answer. A guest's clock is set at every boot, restore
// and claim by the requests that start its session; SetClock is the
// correction in between, for a clock that drifted or that the guest set
// itself. An agent that predates it refuses it by name.
func (c *Client) SetClock(ctx context.Context) error {
	return c.ask(ctx, agentproto.Request{Op: agentproto.OpClock, RealtimeNS: now().UnixNano()}, "setting the guest's wall clock", "ok 0")
}
