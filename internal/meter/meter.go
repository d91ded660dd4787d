// Package meter keeps a session's usage and renders the usage reports:
// __stats__ and the final usage record a platform bills from.
package meter

import (
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nethersandbox/nether/internal/engine"
)

// Meter counts one session. A restored fork is a new session with its own
// Meter.
type Meter struct {
	start    time.Time
	now      func() time.Time
	ramMB    int
	cpus     int
	usage    atomic.Pointer[func() engine.Usage]
	cpu      atomic.Pointer[func() time.Duration]
	net      atomic.Pointer[func() Net]
	planes   atomic.Pointer[func() Planes]
	commands atomic.Uint64
	bytesIn  atomic.Uint64
	bytesOut atomic.Uint64
	final    atomic.Pointer[Record] // set by Settle
}

// New starts a meter at now().
func New(now func() time.Time, ramMB, cpus int) *Meter {
	if now == nil {
		now = time.Now
	}
	return &Meter{start: now(), now: now, ramMB: ramMB, cpus: cpus}
}

// SetUsage gives the meter the engine's usage source once it exists,
// and cpu, a cheaper reading of its CPU time alone (nil: Usage's).
func (m *Meter) SetUsage(f func() engine.Usage, cpu func() time.Duration) {
	if cpu == nil {
		cpu = func() time.Duration { return f().CPU }
	}
	m.cpu.Store(&cpu)
	m.usage.Store(&f)
}

// Elapsed is the time since the session began: the clock of the
// session's logs.
func (m *Meter) Elapsed() time.Duration { return m.now().Sub(m.start) }

// CPU is the guest's host CPU time so far (0 before the engine runs).
func (m *Meter) CPU() time.Duration {
	if f := m.cpu.Load(); f != nil {
		return (*f)()
	}
	return 0
}

// Start is when the session began.
func (m *Meter) Start() time.Time { return m.start }

// Command counts one command that reached the guest.
func (m *Meter) Command() { m.commands.Add(1) }

// In counts bytes received from clients (command lines and uploaded files).
func (m *Meter) In(n int) { m.bytesIn.Add(uint64(n)) }

// Out counts bytes sent to clients (replies and downloaded files).
func (m *Meter) Out(n int) { m.bytesOut.Add(uint64(n)) }

// Net is a reading of the guest's network: payload bytes the guest sent
// out (Tx) and received (Rx) through nether's NAT, and the connection
// attempts the firewall or a cap refused (Blocked).
type Net struct {
	Tx, Rx, Blocked uint64
}

// SetNet gives the meter the network stack's counters once it exists. A
// session without networking never calls it, and reports zeros.
func (m *Meter) SetNet(f func() Net) { m.net.Store(&f) }

// Planes is a reading of the data and egress planes: the connections
// they bridged and the milliseconds those were open, summed. Their bytes
// count in BytesIn and BytesOut with every other byte of the platform's.
type Planes struct {
	Conns, MS uint64
}

// SetPlanes gives the meter the planes' counters.
func (m *Meter) SetPlanes(f func() Planes) { m.planes.Store(&f) }

// Record is one reading of every metered field.
type Record struct {
	UptimeMS  int64
	CPUMS     int64
	MemPeakMB int64
	RAMMB     int
	CPUs      int
	Commands  uint64
	BytesIn   uint64
	BytesOut  uint64
	Net       Net
	Planes    Planes
}

// Settle takes the session's last reading and keeps it: every later Read
// returns the same figures. A park bills in its reply, and the final
// record of the same session must carry the same bill, whatever the
// teardown after it costs.
func (m *Meter) Settle() Record {
	r := m.Read()
	if m.final.CompareAndSwap(nil, &r) {
		return r
	}
	return *m.final.Load()
}

// Read takes a reading (the settled one, once the meter is settled).
func (m *Meter) Read() Record {
	if f := m.final.Load(); f != nil {
		return *f
	}
	r := Record{
		UptimeMS: m.now().Sub(m.start).Milliseconds(),
		RAMMB:    m.ramMB,
		CPUs:     m.cpus,
		Commands: m.commands.Load(),
		BytesIn:  m.bytesIn.Load(),
		BytesOut: m.bytesOut.Load(),
	}
	if f := m.usage.Load(); f != nil {
		u := (*f)()
		r.CPUMS = u.CPU.Milliseconds()
		r.MemPeakMB = (u.PeakRSS + (1<<20 - 1)) >> 20
	}
	if f := m.net.Load(); f != nil {
		r.Net = (*f)()
	}
	if f := m.planes.Load(); f != nil {
		r.Planes = (*f)()
	}
	return r
}

// Stats renders the __stats__ report body: one key=value per line.
func (r Record) Stats() string {
	var b strings.Builder
	for _, kv := range [][2]any{
		{"uptime_ms", r.UptimeMS}, {"cpu_ms", r.CPUMS}, {"mem_peak_mb", r.MemPeakMB},
		{"ram_mb", r.RAMMB}, {"cpus", r.CPUs}, {"commands", r.Commands},
		{"bytes_in", r.BytesIn}, {"bytes_out", r.BytesOut},
		{"net_tx_bytes", r.Net.Tx}, {"net_rx_bytes", r.Net.Rx}, {"net_blocked", r.Net.Blocked},
		{"data_conns", r.Planes.Conns}, {"data_ms", r.Planes.MS},
	} {
		fmt.Fprintf(&b, "%s=%v\n", kv[0], kv[1])
	}
	return b.String()
}

// Fields renders the record's fields on one line, as the final usage
// record carries them.
func (r Record) Fields() string {
	return fmt.Sprintf("uptime_ms=%d cpu_ms=%d mem_peak_mb=%d ram_mb=%d cpus=%d commands=%d bytes_in=%d bytes_out=%d net_tx=%d net_rx=%d net_blocked=%d data_conns=%d data_ms=%d",
		r.UptimeMS, r.CPUMS, r.MemPeakMB, r.RAMMB, r.CPUs, r.Commands, r.BytesIn, r.BytesOut, r.Net.Tx, r.Net.Rx, r.Net.Blocked, r.Planes.Conns, r.Planes.MS)
}

// Stop reasons in the final record.
const (
	ReasonShutdown = "shutdown" // __shutdown__
	ReasonPoweroff = "poweroff" // the guest powered itself off
	ReasonSIGTERM  = "sigterm"
	ReasonSIGINT   = "sigint"
	ReasonError    = "error" // the engine failed
	ReasonPark     = "park"
	// The guest ended without asking to: its kernel panicked, or it reset
	// itself (our guests never reboot on purpose: an init that dies makes
	// the kernel panic, and panic=-1 turns that into a reset).
	ReasonGuestPanic = "guest_panic"
	ReasonGuestCrash = "guest_crash"
	// A budget of nether.conf ran out: max_runtime_s, max_cpu_s,
	// idle_timeout_s.
	ReasonMaxRuntime = "max_runtime"
	ReasonMaxCPU     = "max_cpu"
	ReasonIdle       = "idle"
)

// FinalLine is the one record every stop prints. x402 changes only its
// prefix: the settlement mode is a framing, not a different meter.
func FinalLine(reason string, x402 bool, r Record) string {
	kind := "final usage"
	if x402 {
		kind = "x402 settlement"
	}
	return fmt.Sprintf("[nether] %s (reason=%s): %s", kind, reason, r.Fields())
}
