package nexus

import (
	"context"
	"strconv"
	"strings"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/runner"
)

// Detail is one sandbox as `inspect` shows it: the record, what it runs
// with, where to reach it, and how its last session ended, decoded.
type Detail struct {
	*Sandbox
	// Settings are what its nether runs with: the record's config with
	// nether's defaults filled in (a sandbox created with no settings
	// runs with 1 CPU and 512 MiB, which config alone does not say).
	Settings Config `json:"settings"`
	// ControlSocket is its nether's control socket, while it runs.
	ControlSocket string `json:"control_socket,omitempty"`
	// DataSocket is the data plane's Unix listener (with app_port): each
	// connection to it reaches the guest's 127.0.0.1:<app_port>.
	DataSocket string `json:"data_socket,omitempty"`
	// LastStop is how its last session ended, from its final record.
	LastStop *Stop `json:"last_stop,omitempty"`
}

// Stop is a session's final usage record, decoded.
type Stop struct {
	// Reason is nether's: shutdown, park, max_runtime, idle, guest_panic,
	// error, ... (README, "the reasons").
	Reason string `json:"reason"`
	// Exit is the status nether exited with for that reason: 0 for an
	// orderly end, 1 for a failure.
	Exit int `json:"exit"`
	// Usage is the record's figures by name (uptime_ms, cpu_ms,
	// mem_peak_mb, commands, bytes_in, ...).
	Usage map[string]int64 `json:"usage"`
}

// ParseFinal decodes a final usage record line ("[nether] final usage
// (reason=shutdown): uptime_ms=3183 ..."); nil when line is not one.
func ParseFinal(line string) *Stop {
	reason := runner.FinalReason(line)
	_, fields, ok := strings.Cut(line, "):")
	if reason == "" || !ok {
		return nil
	}
	st := &Stop{Reason: reason, Usage: map[string]int64{}}
	if runner.FailedReason(reason) {
		st.Exit = 1
	}
	for _, f := range strings.Fields(fields) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			st.Usage[k] = n
		}
	}
	return st
}

// Describe returns sb as inspect shows it.
func (n *Nexus) Describe(sb *Sandbox) Detail {
	d := Detail{Sandbox: sb, Settings: effective(sb.Config), LastStop: ParseFinal(sb.Final)}
	if sb.State == lifecycle.Running {
		d.ControlSocket = n.controlSocket(sb)
	}
	if sb.Config.AppPort > 0 {
		d.DataSocket = n.dataSocket(sb)
	}
	return d
}

// InspectDetail is Inspect, described.
func (n *Nexus) InspectDetail(ctx context.Context, ref string) (Detail, error) {
	sb, err := n.Inspect(ctx, ref)
	if err != nil {
		return Detail{}, err
	}
	return n.Describe(sb), nil
}

// effective fills in nether's defaults for what c leaves unset.
func effective(c Config) Config {
	d := runner.Defaults
	if c.CPUs == 0 {
		c.CPUs = d.CPUs
	}
	if c.RAMMB == 0 {
		c.RAMMB = d.RAMMB
	}
	if c.RunAs == "" {
		c.RunAs = "root"
	}
	return c
}
