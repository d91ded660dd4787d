package runner

import (
	"errors"
	"fmt"
	"strings"
)

// The kinds of refusal a caller can act on. A *ReplyError is one of them
// to errors.Is when nether's words say so.
var (
	// ErrBusy is "not now": the sandbox is doing something else (another
	// client's command, work in flight a capture or claim waits for,
	// bytes a park would lose). A caller may retry.
	ErrBusy = errors.New("busy")
	// ErrNoPath is a transfer's path that is not there.
	ErrNoPath = errors.New("no such path")
	// ErrNotFile is a transfer's path that is not a regular file.
	ErrNotFile = errors.New("not a regular file")
	// ErrDenied is a transfer the guest does not permit.
	ErrDenied = errors.New("permission denied")
	// ErrTooLarge is a transfer over the sandbox's max_transfer_bytes.
	ErrTooLarge = errors.New("too large")
	// ErrBadPath is a guest path the control line cannot carry.
	ErrBadPath = errors.New("bad guest path")
)

// ReplyError is a verb nether refused or that failed on the way: Verb is
// the control verb, Msg what nether (or the connection) said.
type ReplyError struct {
	Verb, Msg string
	Err       error // the connection's error, when that is what failed
	kind      error
}

func (e *ReplyError) Error() string        { return e.Verb + ": " + e.Msg }
func (e *ReplyError) Unwrap() error        { return e.Err }
func (e *ReplyError) Is(target error) bool { return e.kind != nil && target == e.kind }

// Refusal is nether's refusal msg of verb, classified by its words.
func Refusal(verb, msg string) *ReplyError {
	return &ReplyError{Verb: verb, Msg: msg, kind: classify(msg)}
}

// failed is verb failing with err on the way (a connection error, a
// control-plane ERR the client reports as an error).
func failed(verb string, err error) *ReplyError {
	return &ReplyError{Verb: verb, Msg: err.Error(), Err: err, kind: classify(err.Error())}
}

// busyReplies are nether's refusals that mean ErrBusy.
var busyReplies = []string{
	"read-only observer",                // another client drives the sandbox (control's dispatch)
	"guest not quiescent",               // a capture's gate (session/capture.go)
	"undelivered bytes",                 // a park's drain gate
	"a snapshot or park is in progress", // a claim during a capture
	"a command or transfer is running",  // a claim's gate
}

// classify is the kind nether's words name, nil for none. The texts are
// the agent's and nether's own (cmd/nether-agent transfer_linux.go,
// agentclient, session); a guest that forges them changes only the kind
// of its own sandbox's reply.
func classify(msg string) error {
	for _, r := range busyReplies {
		if strings.Contains(msg, r) {
			return ErrBusy
		}
	}
	switch {
	case strings.HasSuffix(msg, ": no such file or directory"), strings.HasSuffix(msg, ": not a directory"):
		return ErrNoPath
	case strings.Contains(msg, ": not a regular file"), strings.HasSuffix(msg, ": is a directory"):
		return ErrNotFile
	case strings.HasSuffix(msg, ": permission denied"), strings.HasSuffix(msg, ": read-only file system"):
		return ErrDenied
	case strings.Contains(msg, "over the transfer limit"):
		return ErrTooLarge
	}
	return nil
}

// CheckGuestPath refuses (ErrBadPath) a guest path nether's control line
// cannot carry: its arguments are split on ASCII blanks, so a path with
// one would reach nether as other arguments than the caller meant.
func CheckGuestPath(p string) error {
	switch {
	case p == "":
		return badPath("the guest path is empty")
	case strings.ContainsAny(p, " \t\r\n\v\f"):
		return badPath(fmt.Sprintf("guest path %q holds a blank, tab or line break, which nether's control protocol cannot carry", p))
	case strings.ContainsAny(p, "\x00\x1e\x1f"):
		return badPath(fmt.Sprintf("guest path %q holds a NUL or frame delimiter byte", p))
	}
	return nil
}

// badPath is an ErrBadPath that says only what is wrong with the path.
type badPath string

func (e badPath) Error() string        { return string(e) }
func (e badPath) Is(target error) bool { return target == ErrBadPath }
