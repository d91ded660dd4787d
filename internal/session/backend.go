package session

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/nethersandbox/nether/internal/control"
	"github.com/nethersandbox/nether/internal/meter"
)

// The control server drives the session through these methods.
var _ control.Backend = (*Session)(nil)

// WaitAgent implements control.Backend.
func (s *Session) WaitAgent(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return s.namedAgentErr(s.agent.WaitUp(ctx))
}

// Exec implements control.Backend.
func (s *Session) Exec(ctx context.Context, command string) (control.Output, error) {
	return s.agent.Exec(ctx, command)
}

// Put implements control.Backend: the host file is opened inside the
// transfer jail and streamed; the agent renames it into place only when
// every byte arrived.
func (s *Session) Put(ctx context.Context, hostPath, guestPath string) (int64, error) {
	f, err := s.jail.OpenRead(hostPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if max := s.cfg.MaxTransferBytes; max > 0 && fi.Size() > max {
		return 0, fmt.Errorf("%s is %d bytes, over max_transfer_bytes=%d", hostPath, fi.Size(), max)
	}
	n, err := s.agent.Put(ctx, f, uint32(fi.Mode().Perm()), guestPath, s.cfg.MaxTransferBytes)
	if err != nil {
		return 0, err
	}
	s.meter.In(int(n))
	s.logLane("put", n)
	return n, nil
}

// Get implements control.Backend: bytes go to a temporary file in the
// jail that replaces the target only when the agent's declared length
// matches what arrived.
func (s *Session) Get(ctx context.Context, guestPath, hostPath string) (int64, error) {
	af, err := s.jail.Create(hostPath, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := s.agent.Get(ctx, guestPath, af, s.cfg.MaxTransferBytes)
	if err != nil {
		af.Abort()
		return 0, err
	}
	if err := af.Commit(); err != nil {
		return 0, err
	}
	s.meter.Out(int(n))
	s.logLane("get", n)
	return n, nil
}

// logLane says, at debug level, how much of the channel's traffic so far
// went through its bulk lane: how to tell a transfer used it.
func (s *Session) logLane(op string, n int64) {
	if !s.log.Enabled(context.Background(), slog.LevelDebug) || s.mux == nil {
		return
	}
	l := s.mux.LaneStats()
	s.log.Debug("transfer done", "op", op, "bytes", n, "lane_active", l.Active,
		"lane_batches_out", l.BatchesOut, "lane_bytes_out", l.BytesOut,
		"lane_batches_in", l.BatchesIn, "lane_bytes_in", l.BytesIn, "lane_refused", l.Refused)
}

// Shutdown implements control.Backend.
func (s *Session) Shutdown() { s.stop(meter.ReasonShutdown) }

// Info implements control.Backend. It is safe at any moment, including
// while the machine assembles.
func (s *Session) Info() string {
	v := s.getView()
	agent := "booting"
	select {
	case <-s.ready:
		select {
		case <-s.agent.Up():
			agent = "connected"
		default:
		}
	default:
	}
	backend := v.engine.Backend
	if backend == "" {
		backend = "-"
	}
	onOff := map[bool]string{true: "on", false: "off"}
	zeroOne := map[bool]int{true: 1, false: 0}
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	var b strings.Builder
	for _, kv := range [][2]any{
		{"proto_version", control.ProtoVersion},
		{"backend", backend},
		{"engine_version", dash(v.engine.Version)},
		{"machine", dash(v.engine.Machine)},
		{"accel", dash(string(v.accel))},
		{"arch", "x86_64"},
		{"cpus", s.cfg.CPUs},
		{"ram_mb", s.cfg.RAMMB},
		{"sandbox_id", dash(v.identity.SandboxID)},
		{"hostname", dash(v.identity.Hostname)},
		{"parent", dash(v.parent)},
		{"generation", v.identity.Generation},
		{"snapshot", dash(v.snapshot)},
		{"claimed", zeroOne[v.claimed]},
		{"net", onOff[s.cfg.Net]},
		{"firewall", onOff[s.cfg.Net && !s.cfg.NetOpen]},
		{"gpu", onOff[s.cfg.GPU]},
		{"run_as", orRoot(v.runAs)},
		{"disk", dash(v.disk)},
		{"data_plane", onOff[s.dataPlane()]},
		{"app_port", s.appPort},
		{"egress_plane", onOff[s.egressPlane()]},
		{"egress_port", s.egressPort},
		{"max_runtime_s", s.cfg.MaxRuntimeS},
		{"max_cpu_s", s.cfg.MaxCPUS},
		{"idle_timeout_s", s.cfg.IdleTimeoutS},
		{"net_rate_kbps", s.cfg.NetRateKbps},
		{"max_data_conns", s.cfg.MaxDataConns},
		{"data_idle_ms", s.cfg.DataIdleMS},
		{"data_rate_kbps", s.cfg.DataRateKbps},
		{"max_output_bytes", s.cfg.MaxOutputBytes},
		{"max_transfer_bytes", s.cfg.MaxTransferBytes},
		{"console_log_max_bytes", s.cfg.ConsoleLogMaxBytes},
		{"x402", onOff[s.cfg.X402]},
		{"agent", agent},
		{"node_id", dash(v.boot.nodeID)},
		{"boot_id", dash(v.boot.bootID)},
		{"plan_digest", dash(v.boot.planDigest)},
		{"session_epoch", s.sessionEpoch()},
	} {
		fmt.Fprintf(&b, "%s=%v\n", kv[0], kv[1])
	}
	return b.String()
}

func orRoot(user string) string {
	if user == "" {
		return "root"
	}
	return user
}

// sessionEpoch is the agent session's epoch in hex ("-" before the
// machine is installed): new at every restore and claim, so a parent and
// its fork never share one.
func (s *Session) sessionEpoch() string {
	select {
	case <-s.ready:
		return fmt.Sprintf("%016x", s.agent.Epoch())
	default:
		return "-"
	}
}
