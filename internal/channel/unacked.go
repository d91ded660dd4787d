package channel

// Unacked is how many frames we sent that the peer has not acknowledged.
// A snapshot gate that lets some streams stay open (the planes') still
// needs everything sent to have arrived.
func (m *Mux) Unacked() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unackedLocked()
}

// unackedLocked counts the resend queue but for a keepalive (recover.go):
// it carries nothing, and one in flight must not make a snapshot gate
// refuse.
func (m *Mux) unackedLocked() int {
	n := len(m.unacked)
	for _, p := range m.unacked {
		if p.ping {
			n--
		}
	}
	return n
}
