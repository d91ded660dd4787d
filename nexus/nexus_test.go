package nexus

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
)

// TestSettle: a sandbox whose nether ended takes the state its final
// record says.
func TestSettle(t *testing.T) {
	for _, tc := range []struct {
		name, out string
		park      bool
		want      lifecycle.State
		reason    string
	}{
		{"shutdown", "[nether] final usage (reason=shutdown): uptime_ms=1", false, lifecycle.Stopped, ""},
		{"a budget", "log line\n[nether] final usage (reason=idle): uptime_ms=1\n", false, lifecycle.Stopped, ""},
		{"parked", "[nether] final usage (reason=park): uptime_ms=1", true, lifecycle.Paused, ""},
		{"parked, park gone", "[nether] final usage (reason=park): uptime_ms=1", false, lifecycle.Error, "park is missing"},
		{"engine failed", "[nether] final usage (reason=error): uptime_ms=1", false, lifecycle.Error, "reason=error"},
		{"guest panic", "[nether] x402 settlement (reason=guest_panic): uptime_ms=1", false, lifecycle.Error, "reason=guest_panic"},
		{"killed", "", false, lifecycle.Error, "without a final record"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &Nexus{dir: t.TempDir()}
			sb := &store.Sandbox{ID: "01JTEST", State: lifecycle.Running, PID: 42}
			dir := n.sandboxDir(sb.ID)
			os.MkdirAll(dir, 0o700)
			os.WriteFile(filepath.Join(dir, outFile), []byte(tc.out), 0o600)
			if tc.park {
				os.Mkdir(filepath.Join(dir, parkName), 0o700)
			}
			n.settle(sb)
			if sb.State != tc.want || !strings.Contains(sb.Reason, tc.reason) || sb.PID != 0 {
				t.Fatalf("settled to %s (%q, pid %d), want %s (%q)", sb.State, sb.Reason, sb.PID, tc.want, tc.reason)
			}
		})
	}
}

func TestChildNames(t *testing.T) {
	for _, tc := range []struct {
		names []string
		n     int
		want  string
		err   string
	}{
		{nil, 3, ",,", ""},
		{[]string{"kid"}, 1, "kid", ""},
		{[]string{"kid"}, 3, "kid-1,kid-2,kid-3", ""},
		{[]string{"a", "b"}, 2, "a,b", ""},
		{[]string{"a", "b"}, 3, "", "2 names for 3 children"},
		{[]string{"-x"}, 1, "", "not first"},
		{[]string{"a/b"}, 1, "", "use letters"},
	} {
		got, err := childNames(tc.names, tc.n)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("childNames(%v, %d) = %v, want error %q", tc.names, tc.n, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("childNames(%v, %d) = %v, %v; want %s", tc.names, tc.n, got, err, tc.want)
		}
	}
}

func TestHostnameFor(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"web", "web"},
		{"my_box", "sandbox-cdefghjk"}, // '_' is not in a DNS label
		{"", "sandbox-cdefghjk"},
	} {
		sb := &store.Sandbox{ID: "01JABCDEFGHJK0123456CDEFGHJK", Name: tc.name}
		if got := hostnameFor(sb); got != tc.want {
			t.Errorf("hostnameFor(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestConfText: what nexus hands nether is what nether's own parser
// accepts, with the settings given.
func TestConfText(t *testing.T) {
	n := &Nexus{dir: "/var/lib/nexus"}
	sb := &store.Sandbox{ID: "01JABCDEFGHJK0123456CDEFGHJK", Hostname: "web",
		Config: store.Config{CPUs: 2, RAMMB: 256, Net: true, NetAllow: "10.0.0.0/8, 192.168.0.0/16", MaxRuntimeS: 60, AppPort: 8080}}
	text := n.confText(sb, "/var/lib/nexus/snapshots/X")
	for _, want := range []string{"cpus = 2\n", "ram_mb = 256\n", "net = 1\n", "net_allow = 10.0.0.0/8, 192.168.0.0/16\n",
		"max_runtime_s = 60\n", "app_port = 8080\n", "restore = 1\n", "restore_from = /var/lib/nexus/snapshots/X\n",
		"sandbox_id = 01JABCDEFGHJK0123456CDEFGHJK\n", "hostname = web\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("nether.conf lacks %q:\n%s", want, text)
		}
	}
	if err := checkConfig(sb.Config); err != nil {
		t.Errorf("checkConfig: %v", err)
	}
	if err := checkConfig(store.Config{RAMMB: 1}); err == nil || !strings.Contains(err.Error(), "ram_mb") {
		t.Errorf("a RAM size nether refuses: %v", err)
	}
}

func TestCapBuffer(t *testing.T) {
	var c capBuffer
	chunk := strings.Repeat("x", 1<<20)
	for range 20 {
		if n, err := c.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write: %d %v; it must take everything so the reply is read to its end", n, err)
		}
	}
	if len(c.b) != MaxBufferedOutput || !c.truncated {
		t.Fatalf("kept %d, truncated %v; want %d, true", len(c.b), c.truncated, MaxBufferedOutput)
	}
}
