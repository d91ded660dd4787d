package session

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/plane"
)

// planeAgentWait bounds how long a data-plane connection waits for the
// agent, as a command does.
const planeAgentWait = 30 * time.Second

// capturedPlanes reads the planes section of the artifact a restore
// starts from, before anything starts: the data socket is bound first.
func (s *Session) capturedPlanes() (plane.Ports, error) {
	if s.art == nil {
		return plane.Ports{}, nil
	}
	raw, ok := s.art.Meta.Sections[plane.SectionName]
	if !ok {
		return plane.Ports{}, nil
	}
	ports, err := plane.DecodeSection(raw.Data)
	switch {
	case errors.Is(err, plane.ErrPortRange):
		return ports, fmt.Errorf("snapshot %s: the planes section names a port out of range", s.art.Dir)
	case err != nil:
		return ports, fmt.Errorf("snapshot %s: the planes section: %w", s.art.Dir, err)
	}
	return ports, nil
}

// startPlanes binds the data socket and makes the planes, before the
// guest starts: a bad data_socket stops nether before it boots anything,
// and a platform may connect while the guest boots (its connection waits
// for the agent). The ports a restore leaves out come from its artifact.
func (s *Session) startPlanes() error {
	captured, err := s.capturedPlanes()
	if err != nil {
		return err
	}
	s.appPort, s.egressPort = s.cfg.AppPort, s.cfg.EgressPort
	if s.appPort == 0 {
		s.appPort = captured.App
	}
	if s.egressPort == 0 && s.cfg.EgressSocket != "" {
		// A restore with an egress socket and no port uses the port its
		// guest listens on; one without either closes that listener
		// (setEgressListener), so the tenant's connections are refused
		// rather than accepted and dropped.
		s.egressPort = captured.Egress
	}
	s.capturedEgressPort = captured.Egress
	if s.cfg.DataSocket != "" && s.appPort == 0 {
		return fmt.Errorf("data_socket is set but neither nether.conf nor the snapshot names app_port")
	}
	if s.cfg.EgressSocket != "" && s.egressPort == 0 {
		return fmt.Errorf("egress_socket is set but neither nether.conf nor the snapshot names egress_port")
	}
	p, err := plane.New(plane.Config{
		AppPort:      uint16(s.appPort),
		DataSocket:   s.cfg.DataSocket,
		EgressSocket: s.cfg.EgressSocket,
		MaxConns:     s.cfg.MaxDataConns,
		IdleMS:       s.cfg.DataIdleMS,
		RateKbps:     s.cfg.DataRateKbps,
		Connect:      s.connectPlane,
		BootID:       func() string { return s.getView().boot.bootID },
		In:           s.meter.In,
		Out:          s.meter.Out,
		Active: func() {
			if s.ctl != nil {
				s.ctl.Touch()
			}
		},
		Log: s.log,
	})
	if err != nil {
		return err
	}
	s.planes = p
	s.meter.SetPlanes(func() meter.Planes {
		st := p.Stats()
		return meter.Planes{Conns: st.Conns, MS: st.MS}
	})
	if s.jail != nil && s.cfg.DataSocket != "" && filepath.Dir(s.cfg.DataSocket) == filepath.Clean(s.cfg.Dir) {
		s.jail.Protect(filepath.Base(s.cfg.DataSocket))
	}
	go p.Serve()
	if s.dataPlane() {
		s.log.Info("data socket ready", "path", s.cfg.DataSocket, "app_port", s.appPort)
	}
	return nil
}

func (s *Session) dataPlane() bool   { return s.cfg.DataSocket != "" && s.appPort != 0 }
func (s *Session) egressPlane() bool { return s.cfg.EgressSocket != "" && s.egressPort != 0 }

// connectPlane opens a data-plane stream once the guest is assembled and
// its agent up.
func (s *Session) connectPlane(ctx context.Context, port uint16) (*channel.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, planeAgentWait)
	defer cancel()
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("the guest is not assembled: %w", context.Cause(ctx))
	case <-s.ctx.Done():
		return nil, context.Cause(s.ctx)
	}
	return s.agent.Connect(ctx, port)
}

// serveEgress hands the guest's egress streams to the planes.
func (s *Session) serveEgress(_ context.Context, st *channel.Stream, req agentproto.Request) {
	s.planes.Egress(st, req, false)
}

// setEgressListener tells the agent which guest port the egress plane
// listens on, once it is up: after a boot, and after a restore, whose
// guest may have another listener from its capture (or one to close).
func (s *Session) setEgressListener(restored bool) {
	port := s.egressPort
	if !restored && port == 0 {
		return
	}
	if restored && port == s.capturedEgressPort {
		return // the guest listens where it should already
	}
	ctx, cancel := context.WithTimeout(s.ctx, planeAgentWait)
	defer cancel()
	if err := s.agent.Listen(ctx, uint16(port)); err != nil {
		s.log.Error("egress plane: setting the guest's listener", "port", port, "err", err)
		return
	}
	s.log.Info("egress plane: the guest listens", "port", port)
}

// planeStream says a stream belongs to a plane: it may stay open across
// a snapshot (a park-await's egress connection is the point).
func planeStream(st *channel.Stream) (agentproto.Request, bool) {
	req, err := agentproto.Decode(st.Meta())
	if err != nil {
		return req, false
	}
	return req, req.Op == agentproto.OpConnect || req.Op == agentproto.OpEgress
}

// planesBusy: an open data or egress connection keeps the sandbox from
// being reclaimed as idle, as a connected client does.
func (s *Session) planesBusy() bool { return s.planes != nil && s.planes.Busy() }
