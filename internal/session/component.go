package session

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/disk"
	"github.com/nethersandbox/nether/internal/netstack"
	"github.com/nethersandbox/nether/internal/plane"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// Component is a part of the session that holds host-side state which must
// cross a capture: the channel, the console, the network stack
// (netstack.Component), the planes (plane.Component), the disk
// (disk.Component), the run_as policy. Each registers once and owns one
// versioned section of the artifact's metadata, so adding a plane is
// adding a component, never editing the capture. A component is made with
// what it saves and restores; it never reaches into the Session.
type Component interface {
	// Name is the section name: [a-z0-9_]{1,32}, unique in a session.
	Name() string
	// Version is the section version this build writes and the newest it
	// reads.
	Version() int
	// Required says a restore cannot go on without this component's
	// section (an artifact without it is refused).
	Required() bool
	// Quiescent is nil when nothing is in flight, or says what is.
	Quiescent() error
	// Freeze stops the component changing state the guest could see;
	// Thaw undoes it. A capture freezes before the engine pauses.
	Freeze()
	Thaw()
	// Save returns the section of an artifact of kind, while frozen and
	// with the guest paused.
	Save(kind snapshot.Kind) (json.RawMessage, error)
	// Restore loads a section before the guest resumes; data is nil when
	// the artifact has none (it predates the component).
	Restore(version int, data json.RawMessage) error
}

// components is the session's registry, in registration order.
type components []Component

// newComponents is every component a session holds, in the order their
// sections are saved and restored: adding a plane is adding it here, and
// restore, capture and validate_snapshot all see it. The channel comes
// back on its own too, because the session drives it directly. newMux
// rebuilds the channel from its section; with nil the components only
// check their sections (validate_snapshot).
// con carries the console's screen, nc the guest's connections, pc the
// planes' ports, dc the persistent disk's section and pol the run_as
// policy; a nil one (validate_snapshot, a restore's first check) only
// checks its section.
func newComponents(newMux func(*channel.State) (*channel.Mux, error), con *consoleComponent, nc *netstack.Component, pc *plane.Component, dc *disk.Component, pol *policyComponent) (components, *channelComponent) {
	cc := &channelComponent{newMux: newMux}
	if con == nil {
		con = &consoleComponent{}
	}
	if nc == nil {
		nc = netstack.NewComponent(nil, nil)
	}
	if pc == nil {
		pc = plane.NewComponent(nil, plane.Ports{})
	}
	if dc == nil {
		dc = disk.NewComponent("")
	}
	if pol == nil {
		pol = &policyComponent{}
	}
	return components{cc, con, nc, pc, dc, pol}, cc
}

// save collects every component's section of an artifact of kind.
func (cs components) save(into map[string]snapshot.Section, kind snapshot.Kind) error {
	for _, c := range cs {
		data, err := c.Save(kind)
		if err != nil {
			return fmt.Errorf("saving %s state: %w", c.Name(), err)
		}
		into[c.Name()] = snapshot.Section{Version: c.Version(), Data: data}
	}
	return nil
}

// check refuses an artifact this build cannot fully bring back: a section
// nobody here owns (from a newer build), a section newer than its owner
// reads, a required section that is missing. It runs before anything
// starts, and for validate_snapshot.
func (cs components) check(sections map[string]snapshot.Section) error {
	known := map[string]Component{}
	for _, c := range cs {
		known[c.Name()] = c
	}
	names := make([]string, 0, len(sections))
	for name := range sections {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == snapshot.SectionEngine {
			continue
		}
		c, ok := known[name]
		if !ok {
			return fmt.Errorf("the snapshot needs a %q section, which this nether does not know (it was taken by a newer nether)", name)
		}
		if v := sections[name].Version; v > c.Version() {
			return fmt.Errorf("the snapshot's %q section is version %d; this nether reads up to %d", name, v, c.Version())
		}
	}
	for _, c := range cs {
		if _, ok := sections[c.Name()]; !ok && c.Required() {
			return fmt.Errorf("the snapshot has no %q section", c.Name())
		}
	}
	return nil
}

// restore hands each component its section (nil when absent).
func (cs components) restore(sections map[string]snapshot.Section) error {
	for _, c := range cs {
		sec, ok := sections[c.Name()]
		var data json.RawMessage
		if ok {
			data = sec.Data
		}
		if err := c.Restore(sec.Version, data); err != nil {
			return fmt.Errorf("restoring %s state: %w", c.Name(), err)
		}
	}
	return nil
}

func (cs components) quiescent() error {
	for _, c := range cs {
		if err := c.Quiescent(); err != nil {
			return err
		}
	}
	return nil
}

// drainer is a component that can hold bytes for the guest on the host
// side (a plane bridge's ring). A park refuses while any is undrained:
// those bytes are host memory a park cannot carry.
type drainer interface {
	Drained() error
}

func (cs components) drained() error {
	for _, c := range cs {
		if d, ok := c.(drainer); ok {
			if err := d.Drained(); err != nil {
				return fmt.Errorf("%s: %w", c.Name(), err)
			}
		}
	}
	return nil
}

func (cs components) freeze() {
	for _, c := range cs {
		c.Freeze()
	}
}

func (cs components) thaw() {
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i].Thaw()
	}
}

// channelComponent is the host half of the channel. On a restore it is
// rebuilt from its section; on a boot it starts empty.
type channelComponent struct {
	mux *channel.Mux
	// restored is the Mux a Restore built, for the session to take.
	restored *channel.Mux
	newMux   func(st *channel.State) (*channel.Mux, error)
}

func (c *channelComponent) Name() string   { return "channel" }
func (c *channelComponent) Version() int   { return channel.StateVersion }
func (c *channelComponent) Required() bool { return true }
func (c *channelComponent) Freeze()        { c.mux.Freeze() }
func (c *channelComponent) Thaw()          { c.mux.Thaw() }

// Quiescent: everything sent has arrived, and no stream is open but the
// planes'. A plane's connection may cross a capture: a fork resets it, a
// woken park resumes an egress one (adoptOrphans).
func (c *channelComponent) Quiescent() error {
	if n := c.mux.Unacked(); n > 0 {
		return fmt.Errorf("channel: %d frames not yet acknowledged by the guest", n)
	}
	open := 0
	for _, st := range c.mux.Streams() {
		if _, ok := planeStream(st); !ok {
			open++
		}
	}
	if open > 0 {
		return fmt.Errorf("channel: %d streams open", open)
	}
	return nil
}

func (c *channelComponent) Save(snapshot.Kind) (json.RawMessage, error) {
	return c.mux.State().Marshal()
}

func (c *channelComponent) Restore(version int, data json.RawMessage) error {
	st, err := channel.UnmarshalState(data)
	if err != nil {
		return err
	}
	if st.Role != channel.Host {
		return fmt.Errorf("channel state is not a host half")
	}
	if c.newMux == nil {
		return nil // validation only
	}
	mux, err := c.newMux(st)
	if err != nil {
		return err
	}
	c.mux, c.restored = mux, mux
	return nil
}

// consoleComponent carries the console's screen across a capture. The
// serial console's picture lives on the host (a serial line has no video
// memory), so without it a fork's __screen__ would start blank while its
// guest sits at the prompt its base printed. The section holds the
// console's newest bytes (up to consoleSectionMax), replayed into the
// restored session's terminal before the guest resumes.
type consoleComponent struct {
	tail func() []byte    // the console's newest bytes; nil: nothing to save
	term func() io.Writer // where a restore replays them; nil: check only
}

// consoleSectionMax bounds the replayed bytes: a screen and a good part
// of its scrollback, and a hostile section costs no more than this.
const consoleSectionMax = 16 << 10

type consoleSection struct {
	Tail []byte `json:"tail"`
}

func (c *consoleComponent) Name() string     { return "console" }
func (c *consoleComponent) Version() int     { return 1 }
func (c *consoleComponent) Required() bool   { return false }
func (c *consoleComponent) Quiescent() error { return nil }
func (c *consoleComponent) Freeze()          {}
func (c *consoleComponent) Thaw()            {}

func (c *consoleComponent) Save(snapshot.Kind) (json.RawMessage, error) {
	var sec consoleSection
	if c.tail != nil {
		sec.Tail = c.tail()
		if len(sec.Tail) > consoleSectionMax {
			sec.Tail = sec.Tail[len(sec.Tail)-consoleSectionMax:]
		}
	}
	return json.Marshal(sec)
}

func (c *consoleComponent) Restore(version int, data json.RawMessage) error {
	if data == nil {
		return nil // an artifact from before the console was carried
	}
	var sec consoleSection
	if err := json.Unmarshal(data, &sec); err != nil {
		return fmt.Errorf("console section: %w", err)
	}
	if len(sec.Tail) > consoleSectionMax {
		return fmt.Errorf("console section holds %d bytes, over the %d a capture writes", len(sec.Tail), consoleSectionMax)
	}
	if c.term != nil {
		if w := c.term(); w != nil {
			w.Write(sec.Tail)
		}
	}
	return nil
}
