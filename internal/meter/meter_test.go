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
	m.SetUsage(func() engine.Usage { return engine.Usage{CPU: 1500 * time.Millisecond, PeakRSS: 100<<20 + 1} }, nil)
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
		{"general", false, ReasonShutdown, "[nether] final usage (reason=shutdown): uptime_ms=2000 cpu_ms=1500 mem_peak_mb=101 ram_mb=512 cpus=2 commands=1 bytes_in=10 bytes_out=20 net_tx=0 net_rx=0 net_blocked=0 data_conns=0 data_ms=0"},
		{"settlement", true, ReasonSIGTERM, "[nether] x402 settlement (reason=sigterm): uptime_ms=2000 cpu_ms=1500 mem_peak_mb=101 ram_mb=512 cpus=2 commands=1 bytes_in=10 bytes_out=20 net_tx=0 net_rx=0 net_blocked=0 data_conns=0 data_ms=0"},
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

// TestStats pins the whole __stats__ body, network counters included:
// the control protocol lists every key, so a platform may parse any.
func TestStats(t *testing.T) {
	tests := []struct {
		name string
		r    Record
		want string
	}{
		{"zero", Record{}, "uptime_ms=0\ncpu_ms=0\nmem_peak_mb=0\nram_mb=0\ncpus=0\ncommands=0\nbytes_in=0\nbytes_out=0\nnet_tx_bytes=0\nnet_rx_bytes=0\nnet_blocked=0\ndata_conns=0\ndata_ms=0\n"},
		{"every field", Record{UptimeMS: 1, CPUMS: 2, MemPeakMB: 3, RAMMB: 4, CPUs: 5, Commands: 6, BytesIn: 7, BytesOut: 8},
			"uptime_ms=1\ncpu_ms=2\nmem_peak_mb=3\nram_mb=4\ncpus=5\ncommands=6\nbytes_in=7\nbytes_out=8\nnet_tx_bytes=0\nnet_rx_bytes=0\nnet_blocked=0\ndata_conns=0\ndata_ms=0\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Stats(); got != tt.want {
				t.Fatalf("Stats =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestRead checks what a reading takes from the engine's usage source:
// nothing before there is one, and peak RSS rounded up to whole MiB.
func TestRead(t *testing.T) {
	tests := []struct {
		name      string
		usage     *engine.Usage // nil: no source set
		wantCPU   int64
		wantPeakM int64
	}{
		{"no usage source yet", nil, 0, 0},
		{"zero usage", &engine.Usage{}, 0, 0},
		{"one byte is a MiB", &engine.Usage{PeakRSS: 1}, 0, 1},
		{"exactly one MiB", &engine.Usage{CPU: 999 * time.Microsecond, PeakRSS: 1 << 20}, 0, 1},
		{"a byte over", &engine.Usage{CPU: time.Second, PeakRSS: 1<<20 + 1}, 1000, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New(func() time.Time { return time.Unix(0, 0) }, 256, 1)
			if tt.usage != nil {
				u := *tt.usage
				m.SetUsage(func() engine.Usage { return u }, nil)
			}
			r := m.Read()
			if r.CPUMS != tt.wantCPU || r.MemPeakMB != tt.wantPeakM || r.RAMMB != 256 || r.CPUs != 1 {
				t.Fatalf("Read = %+v, want cpu_ms %d, mem_peak_mb %d, ram_mb 256, cpus 1", r, tt.wantCPU, tt.wantPeakM)
			}
		})
	}
}

// TestSettle: once settled, every reading is the settled one.
func TestSettle(t *testing.T) {
	now := time.Unix(0, 0)
	m := New(func() time.Time { return now }, 512, 1)
	m.Command()
	now = now.Add(time.Second)
	bill := m.Settle()
	now = now.Add(time.Hour)
	m.Out(100)
	m.Command()
	if got := m.Read(); got != bill || got.UptimeMS != 1000 || got.Commands != 1 {
		t.Fatalf("after Settle: %+v, want %+v", got, bill)
	}
	if again := m.Settle(); again != bill {
		t.Fatalf("a second Settle changed the bill: %+v", again)
	}
}

func TestCPU(t *testing.T) {
	m := New(nil, 512, 1)
	if got := m.CPU(); got != 0 {
		t.Fatalf("CPU before the engine runs = %v, want 0", got)
	}
	m.SetUsage(func() engine.Usage { return engine.Usage{CPU: time.Second} }, nil)
	if got := m.CPU(); got != time.Second {
		t.Fatalf("CPU from Usage = %v, want 1s", got)
	}
	m.SetUsage(func() engine.Usage { return engine.Usage{CPU: time.Second} }, func() time.Duration { return 1234 * time.Microsecond })
	if got := m.CPU(); got != 1234*time.Microsecond {
		t.Fatalf("CPU from the cheap reading = %v, want 1.234ms", got)
	}
}

func TestNetCounters(t *testing.T) {
	m := New(nil, 512, 1)
	if r := m.Read(); !strings.Contains(r.Fields(), "net_tx=0 net_rx=0 net_blocked=0") || !strings.Contains(r.Stats(), "net_blocked=0\n") {
		t.Fatalf("without a network: %s / %s", r.Fields(), r.Stats())
	}
	m.SetNet(func() Net { return Net{Tx: 100, Rx: 2000, Blocked: 3} })
	r := m.Read()
	if !strings.Contains(r.Fields(), " net_tx=100 net_rx=2000 net_blocked=3 ") {
		t.Errorf("Fields() = %s", r.Fields())
	}
	for _, want := range []string{"net_tx_bytes=100\n", "net_rx_bytes=2000\n", "net_blocked=3\n"} {
		if !strings.Contains(r.Stats(), want) {
			t.Errorf("Stats() has no %q:\n%s", want, r.Stats())
		}
	}
	// A settled bill keeps its network figures.
	m.Settle()
	m.SetNet(func() Net { return Net{Tx: 1 << 40} })
	if got := m.Read().Net; got != (Net{Tx: 100, Rx: 2000, Blocked: 3}) {
		t.Errorf("after Settle: %+v", got)
	}
}

func TestPlaneCounters(t *testing.T) {
	m := New(nil, 512, 1)
	if r := m.Read(); !strings.HasSuffix(r.Fields(), " data_conns=0 data_ms=0") {
		t.Fatalf("without planes: %s", r.Fields())
	}
	m.SetPlanes(func() Planes { return Planes{Conns: 7, MS: 1234} })
	r := m.Read()
	if !strings.HasSuffix(r.Fields(), " data_conns=7 data_ms=1234") {
		t.Errorf("Fields() = %s", r.Fields())
	}
	for _, want := range []string{"data_conns=7\n", "data_ms=1234\n"} {
		if !strings.Contains(r.Stats(), want) {
			t.Errorf("Stats() has no %q:\n%s", want, r.Stats())
		}
	}
}
