// Package cmdline holds the nether control protocol's command table and
// parses one line received on the control socket into either a control
// command (a reserved __name__ verb with strictly tokenised arguments) or a
// plain shell command for the guest.
//
// The table (see Lookup) is the only list of verbs in nether: the server's
// parser, its dispatcher and its __help__ reply all read it through a Set,
// and the client reads it to know how each reply is shaped. It lists the
// whole of protocol v2, including verbs this build of the server does not
// serve, because the client may talk to a server that does serve them and
// must still read their replies in the right shape. What a server serves
// is the Set it builds from the table (NewSet).
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

// Access says who may run a command.
type Access uint8

const (
	// AnyClient commands may be issued by read-only observers too.
	AnyClient Access = iota
	// PrimaryOnly commands drive the sandbox, so only the primary client
	// may issue them.
	PrimaryOnly
)

func (a Access) String() string {
	if a == PrimaryOnly {
		return "primary only"
	}
	return "any client"
}

// Shape says how a command's reply is delimited on the wire. A client
// picks its read loop from it, so it is fixed per command.
type Shape uint8

const (
	// Framed replies end with the 0x1e<exit>\n trailer.
	Framed Shape = iota
	// Streamed replies have no trailer: each is self-delimiting by its
	// own header (a line count, or an image's dimensions), so a client
	// reads exactly what the header announces. A streamed command that
	// cannot run answers with a framed ERR instead, and no payload begins
	// with "ERR".
	Streamed
)

func (s Shape) String() string {
	if s == Streamed {
		return "streamed"
	}
	return "framed"
}

// ArgRule is a command's argument rule: between Min and Max
// whitespace-delimited single tokens, each list also passing Check.
type ArgRule struct {
	Min, Max int
	// Synopsis is the usage shown in __help__ and in argument errors,
	// "" for a command without arguments.
	Synopsis string
	// Check, when set, validates the tokens once their count is right.
	// Its error text is sent back in the ERR line, so it must quote
	// client input with quoteToken.
	Check func(args []string) error
}

// Spec is one entry of the command table.
type Spec struct {
	// Name is the control verb ("__info__", ...), or "" for the entry
	// that stands for every plain shell command.
	Name    string
	Access  Access
	Reply   Shape
	Args    ArgRule
	Summary string
}

// Usage is the command with its argument synopsis, as __help__ shows it.
func (s Spec) Usage() string {
	switch {
	case s.Name == "":
		return "<anything else>"
	case s.Args.Synopsis == "":
		return s.Name
	}
	return s.Name + " " + s.Args.Synopsis
}

// Shell is the table entry for a line that is not a __name__ verb: it runs
// as a shell command in the guest, which drives the sandbox.
const Shell = ""

// table is protocol v2's command set, in __help__ order. It is the one
// place a verb is declared; nothing else in nether lists verbs.
var table = []Spec{
	{Name: "__info__", Summary: "static capabilities and limits (proto_version, max_output_bytes, ...)"},
	{Name: "__stats__", Summary: "live usage counters"},
	{Name: "__help__", Summary: "this command list"},
	{Name: "__events__", Reply: Streamed, Args: ArgRule{Max: 1, Synopsis: "[seq]", Check: checkSeq}, Summary: "event timeline; with seq, only events after it"},
	{Name: "__cmdlog__", Reply: Streamed, Summary: "per-command audit log"},
	{Name: "__netlog__", Reply: Streamed, Summary: "egress audit log (net=1)"},
	{Name: "__screen__", Reply: Streamed, Summary: "terminal snapshot"},
	{Name: "__screendiff__", Access: PrimaryOnly, Reply: Streamed, Summary: "terminal rows changed since the last call"},
	{Name: "__frame__", Reply: Streamed, Summary: "framebuffer as binary PPM (gpu=1)"},
	{Name: "__framediff__", Access: PrimaryOnly, Reply: Streamed, Summary: "framebuffer tiles changed since the last call (gpu=1)"},
	{Name: "__shutdown__", Access: PrimaryOnly, Summary: "clean teardown; the process exits"},
	{Name: "__snapshot__", Access: PrimaryOnly, Args: ArgRule{Max: 1, Synopsis: "[path]"}, Summary: "capture a base snapshot into the transfer jail and resume"},
	{Name: "__park__", Access: PrimaryOnly, Args: ArgRule{Max: 1, Synopsis: "[path]"}, Summary: "capture a one-shot park snapshot, bill, and exit"},
	{Name: "__claim__", Access: PrimaryOnly, Args: ArgRule{Min: 2, Max: 6, Synopsis: "<sandbox_id> <hostname> [node_id=ID] [boot_id=ID] [plan_digest=HEX] [token=T]"}, Summary: "give this restored fork a new identity, once (a warm pool's hand-over)"},
	{Name: "__put__", Access: PrimaryOnly, Args: ArgRule{Min: 2, Max: 2, Synopsis: "<hostpath> <guestpath>"}, Summary: "push a host file (from the transfer jail) into the guest"},
	{Name: "__get__", Access: PrimaryOnly, Args: ArgRule{Min: 2, Max: 2, Synopsis: "<guestpath> <hostpath>"}, Summary: "pull a guest file into the transfer jail"},
	{Name: Shell, Access: PrimaryOnly, Summary: "run as a shell command in the guest"},
}

// checkSeq is __events__'s cursor rule.
func checkSeq(args []string) error {
	if len(args) == 0 {
		return nil
	}
	// ParseUint refuses signs, so "-1" and "+1" are rejected here too.
	if _, err := strconv.ParseUint(args[0], 10, 64); err != nil {
		return errorf(ErrArgs, "__events__ takes a non-negative integer sequence number, got %s", quoteToken(args[0]))
	}
	return nil
}

// protocol is the whole table as a Set: what a client may meet.
var protocol = func() *Set {
	names := make([]string, len(table))
	for i, sp := range table {
		names[i] = sp.Name
	}
	s, err := NewSet(names...)
	if err != nil {
		panic("cmdline: the command table is inconsistent: " + err.Error())
	}
	return s
}()

// Lookup returns the table entry of a protocol v2 command; Lookup(Shell)
// is the shell command entry. It answers for every verb of the protocol,
// served by this build or not: a client uses it to pick a read loop.
func Lookup(name string) (Spec, bool) { return protocol.Lookup(name) }

// Protocol returns a copy of the whole command table, in table order.
func Protocol() []Spec { return protocol.Specs() }

// Parse parses one line against the whole protocol (see Set.Parse). A
// server parses against the Set it serves instead.
func Parse(line string) (Command, error) { return protocol.Parse(line) }

// Set is the part of the command table one server serves. Its parser
// rejects every other verb as an unknown command, as the reserved
// namespace rule requires, and its help lists only what it serves.
type Set struct {
	specs []Spec // table order
	index map[string]int
}

// NewSet selects the named entries of the table (Shell for plain shell
// commands). Naming a verb the table lacks, or one verb twice, is an error:
// a server cannot serve a verb the protocol does not define.
func NewSet(names ...string) (*Set, error) {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		if want[n] {
			return nil, fmt.Errorf("cmdline: command %q named twice", n)
		}
		want[n] = true
	}
	s := &Set{index: make(map[string]int, len(names))}
	for _, sp := range table {
		if !want[sp.Name] {
			continue
		}
		if _, dup := s.index[sp.Name]; dup {
			return nil, fmt.Errorf("cmdline: command %q appears twice in the table", sp.Name)
		}
		s.index[sp.Name] = len(s.specs)
		s.specs = append(s.specs, sp)
		delete(want, sp.Name)
	}
	for n := range want {
		return nil, fmt.Errorf("cmdline: %w %q: not in the protocol's command table", ErrUnknownCommand, n)
	}
	return s, nil
}

// Lookup returns the entry of a command s serves.
func (s *Set) Lookup(name string) (Spec, bool) {
	i, ok := s.index[name]
	if !ok {
		return Spec{}, false
	}
	return s.specs[i], true
}

// Specs returns a copy of the entries s serves, in table order.
func (s *Set) Specs() []Spec { return append([]Spec(nil), s.specs...) }

// Help renders s as the body of a __help__ reply (without the
// proto_version line, which belongs to the server).
func (s *Set) Help() string {
	var b strings.Builder
	for _, sp := range s.specs {
		fmt.Fprintf(&b, "%-38s %s", sp.Usage(), sp.Summary)
		var tags []string
		if sp.Access == PrimaryOnly {
			tags = append(tags, sp.Access.String())
		}
		if sp.Reply == Streamed {
			tags = append(tags, sp.Reply.String())
		}
		if len(tags) > 0 {
			fmt.Fprintf(&b, " [%s]", strings.Join(tags, ", "))
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Command is one parsed control line.
type Command struct {
	// Name is the control verb ("__info__", ...) or Shell ("") for a
	// plain shell command.
	Name string
	// Args are the control verb's arguments: single tokens, never
	// containing whitespace; nil when there are none.
	Args []string
	// Shell is the trimmed line for a plain shell command; "" for control
	// commands.
	Shell string
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
// A __name__ verb s does not serve is an unknown command, whether or not
// the protocol defines it: the reserved namespace is never forwarded to
// the guest.
func (s *Set) Parse(line string) (Command, error) {
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
	if !IsControlLine(line) {
		if _, ok := s.Lookup(Shell); !ok {
			return Command{}, errorf(ErrUnknownCommand, "unknown command: this server runs no shell commands")
		}
		return Command{Shell: line}, nil
	}

	toks := strings.FieldsFunc(line, isBlank)
	name, args := toks[0], toks[1:]
	sp, ok := s.Lookup(name)
	if !ok {
		return Command{}, errorf(ErrUnknownCommand, "unknown command %s", quoteToken(name))
	}
	if err := sp.checkArgs(args); err != nil {
		return Command{}, err
	}
	if len(args) == 0 {
		args = nil
	}
	return Command{Name: name, Args: args}, nil
}

// IsControlLine says whether a server would read line as a control verb
// (the reserved __name__ namespace) rather than as a guest shell command,
// whatever the verb's arguments and whether the server serves it. A caller
// that forwards someone else's shell line (nexus's exec) uses it to make
// sure that line can never reach nether itself: it decides exactly as
// Parse does, on the line trimmed of ASCII blanks.
func IsControlLine(line string) bool {
	return strings.HasPrefix(strings.TrimFunc(line, isBlank), "__")
}

func (sp Spec) checkArgs(args []string) error {
	n, r := len(args), sp.Args
	switch {
	case r.Max == 0 && n != 0:
		return errorf(ErrArgs, "%s takes no arguments, got %d", sp.Name, n)
	case r.Min == r.Max && n != r.Max:
		return errorf(ErrArgs, "%s takes exactly %d arguments (%s), got %d", sp.Name, r.Max, r.Synopsis, n)
	case n < r.Min || n > r.Max:
		return errorf(ErrArgs, "%s takes %s, got %d", sp.Name, r.countText(), n)
	}
	if r.Check != nil {
		return r.Check(args)
	}
	return nil
}

// countText words an argument range for an error message.
func (r ArgRule) countText() string {
	plural := func(n int) string {
		if n == 1 {
			return "1 argument"
		}
		return fmt.Sprintf("%d arguments", n)
	}
	if r.Min == 0 {
		return fmt.Sprintf("at most %s (%s)", plural(r.Max), r.Synopsis)
	}
	return fmt.Sprintf("%d to %d arguments (%s)", r.Min, r.Max, r.Synopsis)
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
