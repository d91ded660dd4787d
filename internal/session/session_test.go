package session

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

// These tests run whole sessions against the fake engine: the real
// control server, channel, agent client, capture and restore paths, with
// an in-memory guest. They run under -race in CI.

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	// slog's text handler escapes quotes inside values.
	return strings.ReplaceAll(l.b.String(), `\"`, `"`)
}

// sandbox is one session under test.
type sandbox struct {
	t     *testing.T
	dir   string
	sock  string
	sigs  chan os.Signal
	out   *lockedBuffer
	logs  *lockedBuffer
	exit  chan int
	code  int
	ended bool
	eng   *fake.Engine
}

// guestFiles are the stand-in kernel and image every test sandbox boots,
// and beside them a stand-in root image (rootfs.img: an erofs superblock
// magic and nothing else).
func guestFiles(t *testing.T) (kernel, image string) {
	dir := t.TempDir()
	kernel, image = filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initramfs.cpio")
	os.WriteFile(kernel, []byte("fake kernel"), 0o644)
	os.WriteFile(image, []byte("fake image"), 0o644)
	os.WriteFile(filepath.Join(dir, RootImageFile), fakeErofs("fake root"), 0o644)
	return kernel, image
}

// fakeErofs is a file an erofs superblock's magic makes a root image.
func fakeErofs(tail string) []byte {
	b := make([]byte, 2048)
	binary.LittleEndian.PutUint32(b[1024:], 0xE0F5E1E2)
	return append(b, tail...)
}

// start runs a session in dir (made if "") with nether.conf = the
// control socket, the fake guest files and extra.
func start(t *testing.T, eng *fake.Engine, dir, extra string, tweak ...func(*Options)) *sandbox {
	t.Helper()
	if dir == "" {
		var err error
		// Short: a Unix socket path has a 108-byte limit.
		if dir, err = os.MkdirTemp("", "nst-"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	kernel, image := guestFiles(t)
	sock := filepath.Join(dir, "ctl.sock")
	rootfs := "rootfs = " + filepath.Join(filepath.Dir(image), RootImageFile) + "\n"
	if strings.HasPrefix(extra, "rootfs =") || strings.Contains(extra, "\nrootfs =") {
		rootfs = "" // the test's own
	}
	text := fmt.Sprintf("control_socket = %s\naccel = tcg\nkernel = %s\nimage = %s\n%s%s", sock, kernel, image, rootfs, extra)
	if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := conf.Load(dir)
	if err != nil {
		t.Fatalf("nether.conf: %v", err)
	}
	sb := &sandbox{t: t, dir: dir, sock: sock, sigs: make(chan os.Signal, 1), out: &lockedBuffer{}, logs: &lockedBuffer{}, exit: make(chan int, 1), eng: eng}
	opt := Options{
		Config: cfg, Engine: eng, Stdout: sb.out, Signals: sb.sigs, TempDir: t.TempDir(),
		Log:              slog.New(slog.NewTextHandler(io.MultiWriter(sb.logs, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug})),
		HandshakeTimeout: 5 * time.Second, PowerOffWait: 500 * time.Millisecond,
	}
	for _, f := range tweak {
		f(&opt)
	}
	go func() { sb.exit <- Run(opt) }()
	t.Cleanup(func() {
		if !sb.ended {
			sb.sigs <- syscall.SIGTERM
			sb.wait(10 * time.Second)
		}
	})
	return sb
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// dial connects, retrying while the socket appears.
func (sb *sandbox) dial() *client.Client {
	sb.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := client.Dial(ctx, sb.sock)
		cancel()
		if err == nil {
			sb.t.Cleanup(func() { c.Close() })
			return c
		}
		if time.Now().After(deadline) {
			sb.t.Fatalf("dialing %s: %v", sb.sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// run sends a command and returns its output and exit code.
func run(t *testing.T, c *client.Client, line string) (string, int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out bytes.Buffer
	exit, err := c.Run(ctx, line, &out)
	return out.String(), exit, err
}

func mustRun(t *testing.T, c *client.Client, line string) string {
	t.Helper()
	out, exit, err := run(t, c, line)
	if err != nil || exit != 0 {
		t.Fatalf("%s: exit %d, err %v, output %q", line, exit, err, out)
	}
	return out
}

func infoOf(t *testing.T, c *client.Client) map[string]string {
	t.Helper()
	body := mustRun(t, c, "__info__")
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(body), "\n") {
		k, v, _ := strings.Cut(line, "=")
		m[k] = v
	}
	return m
}

// wait waits for the session to end and checks it printed exactly one
// final record.
func (sb *sandbox) wait(limit time.Duration) (code int, reason string) {
	sb.t.Helper()
	if !sb.ended {
		select {
		case sb.code = <-sb.exit:
			sb.ended = true
		case <-time.After(limit):
			sb.t.Fatalf("the session did not end within %s", limit)
		}
	}
	re := regexp.MustCompile(`\[nether\] final usage \(reason=([a-z_]+)\)`)
	all := re.FindAllStringSubmatch(sb.out.String(), -1)
	if len(all) != 1 {
		sb.t.Fatalf("want exactly one final record, got %d in %q", len(all), sb.out.String())
	}
	return sb.code, all[0][1]
}

func (sb *sandbox) expectEnd(limit time.Duration, wantCode int, wantReason string) {
	sb.t.Helper()
	start := time.Now()
	code, reason := sb.wait(limit)
	if code != wantCode || reason != wantReason {
		sb.t.Fatalf("ended with exit %d reason=%s, want exit %d reason=%s", code, reason, wantCode, wantReason)
	}
	sb.t.Logf("session ended in %s", time.Since(start).Round(time.Millisecond))
}

func TestBootDriveShutdown(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "sandbox_id = sb-one\nhostname = box\n")
	c := sb.dial()
	mustRun(t, c, "echo up") // waits for the agent
	info := infoOf(t, c)
	for k, want := range map[string]string{
		"sandbox_id": "sb-one", "hostname": "box", "parent": "-", "generation": "0", "snapshot": "-",
		"agent": "connected", "backend": "fake", "engine_version": fake.Version, "accel": "tcg",
	} {
		if info[k] != want {
			t.Errorf("__info__ %s=%q, want %q", k, info[k], want)
		}
	}
	cases := []struct {
		line     string
		wantOut  string
		wantExit int
	}{
		{"echo hello", "hello\n", 0},
		{"exit 3", "", 3},
		// A guest that aborts a command yields 255, never its own text
		// as a control error.
		{"reset", "", 255},
	}
	for _, tc := range cases {
		t.Run(tc.line, func(t *testing.T) {
			out, exit, err := run(t, c, tc.line)
			if err != nil || exit != tc.wantExit || out != tc.wantOut {
				t.Fatalf("got %q exit %d err %v; want %q exit %d", out, exit, err, tc.wantOut, tc.wantExit)
			}
		})
	}
	os.WriteFile(filepath.Join(sb.dir, "in.txt"), []byte("payload"), 0o600)
	mustRun(t, c, "__put__ in.txt /tmp/x")
	if b, _ := eng.Machines()[0].File("/tmp/x"); string(b) != "payload" {
		t.Fatalf("guest file = %q", b)
	}
	mustRun(t, c, "__get__ /tmp/x back.txt")
	if b, _ := os.ReadFile(filepath.Join(sb.dir, "back.txt")); string(b) != "payload" {
		t.Fatalf("host file = %q", b)
	}
	if _, exit, err := run(t, c, "__get__ /nope nope.txt"); err == nil || exit >= 0 {
		t.Fatalf("get of a missing guest file: exit %d err %v", exit, err)
	}
	if _, err := os.Stat(filepath.Join(sb.dir, "nope.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed get left %s behind", "nope.txt")
	}
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")
}

func TestConfigIdentityValidatedAndMinted(t *testing.T) {
	sb := start(t, fake.New(slog.Default()), "", "")
	c := sb.dial()
	mustRun(t, c, "echo up")
	info := infoOf(t, c)
	if !regexp.MustCompile(`^[0-9A-Z]{26}$`).MatchString(info["sandbox_id"]) || info["hostname"] != DefaultHostname {
		t.Fatalf("minted identity: sandbox_id=%q hostname=%q", info["sandbox_id"], info["hostname"])
	}
}

// TestInfoWhileAssembling: __info__ is answered, race-free, while the
// machine assembles (run under -race).
func TestInfoWhileAssembling(t *testing.T) {
	eng := fake.New(slog.Default())
	eng.SetFaults(fake.Faults{NoHello: true})
	sb := start(t, eng, "", "")
	c := sb.dial()
	for range 50 {
		if info := infoOf(t, c); info["agent"] != "booting" {
			t.Fatalf("agent=%q before any hello", info["agent"])
		}
	}
	sb.sigs <- syscall.SIGTERM
	sb.expectEnd(5*time.Second, 0, "sigterm")
}

// snapshotBase boots a sandbox, captures a base and stops it.
func snapshotBase(t *testing.T, eng *fake.Engine, name string) (path, id string) {
	t.Helper()
	sb := start(t, eng, "", "")
	c := sb.dial()
	id = infoOf(t, c)["sandbox_id"]
	if err := os.WriteFile(filepath.Join(sb.dir, "marker"), []byte("base\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, c, "__put__ marker /etc/base-marker")
	out := mustRun(t, c, "__snapshot__ "+name)
	if !strings.HasPrefix(out, "OK snapshot "+name+" kind=base") {
		t.Fatalf("snapshot reply %q", out)
	}
	keep := t.TempDir()
	path = filepath.Join(keep, name)
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")
	if err := os.Rename(filepath.Join(sb.dir, name), path); err != nil {
		t.Fatal(err)
	}
	return path, id
}

func TestForkParkWake(t *testing.T) {
	eng := fake.New(slog.Default())
	base, baseID := snapshotBase(t, eng, "base")

	fork := start(t, eng, "", "restore = 1\nrestore_from = "+base+"\n")
	c := fork.dial()
	mustRun(t, c, "echo up")
	info := infoOf(t, c)
	if info["parent"] != baseID || info["generation"] != "1" || info["snapshot"] != base ||
		info["sandbox_id"] == baseID || !strings.HasPrefix(info["hostname"], "sandbox-") {
		t.Fatalf("fork __info__: %v (base %s)", info, baseID)
	}
	forkID := info["sandbox_id"]
	m := eng.Machines()[len(eng.Machines())-1]
	if m.Epoch() == 0 {
		t.Fatal("the fork's agent still serves the base's epoch")
	}
	if b, ok := m.File("/etc/base-marker"); !ok || len(b) == 0 {
		t.Fatal("the fork lost the base's guest state")
	}
	if out := mustRun(t, c, "echo from the fork"); out != "from the fork\n" {
		t.Fatalf("fork output %q", out)
	}
	park := mustRun(t, c, "__park__ p")
	// The bill carries __stats__'s field names.
	for _, f := range []string{"uptime_ms=", "commands=", "bytes_in=", "net_tx_bytes=", "net_rx_bytes="} {
		if !strings.Contains(park, f) {
			t.Errorf("OK parked reply %q lacks %s", park, f)
		}
	}
	fork.expectEnd(5*time.Second, 0, "park")
	// One bill: the reply and the final record carry the same figures.
	final := fork.out.String()
	for _, pair := range [][2]string{{"uptime_ms", "uptime_ms"}, {"bytes_out", "bytes_out"}, {"bytes_in", "bytes_in"}, {"commands", "commands"}, {"cpu_ms", "cpu_ms"}} {
		re := regexp.MustCompile(pair[0] + `=(\d+)`)
		a, b := re.FindStringSubmatch(park), re.FindStringSubmatch(final)
		if a == nil || b == nil || a[1] != b[1] {
			t.Errorf("%s: OK parked says %v, the final record %v", pair[0], a, b)
		}
	}
	parkPath := filepath.Join(t.TempDir(), "p")
	if err := os.Rename(filepath.Join(fork.dir, "p"), parkPath); err != nil {
		t.Fatal(err)
	}

	wake := start(t, eng, "", "restore = 1\nrestore_from = "+parkPath+"\n")
	wc := wake.dial()
	mustRun(t, wc, "echo up")
	info = infoOf(t, wc)
	if info["sandbox_id"] != forkID || info["generation"] != "2" || info["parent"] != forkID {
		t.Fatalf("woken __info__: %v (fork %s)", info, forkID)
	}
	mustRun(t, wc, "echo awake")

	again := start(t, eng, "", "restore = 1\nrestore_from = "+parkPath+"\n")
	again.expectEnd(5*time.Second, 1, "error")
	if !strings.Contains(again.logs.String(), "park") {
		t.Fatalf("second wake's error does not mention the park: %s", again.logs.String())
	}
}

func TestCaptureGates(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "")
	// A client starts a command that never ends and leaves: the command
	// runs on in the guest, so a stream stays open.
	c1 := sb.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	c1.Run(ctx, "hang", io.Discard)
	cancel()
	c1.Close()
	c := sb.dial()
	for _, cmd := range []string{"__snapshot__ s", "__park__ p"} {
		out, exit, err := run(t, c, cmd)
		if err == nil || exit != -1 && !strings.Contains(err.Error(), "snapshot_allow_dirty=1") {
			t.Fatalf("%s with a command in flight: %q exit %d err %v", cmd, out, exit, err)
		}
		if !strings.Contains(err.Error(), "snapshot_allow_dirty=1") {
			t.Fatalf("%s refusal does not name snapshot_allow_dirty: %v", cmd, err)
		}
	}
	for _, name := range []string{"s", "p"} {
		if _, err := os.Stat(filepath.Join(sb.dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a refused capture left %s", name)
		}
	}
}

func TestGuestDiesMidCommand(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "")
	c := sb.dial()
	_, exit, err := run(t, c, "die")
	if err == nil && exit != 255 {
		t.Fatalf("a command whose engine died: exit %d err %v", exit, err)
	}
	sb.expectEnd(5*time.Second, 1, "error")
}

func TestGuestDiesMidCapture(t *testing.T) {
	eng := fake.New(slog.Default())
	eng.SetFaults(fake.Faults{DieInCapture: true})
	sb := start(t, eng, "", "")
	c := sb.dial()
	if _, _, err := run(t, c, "__snapshot__ s"); err == nil {
		t.Fatal("a capture whose engine died succeeded")
	}
	sb.expectEnd(5*time.Second, 1, "error")
	entries, _ := os.ReadDir(sb.dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "s") && e.IsDir() {
			t.Fatalf("a failed capture left %s", e.Name())
		}
	}
}

// TestRestoreFaults: a restore whose guest wedges or dies in the
// handshake, or whose engine is frozen, always ends, with one record.
func TestRestoreFaults(t *testing.T) {
	base, _ := snapshotBase(t, fake.New(slog.Default()), "base")
	cases := []struct {
		name       string
		faults     fake.Faults
		sigterm    bool
		wantCode   int
		wantReason string
		wantLog    string
	}{
		{"handshake never answered", fake.Faults{HangHandshake: true}, false, 1, "error", "did not answer the handshake"},
		{"sigterm during a hung handshake", fake.Faults{HangHandshake: true}, true, 0, "sigterm", ""},
		{"engine dies in the handshake", fake.Faults{DieInHandshake: true}, false, 1, "error", "handshake"},
		{"frozen engine, sigterm", fake.Faults{Frozen: true}, true, 0, "sigterm", ""},
		{"engine fails to start", fake.Faults{StartErr: errors.New("no engine today")}, false, 1, "error", "no engine today"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := fake.New(slog.Default())
			eng.SetFaults(tc.faults)
			sb := start(t, eng, "", "restore = 1\nrestore_from = "+base+"\n", func(o *Options) {
				o.HandshakeTimeout = 300 * time.Millisecond
			})
			if tc.sigterm {
				time.Sleep(100 * time.Millisecond)
				sb.sigs <- syscall.SIGTERM
			}
			sb.expectEnd(5*time.Second, tc.wantCode, tc.wantReason)
			if tc.wantLog != "" && !strings.Contains(sb.logs.String(), tc.wantLog) {
				t.Fatalf("log lacks %q", tc.wantLog)
			}
		})
	}
	// The base is unharmed and still restores.
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "restore = 1\nrestore_from = "+base+"\n")
	mustRun(t, sb.dial(), "echo still good")
}

// TestFrozenEngineStops: a running sandbox whose engine freezes still ends
// on SIGTERM and on __shutdown__, with one final record each.
func TestFrozenEngineStops(t *testing.T) {
	for _, how := range []string{"sigterm", "shutdown"} {
		t.Run(how, func(t *testing.T) {
			eng := fake.New(slog.Default())
			sb := start(t, eng, "", "")
			c := sb.dial()
			mustRun(t, c, "echo up")
			eng.Machines()[0].Freeze()
			if how == "sigterm" {
				sb.sigs <- syscall.SIGTERM
			} else {
				mustRun(t, c, "__shutdown__")
			}
			sb.expectEnd(5*time.Second, 0, how)
		})
	}
}

// TestSectionsRefusedByName: an artifact needing a section this build
// does not know, or a newer version of one it knows, is refused naming
// it, by a restore and by validate_snapshot alike.
func TestSectionsRefusedByName(t *testing.T) {
	cases := []struct {
		name string
		edit func(sections map[string]any)
		want string
	}{
		{"unknown section", func(s map[string]any) {
			s["netstack"] = map[string]any{"version": 1, "data": map[string]any{}}
		}, `needs a "netstack" section`},
		{"newer channel", func(s map[string]any) {
			s["channel"].(map[string]any)["version"] = 99
		}, `"channel" section is version 99`},
		{"missing channel", func(s map[string]any) { delete(s, "channel") }, `no "channel" section`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base, _ := snapshotBase(t, fake.New(slog.Default()), "base")
			editMeta(t, base, tc.edit)
			sb := start(t, fake.New(slog.Default()), "", "restore = 1\nrestore_from = "+base+"\n")
			sb.expectEnd(5*time.Second, 1, "error")
			if !strings.Contains(sb.logs.String(), tc.want) {
				t.Fatalf("restore log lacks %q", tc.want)
			}
			cfg := &conf.Config{Accel: "tcg", CPUs: 1, RAMMB: 512, ValidateSnapshot: base}
			cfg.Kernel, cfg.Image = guestFiles(t)
			cfg.Rootfs = filepath.Join(filepath.Dir(cfg.Image), RootImageFile)
			_, err := Validate(context.Background(), cfg, fake.New(slog.Default()), t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("validate: %v, want %q", err, tc.want)
			}
		})
	}
}

// editMeta rewrites an artifact's sections and re-seals its marker, as a
// newer (or broken) nether would have written it.
func editMeta(t *testing.T, dir string, edit func(map[string]any)) {
	t.Helper()
	p := filepath.Join(dir, "meta.json")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	edit(m["sections"].(map[string]any))
	b, _ = json.Marshal(m)
	b = append(b, '\n')
	os.Chmod(p, 0o600)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	marker := fmt.Sprintf("nether-snapshot v2 meta-sha256=%s\n", hex.EncodeToString(sum[:]))
	if err := os.WriteFile(filepath.Join(dir, "COMMITTED"), []byte(marker), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestHonestStopReasons: a guest that crashes is not reported as a clean
// power-off.
func TestHonestStopReasons(t *testing.T) {
	cases := []struct {
		command    string
		wantCode   int
		wantReason string
	}{
		{"panic", 1, "guest_panic"},
		{"reboot", 1, "guest_crash"},
		{"die", 1, "error"},
		{"poweroff", 0, "poweroff"},
	}
	for _, tc := range cases {
		t.Run(tc.command, func(t *testing.T) {
			sb := start(t, fake.New(slog.Default()), "", "")
			c := sb.dial()
			mustRun(t, c, "echo up")
			run(t, c, tc.command)
			sb.expectEnd(5*time.Second, tc.wantCode, tc.wantReason)
		})
	}
	sb := start(t, fake.New(slog.Default()), "", "")
	c := sb.dial()
	mustRun(t, c, "echo up")
	// The fake agent powers the guest off when asked: a clean end.
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")
}

// TestTransfersGuardNethersFiles: __get__ may not replace nether.conf,
// console.log, the control socket or anything in a snapshot artifact.
func TestTransfersGuardNethersFiles(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "")
	c := sb.dial()
	os.WriteFile(filepath.Join(sb.dir, "in.txt"), []byte("guest-chosen config"), 0o600)
	mustRun(t, c, "__put__ in.txt /evil")
	mustRun(t, c, "__snapshot__ snap")
	confBefore, _ := os.ReadFile(filepath.Join(sb.dir, "nether.conf"))
	for _, target := range []string{"nether.conf", "console.log", "ctl.sock", "snap/meta.json", "snap/extra"} {
		t.Run(target, func(t *testing.T) {
			out, exit, err := run(t, c, "__get__ /evil "+target)
			if err == nil || exit != -1 || !strings.Contains(err.Error(), "nether's own file") {
				t.Fatalf("__get__ onto %s: %q exit %d err %v", target, out, exit, err)
			}
		})
	}
	if b, _ := os.ReadFile(filepath.Join(sb.dir, "nether.conf")); !bytes.Equal(b, confBefore) {
		t.Fatal("nether.conf was replaced")
	}
	mustRun(t, c, "__get__ /evil fine.txt")
}

// TestEveryCommandAnswered: a command in flight when the sandbox ends gets
// a framed control error naming why, never a bare end of file.
func TestEveryCommandAnswered(t *testing.T) {
	cases := []struct {
		name string
		stop func(sb *sandbox)
		want string
	}{
		{"sigterm", func(sb *sandbox) { sb.sigs <- syscall.SIGTERM }, "sandbox stopping: sigterm"},
		{"engine crash", func(sb *sandbox) { sb.eng.Machines()[0].Crash() }, "sandbox stopping: error"},
		{"guest panic", func(sb *sandbox) { sb.eng.Machines()[0].GuestPanic("Kernel panic - not syncing\n") }, "sandbox stopping: guest_panic"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := start(t, fake.New(slog.Default()), "", "")
			c := sb.dial()
			mustRun(t, c, "echo up")
			got := make(chan error, 1)
			go func() {
				_, _, err := run(t, c, "hang")
				got <- err
			}()
			time.Sleep(100 * time.Millisecond)
			tc.stop(sb)
			select {
			case err := <-got:
				var ce *client.ControlError
				if !errors.As(err, &ce) || ce.Exit != -1 || !strings.Contains(ce.Msg, tc.want) {
					t.Fatalf("the command in flight got %v, want a framed ERR with %q", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the command in flight was never answered")
			}
			sb.wait(5 * time.Second)
		})
	}
}

// TestAgentOfAnotherProtocolRefused: a guest image whose agent speaks
// another protocol version is never driven; commands fail at once saying
// why, instead of running misread.
func TestAgentOfAnotherProtocolRefused(t *testing.T) {
	eng := fake.New(slog.Default())
	eng.SetFaults(fake.Faults{AgentVersion: 2})
	sb := start(t, eng, "", "")
	c := sb.dial()
	start := time.Now()
	_, exit, err := run(t, c, "echo hi")
	if err == nil || exit != -1 || !strings.Contains(err.Error(), "agent protocol 2") || !strings.Contains(err.Error(), "rebuild the guest image") {
		t.Fatalf("a command to an agent of another protocol: exit %d err %v", exit, err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatalf("the refusal took %s", time.Since(start))
	}
}

// TestRestoreRefusesAnotherEngineOrShape: an artifact restores only on the
// engine version and shape it was captured with, and the refusal names
// what differs.
func TestRestoreRefusesAnotherEngineOrShape(t *testing.T) {
	base, _ := snapshotBase(t, fake.New(slog.Default()), "base")
	cases := []struct {
		name  string
		eng   *fake.Engine
		extra string
		want  string
	}{
		{"engine upgraded", &fake.Engine{Log: slog.Default(), Version: "2.0.0"}, "", "engine_version=1.0.0; this nether has engine_version=2.0.0"},
		{"more memory", fake.New(slog.Default()), "ram_mb = 1024\n", "ram_mb=512; this nether has ram_mb=1024"},
		{"more cpus", fake.New(slog.Default()), "cpus = 2\n", "cpus=1; this nether has cpus=2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := start(t, tc.eng, "", "restore = 1\nrestore_from = "+base+"\n"+tc.extra)
			sb.expectEnd(5*time.Second, 1, "error")
			if !strings.Contains(sb.logs.String(), tc.want) {
				t.Fatalf("log lacks %q", tc.want)
			}
		})
	}
}

// TestBudgets: each budget ends the session through the normal teardown,
// with its reason in the final record and in the reply of a command in
// flight, within a second of its limit.
func TestBudgets(t *testing.T) {
	cases := []struct {
		name       string
		conf       string
		drive      func(t *testing.T, sb *sandbox)
		within     time.Duration
		wantReason string
	}{
		{"max_runtime mid-command", "max_runtime_s = 1\n", func(t *testing.T, sb *sandbox) {
			c := sb.dial()
			start := time.Now()
			_, exit, err := run(t, c, "hang")
			if exit != -1 || err == nil || !strings.Contains(err.Error(), "sandbox stopping: max_runtime") {
				t.Errorf("the command in flight got exit %d, %v", exit, err)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the budget ended the command after %s", took)
			}
		}, 3 * time.Second, "max_runtime"},
		{"max_cpu", "max_cpu_s = 1\n", func(t *testing.T, sb *sandbox) {
			c := sb.dial()
			mustRun(t, c, "burn 400")
			if info := infoOf(t, c); info["max_cpu_s"] != "1" {
				t.Errorf("__info__ max_cpu_s=%q", info["max_cpu_s"])
			}
			run(t, c, "burn 700") // crosses 1 s of CPU
		}, 3 * time.Second, "max_cpu"},
		{"idle with nobody there", "idle_timeout_s = 1\n", func(t *testing.T, sb *sandbox) {}, 3 * time.Second, "idle"},
		{"idle held off by a client, then a running command", "idle_timeout_s = 1\n", func(t *testing.T, sb *sandbox) {
			c := sb.dial()
			time.Sleep(1500 * time.Millisecond) // connected: not idle
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			c.Run(ctx, "sleep 2000", io.Discard) // leaves it running
			cancel()
			c.Close()
			time.Sleep(1500 * time.Millisecond) // the command still runs: not idle
			select {
			case <-sb.exit:
				t.Fatal("the session went idle with a client connected or a command running")
			default:
			}
			// The command ends about 0.5 s from now; the idle clock
			// starts then, so the session ends about 1.5 s from now.
		}, 3 * time.Second, "idle"},
		{"idle held off by a data-plane connection", "idle_timeout_s = 1\napp_port = 8080\ndata_socket = data.sock\n", func(t *testing.T, sb *sandbox) {
			var dc net.Conn
			var err error
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if dc, err = net.Dial("unix", filepath.Join(sb.dir, "data.sock")); err == nil || time.Now().After(deadline) {
					break
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			for range 6 { // 3 s with the connection open and echoing
				io.WriteString(dc, "ping")
				if _, err := io.ReadFull(dc, make([]byte, 4)); err != nil {
					t.Fatalf("the data connection: %v", err)
				}
				time.Sleep(500 * time.Millisecond)
			}
			select {
			case <-sb.exit:
				t.Fatal("the session went idle with a data-plane connection open and busy")
			default:
			}
			dc.Close()
		}, 3 * time.Second, "idle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			eng := fake.New(slog.Default())
			sb := start(t, eng, "", tc.conf)
			tc.drive(t, sb)
			sb.expectEnd(tc.within, 0, tc.wantReason)
		})
	}
}

// __info__ reports every cap a platform may set, with 0 for off, so a
// client can verify what it got.
func TestInfoReportsEveryCap(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "max_runtime_s = 60\nmax_cpu_s = 30\nidle_timeout_s = 20\nmax_output_bytes = 4096\nmax_data_conns = 7\ndata_idle_ms = 500\ndata_rate_kbps = 8000\napp_port = 8080\n")
	info := infoOf(t, sb.dial())
	for key, want := range map[string]string{
		"max_runtime_s": "60", "max_cpu_s": "30", "idle_timeout_s": "20", "max_output_bytes": "4096",
		"net_rate_kbps": "0", "max_data_conns": "7", "data_idle_ms": "500", "data_rate_kbps": "8000",
		"gpu": "off", "net": "off", "data_plane": "off", "app_port": "8080", "egress_plane": "off", "egress_port": "0",
	} {
		if got, ok := info[key]; !ok || got != want {
			t.Errorf("__info__ %s=%q (present %v), want %q", key, got, ok, want)
		}
	}
}
