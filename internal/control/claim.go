package control

import (
	"context"

	"github.com/nethersandbox/nether/internal/cmdline"
)

// claim runs __claim__ <sandbox_id> <hostname>. Unlike the other driving
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
	body, err := c.s.backend.Claim(ctx, cmd.Args[0], cmd.Args[1])
	if err != nil {
		t.reply("ERR claim: "+oneLine(err.Error()), -1)
		return
	}
	t.reply(body, 0)
}
