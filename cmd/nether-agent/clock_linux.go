package main

import (
	"fmt"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"golang.org/x/sys/unix"
)

// setWallClock sets CLOCK_REALTIME to ns, the host's wall clock when the
// request left it (a few ms ago at most: the channel's latency). Only the
// wall clock moves: CLOCK_MONOTONIC, and with it every sleep and timer,
// runs on as the guest kept it, so a restore is a jump of the date and
// nothing else. 0 (an older nether's request) leaves the clock alone.
func setWallClock(ns int64) error {
	if ns == 0 {
		return nil
	}
	ts := unix.NsecToTimespec(ns)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("setting the wall clock: %w", err)
	}
	return nil
}

// clock serves OpClock: nether's correction of the wall clock.
func (a *agent) clock(s *channel.Stream, req agentproto.Request) {
	if req.RealtimeNS == 0 {
		s.Reset("clock: no time given")
		return
	}
	if err := setWallClock(req.RealtimeNS); err != nil {
		s.Reset("clock: " + err.Error())
		return
	}
	s.CloseWrite([]byte("ok 0"))
}
