package nexus

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
	"github.com/nethersandbox/nether/runner"
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
			n := &Nexus{dir: t.TempDir(), run: &runner.Local{}}
			sb := &store.Sandbox{ID: "01JTEST", State: lifecycle.Running, PID: 42}
			dir := n.sandboxDir(sb.ID)
			os.MkdirAll(dir, 0o700)
			os.WriteFile(filepath.Join(dir, runner.Stdout), []byte(tc.out), 0o600)
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
	got, text := confValues(t, n, sb, "/var/lib/nexus/snapshots/X")
	for k, want := range map[string]string{"cpus": "2", "ram_mb": "256", "net": "1", "net_allow": "10.0.0.0/8, 192.168.0.0/16",
		"max_runtime_s": "60", "app_port": "8080", "restore": "1", "restore_from": "/var/lib/nexus/snapshots/X",
		"sandbox_id": "01JABCDEFGHJK0123456CDEFGHJK", "hostname": "web",
		"control_socket": "/var/lib/nexus/sandboxes/01JABCDEFGHJK0123456CDEFGHJK/ctl.sock"} {
		if got[k] != want {
			t.Errorf("nether reads %s = %q, want %q:\n%s", k, got[k], want, text)
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

// TestEndedWhileStarting: a launch whose nether ended is told by what
// that nether wrote, not by an earlier session's lines in the same files:
// its final record, and its last logged error (the err= of slog's line,
// unquoted).
func TestEndedWhileStarting(t *testing.T) {
	const (
		earlierOut = "[nether] final usage (reason=shutdown): uptime_ms=9\n"
		earlierLog = "time=t level=ERROR msg=\"an earlier session's\" err=old\n"
	)
	for _, tc := range []struct {
		name, out, log string
		failed         bool
		cause, err     string
	}{
		{"a disk the guest cannot use",
			"[nether] final usage (reason=error): uptime_ms=1\n",
			"time=t level=INFO msg=\"guest starting\"\ntime=t level=ERROR msg=\"nether stopped on an error\" err=\"the disk /s/disk.img is not a usable ext4 file system: the guest's kernel would not mount it (invalid argument): EXT4-fs (vdb): \\\"bad\\\" geometry\"\n",
			true, `the disk /s/disk.img is not a usable ext4 file system: the guest's kernel would not mount it (invalid argument): EXT4-fs (vdb): "bad" geometry`,
			`sandbox sb: its nether ended while starting (reason=error): the disk /s/disk.img is not`},
		{"an unquoted err", "[nether] final usage (reason=guest_panic): uptime_ms=1\n", "time=t level=ERROR msg=x err=panicked other=1\n",
			true, "panicked", "(reason=guest_panic): panicked"},
		{"an error line without err=", "", "time=t level=ERROR msg=\"no err\"\n",
			false, `time=t level=ERROR msg="no err"`, "sandbox sb: its nether ended while starting: time=t"},
		{"nether's own words", "", "nether: nether.conf:2: ram_mb: \"lots\" is not a whole number\n",
			false, `nether: nether.conf:2: ram_mb: "lots" is not a whole number`, "while starting: nether: nether.conf:2"},
		{"a stop, not a failure", "[nether] final usage (reason=sigterm): uptime_ms=1\n", "",
			false, "see ", "(reason=sigterm): see "},
		{"a malformed quote", "", "time=t level=ERROR msg=x err=\"unterminated\n",
			false, `time=t level=ERROR msg=x err="unterminated`, "while starting"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			os.WriteFile(filepath.Join(dir, runner.Stdout), []byte(earlierOut), 0o600)
			os.WriteFile(filepath.Join(dir, runner.Stderr), []byte(earlierLog), 0o600)
			from := runner.MarkOf(dir)
			appendTo(t, filepath.Join(dir, runner.Stdout), tc.out)
			appendTo(t, filepath.Join(dir, runner.Stderr), tc.log)
			e := &EndedError{Sandbox: "sb", Final: runner.FinalSince(dir, from), Cause: runner.WhySince(dir, from)}
			if e.Failed() != tc.failed || !strings.HasPrefix(e.Cause, tc.cause) || !strings.Contains(e.Error(), tc.err) {
				t.Fatalf("failed %v, cause %q, error %q; want %v, %q, %q", e.Failed(), e.Cause, e.Error(), tc.failed, tc.cause, tc.err)
			}
		})
	}
}

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// confValues are the settings nether reads from the nether.conf of sb's
// session (restoreFrom "" boots), by key, for the keys the file sets;
// and the text.
func confValues(t *testing.T, n *Nexus, sb *Sandbox, restoreFrom string) (map[string]string, string) {
	t.Helper()
	dir := n.sandboxDir(sb.ID)
	text, err := n.settingsFor(sb, restoreFrom).Text(dir, false)
	if err != nil {
		t.Fatalf("nexus writes no nether.conf: %v", err)
	}
	c, err := conf.Parse(strings.NewReader(text), conf.FileName, dir)
	if err != nil {
		t.Fatalf("nether refuses what nexus wrote: %v\n%s", err, text)
	}
	got := map[string]string{}
	for _, kv := range c.Report() {
		k, v, _ := strings.Cut(kv, "=")
		if _, set := c.Set[k]; set {
			got[k] = v
		}
	}
	return got, text
}
