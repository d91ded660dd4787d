// Package lifecycle is nexus's table of sandbox states and the verbs that
// move a sandbox between them. Every operation asks the table first, so
// an illegal request fails the same way wherever it comes from (the CLI,
// the HTTP API) and before anything is touched.
package lifecycle

import (
	"fmt"
	"sort"
	"strings"
)

// State is where a sandbox is.
type State string

// The states.
const (
	Created State = "created" // a record; no process, nothing booted yet
	Running State = "running" // its nether runs
	Stopped State = "stopped" // its guest shut down cleanly; it can boot again
	Paused  State = "paused"  // parked: no process, no memory, a park artifact
	Error   State = "error"   // its nether failed; the record says why
	Removed State = "removed" // gone (the record is deleted)
)

// Verb is an operation on one sandbox.
type Verb string

// The verbs.
const (
	Start    Verb = "start"
	Stop     Verb = "stop"
	Pause    Verb = "pause"
	Resume   Verb = "resume"
	Remove   Verb = "rm"
	RemoveF  Verb = "rm --force"
	Snapshot Verb = "snapshot"
	Fail     Verb = "fail" // its nether failed (reconciliation, not a request)
	// Fork is not a transition: the parent's state is unchanged. It is
	// in the vocabulary so that asking the table for it fails clearly.
	Fork Verb = "fork"
)

// table is every legal (state, verb) and where it leads.
var table = map[State]map[Verb]State{
	Created: {Start: Running, Remove: Removed, RemoveF: Removed, Fail: Error},
	Running: {Stop: Stopped, Pause: Paused, Snapshot: Running, RemoveF: Removed, Fail: Error},
	// No snapshot of a stopped sandbox: a capture takes the memory of a
	// running guest with its disk, and a stopped one has no memory.
	Stopped: {Start: Running, Remove: Removed, RemoveF: Removed, Fail: Error},
	Paused:  {Resume: Running, Remove: Removed, RemoveF: Removed, Fail: Error},
	Error:   {Remove: Removed, RemoveF: Removed, Fail: Error},
}

// IllegalTransitionError is a request the table does not allow.
type IllegalTransitionError struct {
	Sandbox string // its name or id, as the user named it
	State   State
	Verb    Verb
}

// Error says what was refused and what the sandbox allows instead, in
// words that hold for the CLI and the HTTP API alike.
func (e *IllegalTransitionError) Error() string {
	msg := fmt.Sprintf("sandbox %s is %s: %s is not allowed", e.Sandbox, e.State, e.Verb)
	switch {
	case e.Verb == Fork:
		// Asked of the table only for a sandbox that is not running.
		return fmt.Sprintf("sandbox %s is %s: a fork is made from a running sandbox (snapshotted first) or from a snapshot; start it, or fork one of its snapshots", e.Sandbox, e.State)
	case e.Verb == Snapshot && e.State == Stopped:
		return msg + ": a snapshot captures a running guest's memory with its disk, and a stopped sandbox has no memory to capture; start it (its disk, if any, is kept) and snapshot it running"
	case e.Verb == Remove && e.State == Running:
		return msg + " while it runs: stop it first, or remove it with force"
	}
	if allowed := Allowed(e.State); len(allowed) > 0 {
		names := make([]string, len(allowed))
		for i, v := range allowed {
			names[i] = string(v)
		}
		return fmt.Sprintf("%s; a %s sandbox allows: %s", msg, e.State, strings.Join(names, ", "))
	}
	return msg
}

// Next is where verb takes a sandbox in state, or an
// IllegalTransitionError naming sandbox.
func Next(sandbox string, state State, verb Verb) (State, error) {
	if to, ok := table[state][verb]; ok {
		return to, nil
	}
	return "", &IllegalTransitionError{Sandbox: sandbox, State: state, Verb: verb}
}

// Allowed lists the verbs a user may ask of a sandbox in state.
func Allowed(state State) []Verb {
	var vs []Verb
	for v := range table[state] {
		if v != Fail {
			vs = append(vs, v)
		}
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i] < vs[j] })
	return vs
}

// States is every state a record can be in, in display order.
func States() []State { return []State{Created, Running, Stopped, Paused, Error} }

// Verbs is every verb a user can ask for.
func Verbs() []Verb { return []Verb{Start, Stop, Pause, Resume, Remove, RemoveF, Snapshot, Fork} }
