package runner

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/conf"
)

// TestTextRoundTrips: the nether.conf Text writes is nether's canonical
// form of the settings, which nether's parser reads back to the same.
func TestTextRoundTrips(t *testing.T) {
	dir := t.TempDir()
	s := Settings{SandboxID: "01JX", Hostname: "web", CPUs: 2, RAMMB: 256, Net: true, NetAllow: "10.0.0.0/8, 192.168.0.0/16",
		AppPort: 8080, RunAs: "nether", Rootfs: RootfsBusybox, Disk: filepath.Join(dir, "disk.img"), DiskSizeMB: 32, NodeID: "node", BootID: "boot"}
	text, err := s.Text(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	c, err := conf.Parse(strings.NewReader(text), ConfFile, dir)
	if err != nil {
		t.Fatalf("nether refuses %q: %v", text, err)
	}
	if c.Format() != text {
		t.Errorf("not canonical:\n%s\nreads back as\n%s", text, c.Format())
	}
	if c.ControlSocket != filepath.Join(dir, ControlSocket) || c.DataSocket != filepath.Join(dir, DataSocket) || c.SecretsFD != 3 || c.CPUs != 2 || c.RunAs != "nether" {
		t.Errorf("nether reads %+v", c)
	}
}

// TestCheck: a setting nether refuses is named with its value, and a
// value that would end its line never reaches the file.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		s    Settings
		want string
	}{
		{Settings{RAMMB: 1}, "ram_mb 1: "},
		{Settings{RunAs: "nether\nrestore = 1"}, "control character"},
		{Settings{NetAllow: "nonsense"}, "net_allow nonsense"},
		{Settings{Hostname: "a b"}, "hostname"},
		{Settings{Rootfs: "rel.img"}, "want an absolute path"},
	} {
		err := tc.s.Check()
		var se *SettingError
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.s, err, tc.want)
		}
		if tc.want == "ram_mb 1: " && (!errors.As(err, &se) || se.Key != conf.KeyRAMMB) {
			t.Errorf("not a SettingError naming ram_mb: %#v", err)
		}
	}
}

// TestReplies: the typed replies are read from nether's reply lines, and
// refusals are classified by nether's words.
func TestReplies(t *testing.T) {
	c, err := parseCapture("OK snapshot snap-1 kind=base pause_ms=12 ram=sparse")
	if err != nil || c != (Capture{Path: "snap-1", Kind: "base", PauseMS: 12, RAM: "sparse"}) {
		t.Errorf("capture %+v, %v", c, err)
	}
	p, err := parseParked("OK parked park pause_ms=7 uptime_ms=5 cpu_ms=3")
	if err != nil || p.Path != "park" || p.PauseMS != 7 || p.Bill["uptime_ms"] != 5 || p.Bill["cpu_ms"] != 3 || len(p.Bill) != 2 {
		t.Errorf("parked %+v, %v", p, err)
	}
	if _, err := parseCapture("ERR no"); err == nil {
		t.Error("a reply that is no capture was taken for one")
	}
	if s := parseStats("OK uptime_ms=5 net_tx=12 net_rx=x data_conns=3"); s["net_tx"] != 12 || s["data_conns"] != 3 || len(s) != 3 {
		t.Errorf("parseStats = %v", s)
	}
	for msg, kind := range map[string]error{
		"guest not quiescent": ErrBusy, "open /x: no such file or directory": ErrNoPath, "/ro: read-only file system": ErrDenied,
		"/etc: is a directory": ErrNotFile, "over the transfer limit": ErrTooLarge} {
		if err := Refusal("__put__", msg); !errors.Is(err, kind) {
			t.Errorf("%q is not %v", msg, kind)
		}
	}
	if errors.Is(Refusal("__put__", "boom"), ErrBusy) {
		t.Error("an unknown refusal is busy")
	}
	if _, err := (ClaimRequest{SandboxID: "a", Hostname: "h", Token: "t x"}).line(); err == nil {
		t.Error("a claim token with a blank reached the control line")
	}
	if l, _ := (ClaimRequest{SandboxID: "a", Hostname: "h", NodeID: "n", BootID: "b", Token: "t"}).line(); l != "__claim__ a h node_id=n boot_id=b token=t" {
		t.Errorf("claim line %q", l)
	}
	if err := CheckGuestPath("/a b"); !errors.Is(err, ErrBadPath) {
		t.Errorf("a guest path with a blank: %v", err)
	}
}

// TestOutputs: a launch's final record and error are read after its mark.
func TestOutputs(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, Stdout), []byte("[nether] final usage (reason=shutdown): x=1\n"), 0o600)
	m := MarkOf(dir)
	if FinalSince(dir, m) != "" || FinalReason(FinalSince(dir, Mark{})) != "shutdown" {
		t.Errorf("final since the mark %q, before it %q", FinalSince(dir, m), FinalSince(dir, Mark{}))
	}
	os.WriteFile(filepath.Join(dir, Stderr), []byte("time=t level=ERROR msg=x err=\"bad \\\"disk\\\"\"\n"), 0o600)
	if got := WhySince(dir, m); got != `bad "disk"` {
		t.Errorf("why %q", got)
	}
}

// FuzzLogErr: any err value slog quotes comes back as it was, and no
// line makes logErr panic.
func FuzzLogErr(f *testing.F) {
	f.Add(`the disk /s/disk.img is not a usable ext4 file system: "x"`, "time=t level=ERROR msg=x err=\"unterminated")
	f.Add("", " err=")
	f.Add("\x00\xff\n\"", "level=ERROR err=plain more=1")
	f.Fuzz(func(t *testing.T, value, line string) {
		logErr(line)
		got, ok := logErr(`time=t level=ERROR msg="m" err=` + strconv.Quote(value) + " k=v")
		if !ok || got != value {
			t.Fatalf("logErr of a quoted %q: %q, %v", value, got, ok)
		}
	})
}
