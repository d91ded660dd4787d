package netstack

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The network's part of an artifact. The host sockets behind the guest's
// TCP connections cannot cross a capture, so a restore resets each one in
// the guest at once (a guest blocked in recv() sees a reset, never a
// hang) and the guest's next connection works.

// SectionName and SectionVersion name the section in an artifact's
// metadata; both are part of the artifact format. Version 2 added the
// guest's MAC: a nether that cannot read it would leave a woken fork's
// network deaf, so it refuses the section instead.
const (
	SectionName    = "net"
	SectionVersion = 2
)

// sectionMaxConns bounds the connections a section may name: the stack's
// own flow cap, with room.
const sectionMaxConns = 4096

type section struct {
	Conns []GuestConn `json:"conns"`
	// MAC is the guest's NIC address when it is not the NIC's first
	// (a fork's own): a wake must answer the address the guest has.
	MAC string `json:"mac,omitempty"`
}

// Component carries the guest's connections across a capture: a session
// registers it with its other components. It is made with the stack it
// saves from and restores into; a nil stack (no network, or
// validate_snapshot) saves an empty section and only checks one.
type Component struct {
	stack *Stack
	log   *slog.Logger
	// pending are the connections a restore read, reset once the
	// restored guest runs (ResetCarried).
	pending []GuestConn
}

// NewComponent makes the component of st (nil: none); log may be nil.
func NewComponent(st *Stack, log *slog.Logger) *Component {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Component{stack: st, log: log}
}

func (c *Component) Name() string     { return SectionName }
func (c *Component) Version() int     { return SectionVersion }
func (c *Component) Required() bool   { return false }
func (c *Component) Quiescent() error { return nil }
func (c *Component) Freeze()          {}
func (c *Component) Thaw()            {}

// Save lists the guest's open connections and its address; the same for
// every kind of artifact.
func (c *Component) Save(snapshot.Kind) (json.RawMessage, error) {
	var sec section
	if c.stack != nil {
		sec.Conns = c.stack.GuestConns()
		if mac := c.stack.GuestMAC(); mac != nil {
			sec.MAC = mac.String()
		}
	}
	return json.Marshal(sec)
}

// Restore reads the section (nil: an artifact without one), keeps its
// connections for ResetCarried and gives the stack the guest's address.
func (c *Component) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil
	}
	var sec section
	if err := json.Unmarshal(data, &sec); err != nil {
		return fmt.Errorf("net section: %w", err)
	}
	if len(sec.Conns) > sectionMaxConns {
		return fmt.Errorf("net section names %d connections, over %d", len(sec.Conns), sectionMaxConns)
	}
	c.pending = sec.Conns
	if sec.MAC != "" {
		mac, err := net.ParseMAC(sec.MAC)
		if err != nil || len(mac) != 6 {
			return fmt.Errorf("net section: %q is not an Ethernet address", sec.MAC)
		}
		if c.stack != nil {
			return c.stack.SetGuestMAC(mac)
		}
	}
	return nil
}

// ResetCarried resets, in the restored guest, the connections its
// artifact carried.
func (c *Component) ResetCarried() {
	if c.stack == nil || len(c.pending) == 0 {
		return
	}
	c.log.Info("resetting the guest's connections from before the capture", "count", len(c.pending))
	c.stack.ResetGuestConns(c.pending)
	c.pending = nil
}
