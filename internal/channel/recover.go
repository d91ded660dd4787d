package channel

import (
	"fmt"
	"time"
)

// Frames lost on a live transport, and a peer that went silent.
//
// The resend queue makes a new transport lose nothing: both sides resend
// what is unacknowledged when one attaches. Frames can also be lost while
// a transport lives on: a bulk lane batch refused because the memory
// under its descriptor changed (a guest scribbling over its BAR), or
// bytes skipped as garbage. Without more, the receiver would drop every
// later frame as out of order and the channel would stall for good. So a
// receiver that sees a loss asks the peer to send again (a resync frame,
// which every agent version answers by resending its unacknowledged
// frames), at most once per askEvery; and a sender whose frames stay
// unacknowledged resends them unasked (resendAfter), for a peer that
// does not ask (an older agent).
//
// A peer can also stop answering at all (a guest that removed the
// channel's device, an agent that no longer runs): SetLiveness makes the
// host half send a keepalive while streams are open and nothing arrives,
// and close the channel once nothing at all arrived for its timeout
// while frames waited for an answer. Every stream then fails, and Dead
// tells the session, which ends the sandbox.

// askEvery bounds how often a receiver asks the peer to send again: the
// frames already on their way after a loss all arrive out of order, and
// the peer's resend of everything unacknowledged answers for them all.
const askEvery = time.Second

// askResendLocked asks the peer to resend everything it sent that we
// have not acknowledged, unless we asked less than askEvery ago (now
// says to ask regardless). The resync goes with an announce of our lane,
// so the peer keeps using it, unless we refused its batches.
func (m *Mux) askResendLocked(why string, now bool) {
	t := time.Now()
	if !now && t.Sub(m.askedAt) < askEvery {
		return
	}
	m.askedAt = t
	m.outq = append(m.outq, &pending{enc: appendFrame(nil, &frame{typ: typeResync}), refs: 1})
	lane := "unchanged"
	if m.lane != nil {
		if m.lane.rxDead.Load() {
			lane = "the peer's half is no longer read"
		} else {
			m.outq = append(m.outq, laneAnnounce())
		}
	}
	m.log.Warn("channel: frames from the peer were lost; asking the peer to send them again", "why", why, "from_seq", m.recvSeq+1, "lane", lane)
	m.cond.Broadcast()
}

// restartSilenceLocked restarts the clocks of the liveness watch: after
// an attach or a thaw the peer had no chance to answer yet.
func (m *Mux) restartSilenceLocked() {
	now := time.Now()
	m.heard, m.ackedAt = now, now
}

// SetLiveness has the Mux watch its peer: a keepalive after silence/5
// while streams are open, our unacknowledged frames resent after
// silence/3 without an acknowledgement, and the channel closed once
// nothing arrived for silence while frames waited (Dead, Err). Only a
// host half calls it, once: a guest's host may stop it at will.
func (m *Mux) SetLiveness(silence time.Duration) {
	go m.watch(silence)
}

// Dead is closed when the liveness watch closed the channel.
func (m *Mux) Dead() <-chan struct{} { return m.dead }

// Err is why the channel closed, nil while it is open.
func (m *Mux) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		return nil
	}
	return m.closedErrLocked()
}

func (m *Mux) watch(silence time.Duration) {
	t := time.NewTicker(max(silence/20, time.Millisecond))
	defer t.Stop()
	for range t.C {
		m.mu.Lock()
		closed := m.closed || m.watchLocked(time.Now(), silence)
		m.mu.Unlock()
		if closed {
			return
		}
	}
}

// watchLocked is one look at the peer; true once the channel is closed.
func (m *Mux) watchLocked(now time.Time, silence time.Duration) bool {
	if m.frozen || m.transport == nil {
		// Nothing can arrive: the peer is stopped for a capture, or
		// there is no transport yet.
		m.restartSilenceLocked()
		return false
	}
	if len(m.unacked) == 0 && len(m.streams) == 0 {
		m.heard = now // nobody waits for the peer: its silence is fine
		return false
	}
	quiet := now.Sub(m.heard)
	if quiet >= silence && len(m.unacked) > 0 {
		m.declareDeadLocked(quiet)
		return true
	}
	if quiet >= silence/5 && m.pingSeq == 0 {
		m.pingLocked()
	}
	if len(m.unacked) > 0 && now.Sub(m.ackedAt) >= silence/3 && now.Sub(m.resentAt) >= silence/3 {
		m.resentAt = now
		m.resendUnaskedLocked()
	}
	return false
}

// pingLocked sends the keepalive: a sequenced frame that means nothing
// (a window grant for stream 0, which no stream ever is), so that every
// agent version acknowledges it.
func (m *Mux) pingLocked() {
	var grant [4]byte
	m.sendLocked(typeWindow, 0, grant[:])
	p := m.unacked[len(m.unacked)-1]
	p.ping = true
	m.pingSeq = p.seq
}

// resendUnaskedLocked queues every unacknowledged frame again, keeping the
// unsequenced frames (acks, announces, resyncs) already queued, with a
// resync that asks the peer for what we may lack in turn.
func (m *Mux) resendUnaskedLocked() {
	q := make([]*pending, 0, len(m.outq)+len(m.unacked)+1)
	for _, p := range m.outq {
		if p.seq == 0 {
			p.refs++
			q = append(q, p)
		}
	}
	q = append(q, &pending{enc: appendFrame(nil, &frame{typ: typeResync}), refs: 1})
	if m.lane != nil && !m.lane.rxDead.Load() {
		q = append(q, laneAnnounce())
	}
	m.askedAt = time.Now()
	m.setOutqLocked(append(q, m.resendLocked()...))
	m.log.Warn("channel: the peer has acknowledged nothing for a while; sending our frames again", "unacked_frames", len(m.unacked))
	m.cond.Broadcast()
}

// declareDeadLocked closes the channel for a peer that stopped answering.
func (m *Mux) declareDeadLocked(quiet time.Duration) {
	m.closed = true
	m.closeErr = fmt.Errorf("%w: the guest stopped answering on the channel (nothing arrived for %s while %d frames waited for it)",
		ErrClosed, quiet.Round(100*time.Millisecond), len(m.unacked))
	m.ackTimer.Stop()
	close(m.dead)
	m.cond.Broadcast()
}
