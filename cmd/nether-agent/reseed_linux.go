package main

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// reseed serves OpReseed: the host's seed goes into the kernel's entropy
// pool and the CRNG is reseeded from the pool before the answer, so the
// first thing run after it already draws from the new state.
func (a *agent) reseed(s *channel.Stream, req agentproto.Request) {
	seed := []byte(req.Seed)
	switch {
	case len(seed) < agentproto.MinSeed:
		s.Reset(fmt.Sprintf("reseed: a seed of %d bytes is too short (at least %d)", len(seed), agentproto.MinSeed))
		return
	case len(seed) > agentproto.MaxSeed:
		s.Reset(fmt.Sprintf("reseed: a seed of %d bytes is too long (at most %d)", len(seed), agentproto.MaxSeed))
		return
	}
	reseed := a.reseedCRNG
	if reseed == nil {
		reseed = reseedCRNG
	}
	if err := reseed(seed); err != nil {
		a.log.Error("agent: reseeding the CRNG", "err", err)
		s.Reset("reseed: " + err.Error())
		return
	}
	s.CloseWrite([]byte("ok"))
}

// reseedCRNG mixes seed into the kernel's input pool and makes the CRNG
// reseed from the pool now. A write to /dev/urandom mixes without
// crediting entropy, which is right: the seed only has to be unique to
// this guest, not trusted. RNDRESEEDCRNG (root only) forces the reseed
// the kernel would otherwise make on its own timer, up to a minute later;
// until then every guest restored from one memory image would go on
// drawing from the same CRNG state.
func reseedCRNG(seed []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Write(seed); err != nil {
		return fmt.Errorf("mixing the seed into the entropy pool: %w", err)
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.RNDRESEEDCRNG, 0); err != nil {
		return fmt.Errorf("forcing a CRNG reseed (RNDRESEEDCRNG): %w", err)
	}
	return nil
}
