// Package agentproto defines what nether and the in-guest agent say to
// each other inside channel streams: the metadata a stream is opened with
// and the status it is closed with. The channel moves bytes; this package
// gives them meaning.
//
// Every stream is opened with a JSON Request as its metadata. The agent
// answers on the same stream: output or file bytes, then CloseWrite with a
// status text, or Reset with an error message.
//
// # Session epoch
//
// A guest can be captured and restored, even several times from one
// capture, so bytes the host wrote in one session may reach the guest in
// another (a request still queued in a captured channel, a host that has
// not noticed a restore). The session epoch keeps such a request from
// running in a session that never asked for it:
//
//   - A freshly booted guest serves epoch 0.
//   - After every restore the host picks a fresh random non-zero 64-bit
//     epoch and sends it in the OpRestored handshake; the agent serves
//     that epoch from then on. OpRestored is how the epoch changes, so it
//     is never itself checked.
//   - Every other host-opened request (OpExec, OpPut, OpGet, OpPoweroff)
//     carries in Epoch the epoch of the session that opened it. The agent
//     refuses one whose Epoch differs from the epoch it serves: it resets
//     the stream with a message naming both values and runs nothing (see
//     CheckEpoch).
//   - OpHello and OpEgress are opened by the guest, so they carry no
//     epoch.
//   - A stream the agent already accepted keeps running when the epoch
//     changes: the check is made once, when a request arrives.
package agentproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Version is bumped on any incompatible change to this package.
// 2: the agent refuses host requests whose Epoch is not its session epoch.
// 3: Command and Path travel as base64 (Text), byte for byte.
// 4: the data and egress planes (OpConnect, OpListen, OpEgress).
// 5: OpRestored may carry a new MAC for eth0 (an older agent would drop
// it and keep the NIC's old address, which the host no longer reaches).
// (OpReseed came later without a bump: an agent that predates it refuses
// it by name, so a host learns it cannot reseed that guest; nothing is
// misread.)
// 6: OpRestored may carry RunAs, which narrows the guest's run_as policy
// (an older agent would drop it and keep running commands as root), and
// hello carries Problem.
// 7: identity and secrets (OpProvision after a boot, Identity and Secrets
// in OpRestored): an older agent would drop them, leaving a sandbox
// without the secrets its admission supplied.
const Version = 7

// Text is a string carried byte for byte. JSON strings must be UTF-8, and
// encoding/json replaces every byte that is not with U+FFFD, so a command
// line or a path holding such a byte would reach the guest changed. Text
// travels as base64 instead.
type Text string

// MarshalJSON implements json.Marshaler.
func (t Text) MarshalJSON() ([]byte, error) { return json.Marshal([]byte(t)) }

// UnmarshalJSON implements json.Unmarshaler.
func (t *Text) UnmarshalJSON(b []byte) error {
	var raw []byte
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	*t = Text(raw)
	return nil
}

// Operations.
const (
	OpHello    = "hello"    // agent -> host, once per boot: the agent is up
	OpExec     = "exec"     // host -> agent: run a shell command, stream its output
	OpPut      = "put"      // host -> agent: file bytes follow; status carries the length
	OpGet      = "get"      // host -> agent: send a file's bytes back
	OpPoweroff = "poweroff" // host -> agent: sync and power the guest off
	// OpRestored is the post-restore handshake, host -> agent, before any
	// driving command: the guest learns it was restored, which session
	// epoch it now serves, and (for a fork) its new identity.
	OpRestored = "restored"
	// OpConnect is a data-plane connection, host -> agent: the agent
	// connects to 127.0.0.1:Port in the guest and splices the stream to
	// it. The agent itself is the forwarder, so a fork has it running.
	OpConnect = "connect"
	// OpListen sets the egress plane's guest listener, host -> agent: the
	// agent listens on 127.0.0.1:Port (0: no listener) and opens an
	// OpEgress stream for each connection the tenant makes to it.
	OpListen = "listen"
	// OpEgress is a tenant's outbound connection, agent -> host, Conn
	// naming it for as long as it lives (across snapshots: it is in
	// guest memory).
	OpEgress = "egress"
	// OpReseed reseeds the guest kernel's CRNG, host -> agent: the agent
	// mixes Seed (host randomness) into the kernel's entropy pool and
	// forces a reseed from the pool before it answers "ok", so what the
	// guest draws afterwards shares nothing with another guest restored
	// from the same memory. A claim uses it: QEMU 7.2 cannot change the
	// VM generation id of a running machine, which would do the same
	// through the guest's vmgenid driver.
	OpReseed = "reseed"
	// OpProvision hands a booted guest its identity and secrets, host ->
	// agent, after the hello and before any driving command: the agent
	// writes /run/nether/identity and /run/secrets/NAME and answers
	// "ok 0 provisioned". A restore carries the same in OpRestored.
	OpProvision = "provision"
	// OpClock (host -> agent) sets the guest's wall clock to RealtimeNS
	// and answers "ok 0": nether's periodic correction of a guest whose
	// clock has drifted. An agent that predates it refuses it by name.
	OpClock = "clock"
	// OpWithdraw empties /run/secrets, host -> agent: the agent zeroes
	// each secret file in place, removes it and answers "ok 0
	// withdrawn". A base capture withdraws the secrets before it copies
	// the guest's memory and provisions them again once the guest runs
	// on, so a base holds none of what the agent wrote. (Added without a
	// bump, as OpReseed: an agent that predates it refuses it by name.)
	OpWithdraw = "withdraw"
)

// Withdrawn is the word OpWithdraw's status ends with.
const Withdrawn = "withdrawn"

// The bounds of a reseed's Seed: at least a CRNG key's worth of
// randomness, and no reason for more than a few.
const (
	MinSeed = 32
	MaxSeed = 256
)

// Request is the metadata of every stream.
type Request struct {
	Op      string `json:"op"`
	Version int    `json:"version,omitempty"`
	Command Text   `json:"command,omitempty"` // exec
	Path    Text   `json:"path,omitempty"`    // put, get
	Mode    uint32 `json:"mode,omitempty"`    // put: permission bits
	Port    uint16 `json:"port,omitempty"`    // connect, listen
	Conn    string `json:"conn,omitempty"`    // egress
	Boot    string `json:"boot,omitempty"`    // hello: the guest's boot id
	// hello: guest uptime in ms when the agent started, when its modules
	// were loaded and when it said hello, so boot time can be attributed.
	StartMS   int64 `json:"start_ms,omitempty"`
	ModulesMS int64 `json:"modules_ms,omitempty"`
	HelloMS   int64 `json:"hello_ms,omitempty"`
	// Max bounds a transfer (put, get) in bytes; 0 means no limit, and a
	// negative value is refused. The host sends the most it will send or
	// accept. On get the agent refuses a file whose size is over Max
	// before sending anything, and resets the stream once more than Max
	// bytes were read from it (a file that grew, a /proc file that
	// reports size 0). On put it resets the stream and removes its
	// temporary file once more than Max bytes arrived.
	Max int64 `json:"max,omitempty"`
	// Epoch is the session epoch: on OpRestored the one the agent serves
	// from now on, on every other host request the one of the session
	// that opened it (0, and so omitted, for a freshly booted guest).
	Epoch uint64 `json:"epoch,omitempty"`
	// restored:
	Fork      bool   `json:"fork,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
	MachineID string `json:"machine_id,omitempty"`
	// MAC is eth0's new hardware address (a fork with a network): each
	// child's NIC gets its own, though it sits behind its own NAT.
	MAC string `json:"mac,omitempty"`
	// RunAs is the run_as user the restored sandbox asks for: "" keeps
	// the guest's policy; a user narrows root to that user; a request
	// that would widen or change a user's policy is refused.
	RunAs string `json:"run_as,omitempty"`
	// Problem (hello) is what the guest could not set up as asked (a
	// run_as user it does not know, a disk it could not mount): the host
	// refuses to run commands in it and says why.
	Problem string `json:"problem,omitempty"`
	// DiskProblem (hello) is what is wrong with the persistent disk the
	// guest could not mount, as the rest of a sentence whose subject is
	// the disk ("is not a usable ext4 file system: ..."). Nothing a
	// command does mends it, so the host ends the sandbox, naming its
	// own file. (An agent that predates it reports the disk in Problem,
	// which refuses every command: nothing is misread.)
	DiskProblem string `json:"disk_problem,omitempty"`
	// Seed is what a reseed mixes into the guest's entropy pool:
	// MinSeed to MaxSeed random bytes.
	Seed Text `json:"seed,omitempty"`
	// Identity (provision, restored) is this boot's identity, written
	// to /run/nether/identity; nil leaves the file as it is.
	Identity *Identity `json:"identity,omitempty"`
	// RealtimeNS (provision, restored, clock) is the host's wall clock
	// (CLOCK_REALTIME, ns since the Unix epoch) when the request was
	// sent. The agent sets the guest's wall clock to it before it does
	// anything else: a restored guest's clock otherwise shows the moment
	// of its capture, and a booted one the RTC's whole second. An older
	// agent drops the field and keeps its clock, which is wrong as before
	// but misreads nothing, so this needs no version bump.
	RealtimeNS int64 `json:"realtime_ns,omitempty"`
	// Secrets (provision, restored) replace /run/secrets. A fork's
	// handshake always empties /run/secrets first: a child never keeps
	// its parent's secrets, only those its own admission supplied.
	Secrets Secrets `json:"secrets,omitempty"`
}

// Encode returns the request as stream metadata.
func (r Request) Encode() []byte {
	b, _ := json.Marshal(r) // cannot fail: plain strings and numbers
	return b
}

// Decode parses stream metadata. Both sides treat the other as untrusted.
func Decode(b []byte) (Request, error) {
	var r Request
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decoding agent request: %w", err)
	}
	switch r.Op {
	case OpHello, OpExec, OpPut, OpGet, OpPoweroff, OpRestored, OpConnect, OpListen, OpReseed, OpProvision, OpClock, OpWithdraw:
		if r.Identity != nil {
			if err := r.Identity.Check(); err != nil {
				return r, err
			}
		}
		if err := CheckSecrets(r.Secrets); err != nil {
			return r, err
		}
	case OpEgress:
		if !ValidConn(r.Conn) {
			return r, fmt.Errorf("egress stream with a malformed conn id %q", truncate(r.Conn, 40))
		}
	default:
		return r, fmt.Errorf("unknown agent operation %q", r.Op)
	}
	return r, nil
}

// ErrStaleEpoch is what CheckEpoch wraps when a request belongs to
// another session than the one the agent serves.
var ErrStaleEpoch = errors.New("stale session epoch")

// CheckEpoch decides whether the agent, serving session epoch current, may
// run r; nil means yes. It is the whole epoch rule of the package comment,
// kept free of I/O so it can be tested apart from the agent.
func CheckEpoch(r Request, current uint64) error {
	switch r.Op {
	case OpRestored, OpHello, OpEgress:
		// OpRestored sets the epoch; OpHello and OpEgress are the
		// guest's own. Every other operation, including any added
		// later, is checked: a new operation that forgot the rule
		// should fail closed.
		return nil
	}
	if r.Epoch != current {
		return fmt.Errorf("%w %d (agent serves %d)", ErrStaleEpoch, r.Epoch, current)
	}
	return nil
}

// OKStatus is the close status of a transfer that moved n bytes.
func OKStatus(n int64) []byte { return []byte("ok " + strconv.FormatInt(n, 10)) }

// ParseOKStatus reads a transfer status; anything but "ok <n>" is an error.
func ParseOKStatus(b []byte) (int64, error) {
	s, ok := strings.CutPrefix(string(b), "ok ")
	if !ok {
		return 0, fmt.Errorf("agent reported %q", truncate(string(b), 200))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("agent reported a malformed length %q", truncate(s, 40))
	}
	return n, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// ValidConn says whether id is an egress connection id as the agent mints
// them (NewConn): 16 lowercase hex digits. The host writes the id into
// the preamble line it sends the platform, so anything else is refused.
func ValidConn(id string) bool {
	if len(id) != 16 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Printable is guest-sent text made safe for a host log line or error
// message: at most n bytes, each control or non-ASCII byte as \xNN.
func Printable(s string, n int) string {
	s = truncate(s, n)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, `\x%02x`, c)
		}
	}
	return b.String()
}
