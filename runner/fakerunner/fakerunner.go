// Package fakerunner is a runner.Runner that simulates sandboxes in
// memory, as internal/engine/fake serves the session: a launch "boots"
// at once (or restores from a fake artifact), verbs answer as nether's
// would, and each session's end is written to the launch directory's
// outputs as nether writes it, so an orchestrator's handling of them is
// the real one. A test makes it fail at a step with Fail.
package fakerunner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nethersandbox/nether/runner"
)

// Step is where a Fail hook may make the fake fail.
type Step string

const (
	Spawn    Step = "spawn"    // Launch fails, nothing runs
	Start    Step = "start"    // the nether dies while starting: its final record says reason=error, its log the error
	Snapshot Step = "snapshot" // a verb refused with the hook's error
	Park     Step = "park"
	Claim    Step = "claim"
	Put      Step = "put"
	Get      Step = "get"
	Shutdown Step = "shutdown"
	Exec     Step = "exec"
	// Ready is the handshake's report: an error makes the guest's agent
	// not (yet) connected; a hook that blocks here holds its caller
	// where it waits for the guest to come up.
	Ready Step = "ready"
)

// Fake is an in-memory runner. The zero value is not usable: use New.
type Fake struct {
	// Fail, when set, is asked at each step of the sandbox in dir; a
	// non-nil error makes that step fail with it.
	Fail func(dir string, step Step) error

	mu      sync.Mutex
	nextPID int
	byPID   map[int]*sandbox
	// Launches counts launches by kind ("boot", "restore").
	launches map[string]int
	image    runner.Image // what a boot runs (SetImage)
}

type sandbox struct {
	dir      string
	proc     runner.Proc
	alive    bool
	settings runner.Settings
	claimed  bool
	kind     string // the artifact kind it restored ("" booted)
	files    map[string][]byte
	stats    runner.Stats
	began    time.Time
	secrets  map[string][]byte // what its launch handed it (nil = none)
	image    runner.Image      // what it runs: the boot's, or its artifact's
}

// New makes a Fake.
func New() *Fake {
	return &Fake{nextPID: 1000, byPID: map[int]*sandbox{}, launches: map[string]int{}, image: runner.Image{Kernel: Kernel, Rootfs: Rootfs}}
}

// SetImage changes what later boots run (and so what their captures
// record): as if the guest directory's kernel and root image were
// rebuilt.
func (f *Fake) SetImage(img runner.Image) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.image = img
}

var _ runner.Runner = (*Fake)(nil)

// artifact is a fake artifact's meta.json.
type artifact struct {
	Kind   string `json:"kind"`
	CPUs   int    `json:"cpus"`
	RAMMB  int    `json:"ram_mb"`
	Kernel string `json:"kernel"`
	Rootfs string `json:"rootfs"`
	From   string `json:"from"` // the sandbox it was captured from
}

// Kernel and Rootfs are the digests (sha256, hex, as nether's
// fingerprint holds them) of a fake boot's image until SetImage.
const (
	Kernel = "5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e5ca1ab1e"
	Rootfs = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed"
)

func (f *Fake) fail(dir string, step Step) error {
	if f.Fail == nil {
		return nil
	}
	return f.Fail(dir, step)
}

// Launch implements runner.Runner: nether.conf is written as the real
// runner writes it (and so validated by nether's parser), then the
// sandbox "runs".
func (f *Fake) Launch(dir string, s runner.Settings, secrets map[string][]byte) (runner.Proc, error) {
	text, err := s.Text(dir, secrets != nil)
	if err != nil {
		return runner.Proc{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, runner.ConfFile), []byte(text), 0o600); err != nil {
		return runner.Proc{}, err
	}
	if err := f.fail(dir, Spawn); err != nil {
		return runner.Proc{}, fmt.Errorf("starting nether: %w", err)
	}
	sb := &sandbox{dir: dir, alive: true, settings: s, files: map[string][]byte{}, stats: runner.Stats{}, began: time.Now(), secrets: copySecrets(secrets)}
	img, _ := f.BootImage(s.GPU, s.Rootfs)
	sb.image = img
	var startErr error
	if s.RestoreFrom != "" {
		a, err := readMeta(s.RestoreFrom)
		if err != nil {
			startErr = fmt.Errorf("restore: %w", err)
		} else {
			sb.kind = a.Kind
			sb.image = runner.Image{Kernel: a.Kernel, Rootfs: a.Rootfs}
			if a.Kind == "park" {
				// A wake consumes its park.
				os.RemoveAll(s.RestoreFrom)
			}
		}
	}
	if startErr == nil {
		startErr = f.fail(dir, Start)
	}
	f.mu.Lock()
	f.nextPID++
	sb.proc = runner.Proc{PID: f.nextPID, Start: uint64(f.nextPID) * 7}
	f.byPID[sb.proc.PID] = sb
	if s.RestoreFrom != "" {
		f.launches["restore"]++
	} else {
		f.launches["boot"]++
	}
	f.mu.Unlock()
	if startErr != nil {
		appendFile(dir, runner.Stderr, fmt.Sprintf("time=t level=ERROR msg=\"nether stopped on an error\" err=%q\n", startErr.Error()))
		f.end(sb, "error")
	}
	return sb.proc, nil
}

// Launches is how many launches of kind ("boot", "restore") there were.
func (f *Fake) Launches(kind string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.launches[kind]
}

// end ends sb's session with reason ("" = killed: no final record).
func (f *Fake) end(sb *sandbox, reason string) {
	f.mu.Lock()
	was := sb.alive
	sb.alive = false
	f.mu.Unlock()
	if was && reason != "" {
		appendFile(sb.dir, runner.Stdout, fmt.Sprintf("[nether] final usage (reason=%s): uptime_ms=%d commands=0\n", reason, time.Since(sb.began).Milliseconds()))
	}
}

// Crash ends the nether in dir now, with a final record of reason (""
// = SIGKILL: none). It reports whether one ran there.
func (f *Fake) Crash(dir, reason string) bool {
	sb := f.in(dir)
	if sb == nil {
		return false
	}
	f.end(sb, reason)
	return true
}

// SetStats sets what __stats__ of the nether in dir reports.
func (f *Fake) SetStats(dir string, st runner.Stats) {
	if sb := f.in(dir); sb != nil {
		f.mu.Lock()
		sb.stats = st
		f.mu.Unlock()
	}
}

// Settings are the settings the live nether in dir was launched with.
func (f *Fake) Settings(dir string) (runner.Settings, bool) {
	if sb := f.in(dir); sb != nil {
		return sb.settings, true
	}
	return runner.Settings{}, false
}

// Secrets are the secrets the live nether in dir was launched with (nil
// for none), as its guest would hold them.
func (f *Fake) Secrets(dir string) map[string][]byte {
	if sb := f.in(dir); sb != nil {
		return copySecrets(sb.secrets)
	}
	return nil
}

// copySecrets is a copy of secrets that shares no byte with it: the
// caller may wipe its own after a launch.
func copySecrets(secrets map[string][]byte) map[string][]byte {
	if secrets == nil {
		return nil
	}
	out := make(map[string][]byte, len(secrets))
	for k, v := range secrets {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// Identity is the sandbox id and hostname the live nether in dir goes
// by (a claim changes them).
func (f *Fake) Identity(dir string) (id, hostname string) {
	if sb := f.in(dir); sb != nil {
		f.mu.Lock()
		defer f.mu.Unlock()
		return sb.settings.SandboxID, sb.settings.Hostname
	}
	return "", ""
}

// in is the live sandbox in dir, nil for none.
func (f *Fake) in(dir string) *sandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, sb := range f.byPID {
		if sb.dir == dir && sb.alive {
			return sb
		}
	}
	return nil
}

func (f *Fake) Alive(p runner.Proc) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.byPID[p.PID]
	return sb != nil && sb.alive && (p.Start == 0 || p.Start == sb.proc.Start)
}

func (f *Fake) Terminate(p runner.Proc, grace time.Duration) {
	f.mu.Lock()
	sb := f.byPID[p.PID]
	f.mu.Unlock()
	if sb != nil && (p.Start == 0 || p.Start == sb.proc.Start) {
		f.end(sb, "sigterm")
	}
}

func (f *Fake) Running(root string) map[runner.Proc]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[runner.Proc]string{}
	for _, sb := range f.byPID {
		if sb.alive && filepath.Dir(sb.dir) == root {
			out[sb.proc] = sb.dir
		}
	}
	return out
}

// Live is how many fake nethers run.
func (f *Fake) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, sb := range f.byPID {
		if sb.alive {
			n++
		}
	}
	return n
}

func (f *Fake) Mark(dir string) runner.Mark               { return runner.MarkOf(dir) }
func (f *Fake) Final(dir string, from runner.Mark) string { return runner.FinalSince(dir, from) }
func (f *Fake) Why(dir string, from runner.Mark) string   { return runner.WhySince(dir, from) }

func (f *Fake) BootImage(gpu bool, rootfs string) (runner.Image, error) {
	f.mu.Lock()
	img := f.image
	f.mu.Unlock()
	if rootfs == runner.RootfsBusybox {
		img.Rootfs = ""
	}
	return img, nil
}

func (f *Fake) Artifact(dir string) (runner.Artifact, error) {
	a, err := readMeta(dir)
	if err != nil {
		return runner.Artifact{}, err
	}
	return runner.Artifact{Kind: a.Kind, CPUs: a.CPUs, RAMMB: a.RAMMB, Kernel: a.Kernel, Rootfs: a.Rootfs}, nil
}

func readMeta(dir string) (artifact, error) {
	var a artifact
	b, err := os.ReadFile(filepath.Join(dir, runner.ArtifactMeta))
	if err != nil {
		return a, err
	}
	return a, json.Unmarshal(b, &a)
}

func (f *Fake) Dial(ctx context.Context, dir string) (runner.Conn, error) {
	sb := f.in(dir)
	if sb == nil {
		return nil, fmt.Errorf("dial unix %s: connect: connection refused", filepath.Join(dir, runner.ControlSocket))
	}
	return &conn{f: f, sb: sb}, nil
}

type conn struct {
	f  *Fake
	sb *sandbox
}

func (c *conn) Info() runner.Info {
	if !c.f.Alive(c.sb.proc) || c.f.fail(c.sb.dir, Ready) != nil {
		return runner.Info{}
	}
	return runner.Info{"agent": "connected", "proto_version": "2"}
}

func (c *conn) Close() error { return nil }

// gate is a verb's common path: the sandbox must still run, and the
// Fail hook may refuse the step.
func (c *conn) gate(verb string, step Step) error {
	if !c.f.Alive(c.sb.proc) {
		return runner.Refusal(verb, "connection reset by peer")
	}
	if err := c.f.fail(c.sb.dir, step); err != nil {
		var re *runner.ReplyError
		if errors.As(err, &re) {
			return err
		}
		return runner.Refusal(verb, err.Error())
	}
	return nil
}

func (c *conn) Stats(ctx context.Context) (runner.Stats, error) {
	if err := c.gate("__stats__", ""); err != nil {
		return nil, err
	}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	out := runner.Stats{}
	for k, v := range c.sb.stats {
		out[k] = v
	}
	return out, nil
}

func (c *conn) capture(rel, kind string) error {
	s := c.sb.settings
	a := artifact{Kind: kind, CPUs: orDefault(s.CPUs, runner.Defaults.CPUs), RAMMB: orDefault(s.RAMMB, runner.Defaults.RAMMB),
		Kernel: c.sb.image.Kernel, Rootfs: c.sb.image.Rootfs, From: s.SandboxID}
	dir := filepath.Join(c.sb.dir, rel)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(a)
	return os.WriteFile(filepath.Join(dir, runner.ArtifactMeta), b, 0o600)
}

func (c *conn) Snapshot(ctx context.Context, rel string) (runner.Capture, error) {
	if err := c.gate("__snapshot__", Snapshot); err != nil {
		return runner.Capture{}, err
	}
	if err := c.capture(rel, "base"); err != nil {
		return runner.Capture{}, runner.Refusal("__snapshot__", err.Error())
	}
	return runner.Capture{Path: rel, Kind: "base", PauseMS: 1, RAM: "sparse"}, nil
}

func (c *conn) Park(ctx context.Context, rel string) (runner.Parked, error) {
	if err := c.gate("__park__", Park); err != nil {
		return runner.Parked{}, err
	}
	if err := c.capture(rel, "park"); err != nil {
		return runner.Parked{}, runner.Refusal("__park__", err.Error())
	}
	c.f.end(c.sb, "park")
	return runner.Parked{Path: rel, PauseMS: 1, Bill: runner.Stats{"uptime_ms": 1}}, nil
}

func (c *conn) Claim(ctx context.Context, r runner.ClaimRequest) error {
	if err := c.gate("__claim__", Claim); err != nil {
		return err
	}
	c.f.mu.Lock()
	defer c.f.mu.Unlock()
	switch {
	case c.sb.kind != "base":
		return runner.Refusal("__claim__", "only a fork of a base can be claimed; this sandbox booted")
	case c.sb.claimed:
		return runner.Refusal("__claim__", "already claimed, as "+c.sb.settings.SandboxID+": a fork is claimed once")
	}
	c.sb.claimed = true
	c.sb.settings.SandboxID, c.sb.settings.Hostname = r.SandboxID, r.Hostname
	c.sb.settings.BootID, c.sb.settings.IdentityToken, c.sb.settings.PlanDigest = r.BootID, r.Token, r.PlanDigest
	return nil
}

func (c *conn) Put(ctx context.Context, hostRel, guestPath string) error {
	if err := runner.CheckGuestPath(guestPath); err != nil {
		return err
	}
	if err := c.gate("__put__", Put); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(c.sb.dir, hostRel))
	if err != nil {
		return runner.Refusal("__put__", hostRel+": no such file or directory")
	}
	c.f.mu.Lock()
	c.sb.files[guestPath] = b
	c.f.mu.Unlock()
	return nil
}

func (c *conn) Get(ctx context.Context, guestPath, hostRel string) error {
	if err := runner.CheckGuestPath(guestPath); err != nil {
		return err
	}
	if err := c.gate("__get__", Get); err != nil {
		return err
	}
	c.f.mu.Lock()
	b, ok := c.sb.files[guestPath]
	c.f.mu.Unlock()
	if !ok {
		return runner.Refusal("__get__", "open "+guestPath+": no such file or directory")
	}
	return os.WriteFile(filepath.Join(c.sb.dir, hostRel), b, 0o600)
}

func (c *conn) Shutdown(ctx context.Context) error {
	if err := c.gate("__shutdown__", Shutdown); err != nil {
		return err
	}
	c.f.end(c.sb, "shutdown")
	return nil
}

// Exec "runs" line: "exit N" exits N, anything else echoes the line.
func (c *conn) Exec(ctx context.Context, line string, out io.Writer) (int, error) {
	if strings.HasPrefix(strings.TrimSpace(line), "__") {
		return 0, runner.Refusal("exec", "the line begins with __, nether's reserved control namespace")
	}
	if err := c.gate("exec", Exec); err != nil {
		return -1, err
	}
	var code int
	if _, err := fmt.Sscanf(line, "exit %d", &code); err == nil {
		return code, nil
	}
	fmt.Fprintln(out, line)
	return 0, nil
}

// orDefault is a setting as nether runs it: v, or nether's default when
// it is left 0.
func orDefault(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func appendFile(dir, name, text string) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString(text)
}
