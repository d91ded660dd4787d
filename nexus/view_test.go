package nexus

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/nethersandbox/nether/nexus/lifecycle"
)

func TestParseFinal(t *testing.T) {
	for _, tc := range []struct {
		line string
		want *Stop
	}{
		{"[nether] final usage (reason=max_runtime): uptime_ms=5003 cpu_ms=4100 mem_peak_mb=260 ram_mb=512 cpus=1 commands=2",
			&Stop{Reason: "max_runtime", Usage: map[string]int64{"uptime_ms": 5003, "cpu_ms": 4100, "mem_peak_mb": 260, "ram_mb": 512, "cpus": 1, "commands": 2}}},
		{"[nether] final usage (reason=guest_panic): uptime_ms=9", &Stop{Reason: "guest_panic", Exit: 1, Usage: map[string]int64{"uptime_ms": 9}}},
		{"[nether] x402 settlement (reason=park): uptime_ms=1 odd", &Stop{Reason: "park", Usage: map[string]int64{"uptime_ms": 1}}},
		{"", nil},
		{"[nether] final usage: no reason", nil},
		{"(reason=", nil},
	} {
		t.Run(tc.line, func(t *testing.T) {
			if got := ParseFinal(tc.line); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ParseFinal = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestDescribe: inspect's view says what a sandbox runs with (nether's
// defaults filled in), where its sockets are, and why it last stopped.
func TestDescribe(t *testing.T) {
	n := &Nexus{dir: t.TempDir()}
	stopped := &Sandbox{ID: "01JSTOPPEDSTOPPEDSTOPPEDST", State: lifecycle.Stopped,
		Final: "[nether] final usage (reason=max_runtime): uptime_ms=5003 cpu_ms=4100"}
	d := n.Describe(stopped)
	if d.Settings.CPUs != 1 || d.Settings.RAMMB != 512 || d.Settings.RunAs != "root" {
		t.Errorf("settings of a sandbox made with defaults: %+v", d.Settings)
	}
	if d.ControlSocket != "" || d.DataSocket != "" {
		t.Errorf("a stopped sandbox without app_port names sockets: %+v", d)
	}
	if d.LastStop == nil || d.LastStop.Reason != "max_runtime" || d.LastStop.Usage["uptime_ms"] != 5003 {
		t.Errorf("last stop %+v", d.LastStop)
	}
	web := &Sandbox{ID: "01JWEBWEBWEBWEBWEBWEBWEBWE", State: lifecycle.Running, Config: Config{CPUs: 2, RAMMB: 256, AppPort: 8000}}
	d = n.Describe(web)
	if d.Settings.CPUs != 2 || d.Settings.RAMMB != 256 || d.Config.RunAs != "" {
		t.Errorf("settings %+v (config %+v)", d.Settings, d.Config)
	}
	if d.ControlSocket != filepath.Join(n.sandboxDir(web.ID), "ctl.sock") || d.DataSocket != filepath.Join(n.sandboxDir(web.ID), "data.sock") {
		t.Errorf("sockets %q %q", d.ControlSocket, d.DataSocket)
	}
}
