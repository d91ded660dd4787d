package control

import (
	"fmt"
	"strings"

	"github.com/nethersandbox/nether/internal/cmdline"
)

// handler is what this build does for one entry of cmdline's command
// table. The entry says who may run the command, how its reply is shaped
// and how its arguments are checked; the handler only runs it.
type handler struct {
	// query answers a query straight from the reader, so that one sent
	// while a command streams is answered at the next frame boundary, not
	// after the command.
	query func(c *client, cmd cmdline.Command)
	// drive runs a command that drives the sandbox: queued, one at a time
	// in the order received, on the client's work loop. Its reply goes
	// through the task, which Stop can end in its place.
	drive func(t *task, cmd cmdline.Command)
}

// queued reports whether the handler is queued work rather than a query.
func (h handler) queued() bool { return h.drive != nil }

// handlers is the part of cmdline's table this build serves, keyed by
// verb (cmdline.Shell for plain shell commands). A verb with no handler is
// not served: the parser answers "unknown command" and __help__ does not
// list it. Every key must name an entry of the table (New panics
// otherwise, and TestHandlersMatchTable checks it), so this map is not a
// second list of verbs but the attachment of behaviour to the one list.
var handlers = map[string]handler{
	"__info__":       {query: (*client).info},
	"__stats__":      {query: (*client).stats},
	"__help__":       {query: (*client).help},
	"__events__":     {query: (*client).events},
	"__cmdlog__":     {query: (*client).cmdlog},
	"__netlog__":     {query: (*client).netlog},
	"__screen__":     {query: (*client).screen},
	"__screendiff__": {query: (*client).screenDiff},
	"__frame__":      {query: (*client).frameDump},
	"__framediff__":  {query: (*client).frameDiff},
	"__put__":        {drive: (*task).put},
	"__get__":        {drive: (*task).get},
	"__shutdown__":   {drive: (*task).shutdown},
	"__snapshot__":   {drive: (*task).capture},
	"__park__":       {drive: (*task).capture},
	"__claim__":      {drive: (*task).claim},
	cmdline.Shell:    {drive: (*task).shell},
}

// servedSet is the parser and help text for what handlers serve.
func servedSet() (*cmdline.Set, error) {
	names := make([]string, 0, len(handlers))
	for name := range handlers {
		names = append(names, name)
	}
	set, err := cmdline.NewSet(names...)
	if err != nil {
		return nil, fmt.Errorf("control: handlers do not match the command table: %w", err)
	}
	return set, nil
}

// job is a queued command with the handler that runs it.
type job struct {
	cmd cmdline.Command
	h   handler
}

// dispatch enforces the table's access rule, then answers queries at once
// and queues driving work.
func (c *client) dispatch(cmd cmdline.Command) {
	spec, served := c.s.cmds.Lookup(cmd.Name)
	h, ok := handlers[cmd.Name]
	if !served || !ok {
		// The parser only returns served commands; this is a guard, not
		// a path a client can reach.
		c.errReply("unknown command %s", cmd.Name)
		return
	}
	if spec.Access == cmdline.PrimaryOnly && !c.primary {
		name := cmd.Name
		if name == cmdline.Shell {
			name = "a shell command"
		}
		c.errReply("read-only observer: %s needs the primary client", name)
		return
	}
	if !h.queued() {
		h.query(c, cmd)
		return
	}
	select {
	case c.work <- job{cmd: cmd, h: h}:
	case <-c.done:
	}
}

func (c *client) info(cmdline.Command) { c.reply(c.s.backend.Info(), 0) }

func (c *client) stats(cmdline.Command) { c.reply(c.s.meter.Read().Stats(), 0) }

func (c *client) help(cmdline.Command) {
	c.reply(fmt.Sprintf("proto_version=%d\n%s", ProtoVersion, c.s.cmds.Help()), 0)
}

func (t *task) shutdown(cmdline.Command) {
	// The reply goes first: Shutdown ends the process soon after.
	t.reply("OK shutting down", 0)
	t.c.s.backend.Shutdown()
}

func (t *task) shell(cmd cmdline.Command) { t.runShell(cmd.Shell) }

func (t *task) put(cmd cmdline.Command) { t.transfer(cmd, t.c.s.backend.Put) }

func (t *task) get(cmd cmdline.Command) { t.transfer(cmd, t.c.s.backend.Get) }

// verb is a command's name as ERR and OK texts spell it ("put", "park").
func verb(cmd cmdline.Command) string { return strings.Trim(cmd.Name, "_") }
