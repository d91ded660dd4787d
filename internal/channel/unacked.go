package channel

// Unacked is how many frames we sent that the peer has not acknowledged.
// A snapshot gate that lets some streams stay open (the planes') still
// needs everything sent to have arrived.
func (m *Mux) Unacked() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.unacked)
}
