package channel

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
)

// StateVersion is bumped whenever State changes shape or meaning; a
// snapshot carrying another version is refused rather than guessed at.
//
// Version 2: the frames in Unacked carry an XXH64 payload checksum
// instead of CRC-32C (see payloadSum), so a version 1 state's frames
// would not decode.
const StateVersion = 2

// State is the complete, serialisable state of one half of the channel.
// A snapshot stores the host half; a restored nether rebuilds its Mux from
// it and, when the new QEMU connects, resends what the guest never
// acknowledged.
type State struct {
	Version int            `json:"version"`
	Role    Role           `json:"role"`
	NextSeq uint64         `json:"next_seq"`
	RecvSeq uint64         `json:"recv_seq"`
	NextID  uint32         `json:"next_id"`
	Unacked []PendingFrame `json:"unacked"`
	Streams []StreamState  `json:"streams"`
}

// PendingFrame is a sent, unacknowledged frame, kept encoded.
type PendingFrame struct {
	Seq     uint64 `json:"seq"`
	Encoded []byte `json:"encoded"`
}

// StreamState is one stream's state.
type StreamState struct {
	ID           uint32 `json:"id"`
	Meta         []byte `json:"meta,omitempty"`
	Credit       int    `json:"credit"`
	Unread       []byte `json:"unread,omitempty"`
	Consumed     int    `json:"consumed"`
	LocalClosed  bool   `json:"local_closed,omitempty"`
	RemoteClosed bool   `json:"remote_closed,omitempty"`
	Status       []byte `json:"status,omitempty"`
	Accepted     bool   `json:"accepted"`
}

// State captures the Mux. Call it with the peer stopped (and the Mux
// frozen) so the picture is the one the snapshot's guest memory matches.
func (m *Mux) State() *State {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := &State{Version: StateVersion, Role: m.role, NextSeq: m.nextSeq, RecvSeq: m.recvSeq, NextID: m.nextID}
	for _, p := range m.unacked {
		st.Unacked = append(st.Unacked, PendingFrame{Seq: p.seq, Encoded: append([]byte(nil), p.enc...)})
	}
	for _, s := range m.streams {
		st.Streams = append(st.Streams, StreamState{
			// Credit a writer has taken but not yet spent is credit: a
			// restored Mux never sends the frame it was for.
			ID: s.id, Meta: s.meta, Credit: s.credit + s.reserved, Unread: s.unreadBytes(),
			Consumed: s.consumed, LocalClosed: s.localClosed, RemoteClosed: s.remoteClosed,
			Status: s.status, Accepted: s.accepted,
		})
	}
	sort.Slice(st.Streams, func(i, j int) bool { return st.Streams[i].ID < st.Streams[j].ID })
	return st
}

// Halt stops the Mux for good after a park captured its state: nothing is
// written or delivered afterwards, so no byte reaches a local reader that
// the captured state also holds. The captured state must be the only
// future of every byte.
func (m *Mux) Halt() {
	m.mu.Lock()
	m.closed, m.halted = true, true
	m.cond.Broadcast()
	m.mu.Unlock()
}

// Marshal encodes the state.
func (st *State) Marshal() ([]byte, error) { return json.Marshal(st) }

// UnmarshalState decodes and validates a state. Everything is checked:
// the bytes come from a file on disk.
func UnmarshalState(b []byte) (*State, error) {
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("decoding channel state: %w", err)
	}
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("invalid channel state: %w", err)
	}
	return &st, nil
}

func (st *State) validate() error {
	if st.Version != StateVersion {
		return fmt.Errorf("version %d, this build reads %d", st.Version, StateVersion)
	}
	if st.Role != Host && st.Role != Guest {
		return fmt.Errorf("unknown role %d", st.Role)
	}
	if st.NextSeq == 0 {
		return fmt.Errorf("next_seq is 0")
	}
	if st.NextID == 0 || (st.NextID%2 == 1) != (st.Role == Host) {
		return fmt.Errorf("next_id %d does not belong to role %d", st.NextID, st.Role)
	}
	prev := uint64(0)
	for _, p := range st.Unacked {
		if p.Seq <= prev || p.Seq >= st.NextSeq {
			return fmt.Errorf("unacked frame seq %d out of order or beyond next_seq %d", p.Seq, st.NextSeq)
		}
		prev = p.Seq
		var d Decoder
		d.Feed(p.Encoded)
		f, err := d.next()
		if err != nil || d.Skipped != 0 || d.unparsed() != 0 || f.seq != p.Seq {
			return fmt.Errorf("unacked frame seq %d is not one valid frame", p.Seq)
		}
	}
	seen := map[uint32]bool{}
	for _, s := range st.Streams {
		if s.ID == 0 || seen[s.ID] {
			return fmt.Errorf("stream id %d is zero or repeated", s.ID)
		}
		seen[s.ID] = true
		if s.Credit < 0 || s.Credit > Window || len(s.Unread) > Window || s.Consumed < 0 || s.Consumed > Window {
			return fmt.Errorf("stream %d has credit/buffer figures outside the window", s.ID)
		}
	}
	return nil
}

// Restore builds a Mux from a captured state. It is unattached: frames
// flow once Attach hands it the new transport.
func Restore(st *State, log *slog.Logger) (*Mux, error) {
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("restoring channel: %w", err)
	}
	m := New(st.Role, log)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextSeq, m.recvSeq, m.ackSent, m.nextID = st.NextSeq, st.RecvSeq, st.RecvSeq, st.NextID
	for _, p := range st.Unacked {
		m.unacked = append(m.unacked, &pending{seq: p.Seq, enc: append([]byte(nil), p.Encoded...), refs: 1})
	}
	for _, ss := range st.Streams {
		s := m.newStreamLocked(ss.ID, ss.Meta)
		s.credit, s.consumed = ss.Credit, ss.Consumed
		if len(ss.Unread) > 0 {
			s.unread = [][]byte{append([]byte(nil), ss.Unread...)}
			s.unreadLen = len(ss.Unread)
		}
		s.localClosed, s.remoteClosed, s.status, s.accepted = ss.LocalClosed, ss.RemoteClosed, ss.Status, ss.Accepted
		if !s.accepted {
			m.acceptq = append(m.acceptq, s)
		}
	}
	return m, nil
}

// Streams returns the open streams, for a restored nether to adopt or
// drop the ones whose host-side owner did not survive the restore.
func (m *Mux) Streams() []*Stream {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Stream, 0, len(m.streams))
	for _, s := range m.streams {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}
