package plane

import (
	"encoding/json"
	"errors"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// The planes' part of an artifact: the guest ports the captured session
// served, which a restore whose nether.conf leaves them out inherits (the
// tenant's server and its egress habits live in the guest's memory).

// SectionName and SectionVersion name the section in an artifact's
// metadata; both are part of the artifact format.
const (
	SectionName    = "planes"
	SectionVersion = 1
)

// Ports are the guest ports the planes serve; 0 is none.
type Ports struct {
	App    int `json:"app_port,omitempty"`
	Egress int `json:"egress_port,omitempty"`
}

// ErrPortRange is a section naming a port no TCP port can be.
var ErrPortRange = errors.New("a port out of range")

// DecodeSection reads a planes section, checking its ports.
func DecodeSection(data json.RawMessage) (Ports, error) {
	var p Ports
	if err := json.Unmarshal(data, &p); err != nil {
		return p, err
	}
	if p.App < 0 || p.App > 65535 || p.Egress < 0 || p.Egress > 65535 {
		return p, ErrPortRange
	}
	return p, nil
}

// Component carries the guest ports across a capture and holds the
// planes still while one is taken. Bytes the planes hold on the host side
// cannot cross a park (Drained is the park's drain gate). It is made with
// the planes and the ports they serve; nil planes (console mode,
// validate_snapshot) freeze nothing and hold nothing.
type Component struct {
	planes *Planes
	ports  Ports
}

// NewComponent makes the component of p (nil: none) serving ports.
func NewComponent(p *Planes, ports Ports) *Component {
	return &Component{planes: p, ports: ports}
}

func (c *Component) Name() string     { return SectionName }
func (c *Component) Version() int     { return SectionVersion }
func (c *Component) Required() bool   { return false }
func (c *Component) Quiescent() error { return nil }

func (c *Component) Freeze() {
	if c.planes != nil {
		c.planes.Freeze()
	}
}

func (c *Component) Thaw() {
	if c.planes != nil {
		c.planes.Thaw()
	}
}

// Drained says no bytes for the guest wait on the host side.
func (c *Component) Drained() error {
	if c.planes == nil {
		return nil
	}
	return c.planes.Drained()
}

func (c *Component) Save(snapshot.Kind) (json.RawMessage, error) {
	return json.Marshal(c.ports)
}

// Restore checks the section; the session reads it before it starts
// (DecodeSection), because the data socket is bound before assembly.
func (c *Component) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil
	}
	_, err := DecodeSection(data)
	return err
}
