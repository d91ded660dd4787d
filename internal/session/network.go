package session

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/firewall"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/netlog"
	"github.com/nethersandbox/nether/internal/netstack"
	"github.com/nethersandbox/nether/internal/timeline"
)

// The network (net = 1): the guest's NIC is an engine endpoint carrying
// Ethernet frames; nether terminates the guest's TCP and UDP in a
// user-mode stack (internal/netstack) and opens host sockets for what the
// firewall allows. Every new flow is on the record (__netlog__, NET
// events) and counted (net_tx, net_rx, net_blocked).

// rules is the sandbox's firewall, from its own nether.conf (a fork's
// included: the firewall is never inherited).
func (s *Session) rules() firewall.Rules {
	return firewall.Rules{Open: s.cfg.NetOpen, Allow: s.cfg.NetAllow, Block: s.cfg.NetBlock}
}

// startNetwork brings the network stack up on the machine's NIC, before
// the guest runs (a boot) or resumes (a restore).
func (s *Session) startNetwork(m engine.Machine) error {
	if !s.cfg.Net {
		return nil
	}
	link := m.NIC()
	if link == nil {
		return fmt.Errorf("net = 1, but the engine gave the machine no NIC")
	}
	rules := s.rules()
	st, err := netstack.New(netstack.Config{
		Policy: func(proto netstack.Proto, dst netip.AddrPort) netstack.Verdict {
			d := rules.Decide(dst.Addr())
			return netstack.Verdict{Allow: d.Allow, Rule: d.Rule}
		},
		OnFlow: func(f netstack.Flow) {
			verdict := "ALLOW"
			if !f.Allowed {
				verdict = "BLOCK"
			}
			why := f.Rule
			if f.Reason != "" {
				why = f.Reason
			}
			ms := s.meter.Elapsed().Milliseconds()
			if f.Proto == netstack.TCP || f.Proto == netstack.UDP {
				s.flows.Add(netlog.Entry{MS: ms, Proto: string(f.Proto), Dst: f.Dst, Allowed: f.Allowed})
			}
			s.events.Addf(timeline.NET, "%s %s %s rule=%s", f.Proto, f.Dst, verdict, why)
		},
		RateKbps: s.cfg.NetRateKbps,
		Log:      s.log.With("part", "net"),
	}, link)
	if err != nil {
		return fmt.Errorf("starting the network: %w", err)
	}
	s.net = st
	s.meter.SetNet(func() meter.Net {
		n := st.Stats()
		return meter.Net{Tx: n.TxBytes, Rx: n.RxBytes, Blocked: n.Blocked + n.Refused}
	})
	s.log.Info("network up", "firewall", firewallState(s.cfg.NetOpen), "allow", firewall.FormatList(s.cfg.NetAllow),
		"block", firewall.FormatList(s.cfg.NetBlock), "rate_kbps", s.cfg.NetRateKbps)
	return nil
}

// stopNetwork closes every host socket of the guest's flows.
func (s *Session) stopNetwork() {
	if s.net != nil {
		s.net.Close()
	}
}

func firewallState(open bool) string {
	if open {
		return "off"
	}
	return "on"
}

// newGuestMAC is a fork's own NIC address (nil without a network): random,
// locally administered, unicast. Its agent sets it in the handshake and
// the stack takes it after (tookMAC).
func (s *Session) newGuestMAC() net.HardwareAddr {
	if s.net == nil {
		return nil
	}
	b := randomBytes(6)
	b[0] = b[0]&^1 | 2
	return net.HardwareAddr(b)
}

// tookMAC tells the stack the guest's new address, once its agent set it.
func (s *Session) tookMAC(mac net.HardwareAddr) error {
	if mac == nil || s.net == nil {
		return nil
	}
	return s.net.SetGuestMAC(mac)
}

func macText(mac net.HardwareAddr) string {
	if mac == nil {
		return ""
	}
	return mac.String()
}
