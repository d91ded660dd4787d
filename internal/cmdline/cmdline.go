// Package cmdline parses one line received on the nether control socket
// into either a control command (a reserved __name__ verb with strictly
// tokenised arguments) or a plain shell command for the guest.
//
// Parsing is fail-closed: anything that could forge a reply frame (a raw
// 0x1e/0x1f), smuggle a second command (an embedded newline) or be folded
// silently into a path (an extra argument) is rejected rather than guessed
// at. See "Command arguments" and "Reserved namespace" in
// shared/spec/control-protocol.md.
package cmdline

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxLine is the longest control line accepted, in bytes, before trimming.
const MaxLine = 64 << 10

// Sentinel errors, so a server can classify a rejection without matching
// message text. Every Parse error wraps exactly one of them.
var (
	ErrEmpty          = errors.New("empty command")
	ErrTooLong        = fmt.Errorf("command longer than %d bytes", MaxLine)
	ErrFrameByte      = errors.New("command contains a frame delimiter byte (0x1e/0x1f)")
	ErrNUL            = errors.New("command contains a NUL byte")
	ErrNewline        = errors.New("command contains an embedded newline")
	ErrUnknownCommand = errors.New("unknown command")
	ErrArgs           = errors.New("bad arguments")
)

// parseError carries the exact message sent back in the ERR line while
// still matching its sentinel with errors.Is.
type parseError struct {
	kind error
	msg  string
}

func (e *parseError) Error() string { return e.msg }
func (e *parseError) Unwrap() error { return e.kind }

func errorf(kind error, format string, a ...any) error {
	return &parseError{kind: kind, msg: fmt.Sprintf(format, a...)}
}

// Command is one parsed control line.
type Command struct {
	// Name is the control verb ("__info__", ...) or "" for a plain shell
	// command.
	Name string
	// Args are the control verb's arguments: single tokens, never
	// containing whitespace.
	Args []string
	// Shell is the trimmed line for a plain shell command; "" for control
	// commands.
	Shell string
}

// IsControl reports whether c is a reserved __name__ command.
func (c Command) IsControl() bool { return c.Name != "" }

// Primary reports whether c may only be issued by the primary client.
// Plain shell commands drive the guest, so they are primary-only.
func (c Command) Primary() bool {
	if c.Name == "" {
		return true
	}
	info, ok := Lookup(c.Name)
	return ok && info.Primary
}

// Streamed reports whether c's reply is streamed (self-delimiting, no
// trailer) rather than framed.
func (c Command) Streamed() bool {
	info, ok := Lookup(c.Name)
	return ok && info.Streamed
}

// Info describes one control command, for __help__ and for clients that
// need to know how a reply is shaped.
type Info struct {
	Name string
	// Args is the argument synopsis, "" for none.
	Args string
	// Primary is true when only the primary client may issue the command.
	Primary bool
	// Streamed is true when the reply has no 0x1e trailer: it ends when
	// the stream goes idle or the socket closes. A streamed command that
	// cannot run still answers with a framed ERR.
	Streamed bool
	Summary  string

	minArgs, maxArgs int
}

// Known lists every control command of protocol v2, in __help__ order.
var Known = []Info{
	{Name: "__info__", Summary: "static capabilities and limits (proto_version, max_output_bytes, ...)"},
	{Name: "__stats__", Summary: "live usage counters"},
	{Name: "__help__", Summary: "this command list"},
	{Name: "__events__", Args: "[seq]", Streamed: true, maxArgs: 1, Summary: "event timeline; with seq, only events after it"},
	{Name: "__cmdlog__", Streamed: true, Summary: "per-command audit log"},
	{Name: "__netlog__", Streamed: true, Summary: "egress audit log (net=1)"},
	{Name: "__screen__", Streamed: true, Summary: "terminal snapshot"},
	{Name: "__screendiff__", Primary: true, Streamed: true, Summary: "terminal rows changed since the last call"},
	{Name: "__frame__", Streamed: true, Summary: "framebuffer as binary PPM (gpu=1)"},
	{Name: "__framediff__", Primary: true, Streamed: true, Summary: "framebuffer tiles changed since the last call (gpu=1)"},
	{Name: "__shutdown__", Primary: true, Summary: "clean teardown; the process exits"},
	{Name: "__snapshot__", Args: "[path]", Primary: true, maxArgs: 1, Summary: "capture a base snapshot into the transfer jail and resume"},
	{Name: "__park__", Args: "[path]", Primary: true, maxArgs: 1, Summary: "capture a one-shot park snapshot, bill, and exit"},
	{Name: "__put__", Args: "<hostpath> <guestpath>", Primary: true, minArgs: 2, maxArgs: 2, Summary: "push a host file (from the transfer jail) into the guest"},
	{Name: "__get__", Args: "<guestpath> <hostpath>", Primary: true, minArgs: 2, maxArgs: 2, Summary: "pull a guest file into the transfer jail"},
}

// Lookup returns the Info for a control command name.
func Lookup(name string) (Info, bool) {
	for _, in := range Known {
		if in.Name == name {
			return in, true
		}
	}
	return Info{}, false
}

// HelpText renders Known as the body of a __help__ reply (without the
// proto_version line, which belongs to the server).
func HelpText() string {
	var b strings.Builder
	for _, in := range Known {
		usage := in.Name
		if in.Args != "" {
			usage += " " + in.Args
		}
		fmt.Fprintf(&b, "%-38s %s", usage, in.Summary)
		var tags []string
		if in.Primary {
			tags = append(tags, "primary only")
		}
		if in.Streamed {
			tags = append(tags, "streamed")
		}
		if len(tags) > 0 {
			fmt.Fprintf(&b, " [%s]", strings.Join(tags, ", "))
		}
		b.WriteByte('\n')
	}
	fmt.Fprintf(&b, "%-38s %s\n", "<anything else>", "run as a shell command in the guest [primary only]")
	return b.String()
}

// isBlank is the separator set for trimming and tokenising. Only ASCII
// blanks count: a non-ASCII space is an ordinary path byte on Linux.
func isBlank(r rune) bool {
	switch r {
	case ' ', '\t', '\r', '\n', '\v', '\f':
		return true
	}
	return false
}

// Parse parses one control line (with or without its line terminator).
func Parse(line string) (Command, error) {
	if len(line) > MaxLine {
		return Command{}, ErrTooLong
	}
	// Checked on the untrimmed line: these bytes are refused wherever
	// they appear, and trimming never removes them anyway.
	if strings.ContainsAny(line, "\x1e\x1f") {
		return Command{}, ErrFrameByte
	}
	if strings.IndexByte(line, 0) >= 0 {
		return Command{}, ErrNUL
	}
	line = strings.TrimFunc(line, isBlank)
	if line == "" {
		return Command{}, ErrEmpty
	}
	// One line is one command: an inner newline would otherwise reach the
	// guest shell as a second, unaudited command.
	if strings.IndexByte(line, '\n') >= 0 {
		return Command{}, ErrNewline
	}
	if !strings.HasPrefix(line, "__") {
		return Command{Shell: line}, nil
	}

	toks := strings.FieldsFunc(line, isBlank)
	name, args := toks[0], toks[1:]
	info, ok := Lookup(name)
	if !ok {
		return Command{}, errorf(ErrUnknownCommand, "unknown command %s", quoteToken(name))
	}
	if err := checkArgs(info, args); err != nil {
		return Command{}, err
	}
	if len(args) == 0 {
		args = nil
	}
	return Command{Name: name, Args: args}, nil
}

func checkArgs(info Info, args []string) error {
	n := len(args)
	switch {
	case info.minArgs == info.maxArgs && info.maxArgs == 0 && n != 0:
		return errorf(ErrArgs, "%s takes no arguments, got %d", info.Name, n)
	case info.minArgs == info.maxArgs && n != info.maxArgs:
		return errorf(ErrArgs, "%s takes exactly %d arguments (%s), got %d", info.Name, info.maxArgs, info.Args, n)
	case n < info.minArgs || n > info.maxArgs:
		return errorf(ErrArgs, "%s takes at most %d argument (%s), got %d", info.Name, info.maxArgs, info.Args, n)
	}
	if info.Name == "__events__" && n == 1 {
		// ParseUint refuses signs, so "-1" and "+1" are rejected here too.
		if _, err := strconv.ParseUint(args[0], 10, 64); err != nil {
			return errorf(ErrArgs, "__events__ takes a non-negative integer sequence number, got %s", quoteToken(args[0]))
		}
	}
	return nil
}

// quoteToken renders a client-supplied token for an error message that is
// echoed back in an ERR line and logged: printable ASCII passes as is,
// anything else is Go-quoted, and long tokens are cut so a 64 KiB line
// cannot become a 64 KiB error.
func quoteToken(tok string) string {
	const max = 64
	cut := ""
	if len(tok) > max {
		tok, cut = tok[:max], "..."
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < 0x21 || tok[i] > 0x7e {
			return strconv.Quote(tok) + cut
		}
	}
	return tok + cut
}
