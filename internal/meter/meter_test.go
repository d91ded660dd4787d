package meter

import (
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine"
)

func TestFinalLine(t *testing.T) {
	now := time.Unix(100, 0)
	m := New(func() time.Time { return now }, 512, 2)
	m.SetUsage(func() engine.Usage { return engine.Usage{CPU: 1500 * time.Millisecond, PeakRSS: 100<<20 + 1} })
	m.Command()
	m.In(10)
	m.Out(20)
	now = now.Add(2 * time.Second)
	r := m.Read()
	cases := []struct {
		name   string
		x402   bool
		reason string
		want   string
	}{
		{"general", false, ReasonShutdown, "[nether] final usage (reason=shutdown): uptime_ms=2000 cpu_ms=1500 mem_peak_mb=101 ram_mb=512 cpus=2 commands=1 bytes_in=10 bytes_out=20 net_tx=0 net_rx=0 net_blocked=0"},
		{"settlement", true, ReasonSIGTERM, "[nether] x402 settlement (reason=sigterm): uptime_ms=2000 cpu_ms=1500 mem_peak_mb=101 ram_mb=512 cpus=2 commands=1 bytes_in=10 bytes_out=20 net_tx=0 net_rx=0 net_blocked=0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := FinalLine(c.reason, c.x402, r); got != c.want {
				t.Fatalf("got  %s\nwant %s", got, c.want)
			}
		})
	}
	for _, k := range []string{"uptime_ms=2000", "cpu_ms=1500", "commands=1", "bytes_in=10", "bytes_out=20", "net_blocked=0"} {
		if !strings.Contains(r.Stats(), k+"\n") {
			t.Errorf("stats lacks %s:\n%s", k, r.Stats())
		}
	}
}
