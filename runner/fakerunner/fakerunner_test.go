package fakerunner

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/runner"
)

// launchIn launches a fake nether in a fresh directory under root.
func launchIn(t *testing.T, f *Fake, root, name string, s runner.Settings) (string, runner.Proc) {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	p, err := f.Launch(dir, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	return dir, p
}

func dial(t *testing.T, f *Fake, dir string) runner.Conn {
	t.Helper()
	c, err := f.Dial(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestLaunchWritesConf: a launch writes the nether.conf nether's own
// parser reads back, and settings nether would refuse start nothing.
func TestLaunchWritesConf(t *testing.T) {
	f := New()
	root := t.TempDir()
	dir, p := launchIn(t, f, root, "a", runner.Settings{SandboxID: "01JA", Hostname: "web", CPUs: 2, RAMMB: 256})
	c, err := conf.Load(dir)
	if err != nil || c.CPUs != 2 || c.RAMMB != 256 || c.Hostname != "web" {
		t.Fatalf("nether reads %+v, %v", c, err)
	}
	if !f.Alive(p) || f.Live() != 1 || f.Launches("boot") != 1 {
		t.Fatalf("alive %v, live %d, boots %d", f.Alive(p), f.Live(), f.Launches("boot"))
	}
	if _, err := f.Launch(filepath.Join(root, "a"), runner.Settings{RAMMB: 1}, nil); err == nil || !strings.Contains(err.Error(), "ram_mb 1") {
		t.Fatalf("settings nether refuses: %v", err)
	}
	if f.Live() != 1 {
		t.Fatalf("a refused launch runs: %d live", f.Live())
	}
}

// TestEnds: Terminate ends with reason=sigterm, Crash("") with no final
// record at all, a Start failure with reason=error and the error logged;
// Running lists only live nethers right under the root, and a stale
// Proc (another start time) is not alive.
func TestEnds(t *testing.T) {
	f := New()
	root := t.TempDir()
	a, pa := launchIn(t, f, root, "a", runner.Settings{})
	b, pb := launchIn(t, f, root, "b", runner.Settings{})
	launchIn(t, f, filepath.Join(root, "b"), "nested", runner.Settings{})
	if got := f.Running(root); len(got) != 2 || got[pa] != a || got[pb] != b {
		t.Fatalf("running under root: %v", got)
	}
	if f.Alive(runner.Proc{PID: pa.PID, Start: pa.Start + 1}) {
		t.Error("a proc with another start time is alive")
	}
	mark := f.Mark(a)
	f.Terminate(pa, time.Second)
	if f.Alive(pa) || runner.FinalReason(f.Final(a, mark)) != "sigterm" {
		t.Fatalf("after Terminate: alive %v, final %q", f.Alive(pa), f.Final(a, mark))
	}
	mark = f.Mark(b)
	if !f.Crash(b, "") || f.Final(b, mark) != "" {
		t.Fatalf("a SIGKILL printed %q", f.Final(b, mark))
	}
	if f.Crash(b, "shutdown") {
		t.Error("Crash found a nether in a directory whose nether is gone")
	}
	f.Fail = func(dir string, step Step) error {
		if step == Start {
			return errors.New("no kvm, no tcg")
		}
		return nil
	}
	c, pc := launchIn(t, f, root, "c", runner.Settings{})
	if f.Alive(pc) || runner.FinalReason(f.Final(c, runner.Mark{})) != "error" || f.Why(c, runner.Mark{}) != "no kvm, no tcg" {
		t.Fatalf("a start failure: alive %v, final %q, why %q", f.Alive(pc), f.Final(c, runner.Mark{}), f.Why(c, runner.Mark{}))
	}
	f.Fail = func(dir string, step Step) error {
		if step == Spawn {
			return errors.New("exec format error")
		}
		return nil
	}
	if _, err := f.Launch(c, runner.Settings{}, nil); err == nil || f.Live() != 1 {
		t.Fatalf("a failed spawn: %v, %d live (want only the nested one)", err, f.Live())
	}
}

// TestCaptures: a snapshot is an artifact Artifact reads back with the
// session's size and the image's digests; a restore of it can be claimed
// once, a boot never; a park ends the session and its wake consumes it.
func TestCaptures(t *testing.T) {
	f := New()
	ctx := context.Background()
	root := t.TempDir()
	dir, _ := launchIn(t, f, root, "a", runner.Settings{SandboxID: "01JA", CPUs: 2, RAMMB: 256})
	c := dial(t, f, dir)
	capt, err := c.Snapshot(ctx, "snap")
	if err != nil || capt.Kind != "base" || capt.Path != "snap" {
		t.Fatalf("snapshot: %+v, %v", capt, err)
	}
	a, err := f.Artifact(filepath.Join(dir, "snap"))
	if err != nil || a != (runner.Artifact{Kind: "base", CPUs: 2, RAMMB: 256, Kernel: Kernel, Rootfs: Rootfs}) {
		t.Fatalf("artifact %+v, %v", a, err)
	}
	if err := c.Claim(ctx, runner.ClaimRequest{SandboxID: "x", Hostname: "x"}); err == nil || !strings.Contains(err.Error(), "booted") {
		t.Fatalf("a claim of a booted sandbox: %v", err)
	}
	kid, _ := launchIn(t, f, root, "kid", runner.Settings{RestoreFrom: filepath.Join(dir, "snap")})
	if f.Launches("restore") != 1 {
		t.Fatalf("restores %d", f.Launches("restore"))
	}
	kc := dial(t, f, kid)
	if err := kc.Claim(ctx, runner.ClaimRequest{SandboxID: "01JK", Hostname: "k", BootID: "b2", PlanDigest: "pd"}); err != nil {
		t.Fatal(err)
	}
	if id, host := f.Identity(kid); id != "01JK" || host != "k" {
		t.Fatalf("claimed as %s %s", id, host)
	}
	if s, _ := f.Settings(kid); s.BootID != "b2" || s.PlanDigest != "pd" {
		t.Fatalf("the claim's boot and plan: %+v", s)
	}
	if err := kc.Claim(ctx, runner.ClaimRequest{SandboxID: "01JL", Hostname: "l"}); err == nil || !strings.Contains(err.Error(), "claimed once") {
		t.Fatalf("a second claim: %v", err)
	}
	mark := f.Mark(dir)
	parked, err := c.Park(ctx, "park")
	if err != nil || parked.Path != "park" || f.in(dir) != nil || runner.FinalReason(f.Final(dir, mark)) != "park" {
		t.Fatalf("park: %+v, %v; still runs %v, final %q", parked, err, f.in(dir) != nil, f.Final(dir, mark))
	}
	if a, err := f.Artifact(filepath.Join(dir, "park")); err != nil || a.Kind != "park" {
		t.Fatalf("the park: %+v, %v", a, err)
	}
	if _, err := c.Stats(ctx); err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("a verb on an ended session: %v", err)
	}
	launchIn(t, f, root, "a", runner.Settings{RestoreFrom: filepath.Join(dir, "park")})
	if _, err := os.Stat(filepath.Join(dir, "park")); !os.IsNotExist(err) {
		t.Errorf("the wake left its park: %v", err)
	}
	// A restore of nothing: the nether ends on an error saying so.
	gone, pg := launchIn(t, f, root, "gone", runner.Settings{RestoreFrom: filepath.Join(dir, "park")})
	if f.Alive(pg) || !strings.Contains(f.Why(gone, runner.Mark{}), "restore") {
		t.Fatalf("a restore of a missing artifact: alive %v, why %q", f.Alive(pg), f.Why(gone, runner.Mark{}))
	}
}

// TestTransfersAndExec: put and get move a launch directory's file in
// and out (a missing guest file is ErrNoPath), exec echoes and exits as
// asked and refuses nether's control namespace, Fail refuses a verb in
// nether's words, and stats report what SetStats set.
func TestTransfersAndExec(t *testing.T) {
	f := New()
	ctx := context.Background()
	dir, _ := launchIn(t, f, t.TempDir(), "a", runner.Settings{})
	c := dial(t, f, dir)
	os.WriteFile(filepath.Join(dir, "in"), []byte("hello"), 0o600)
	if err := c.Put(ctx, "in", "/tmp/x"); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, "/tmp/x", "out"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "out")); string(b) != "hello" {
		t.Fatalf("got back %q", b)
	}
	if err := c.Get(ctx, "/nope", "out2"); !errors.Is(err, runner.ErrNoPath) {
		t.Fatalf("get of a missing file: %v", err)
	}
	if err := c.Put(ctx, "in", "/a b"); !errors.Is(err, runner.ErrBadPath) {
		t.Fatalf("a guest path with a blank: %v", err)
	}
	var out bytes.Buffer
	if code, err := c.Exec(ctx, "exit 7", &out); code != 7 || err != nil {
		t.Fatalf("exit 7: %d, %v", code, err)
	}
	if _, err := c.Exec(ctx, " __park__ p", &out); err == nil {
		t.Fatal("exec ran a control verb")
	}
	f.Fail = func(d string, step Step) error {
		if step == Put {
			return errors.New("/ro: read-only file system")
		}
		return nil
	}
	if err := c.Put(ctx, "in", "/ro/x"); !errors.Is(err, runner.ErrDenied) {
		t.Fatalf("a refused put: %v", err)
	}
	f.SetStats(dir, runner.Stats{"net_tx": 3})
	st, _ := c.Stats(ctx)
	st["net_tx"] = 99 // the caller's copy
	if st2, err := c.Stats(ctx); err != nil || st2["net_tx"] != 3 {
		t.Fatalf("stats %v, %v", st2, err)
	}
	if err := c.Shutdown(ctx); err != nil || f.Live() != 0 || runner.FinalReason(f.Final(dir, runner.Mark{})) != "shutdown" {
		t.Fatalf("shutdown: %v, %d live", err, f.Live())
	}
	if _, err := f.Dial(ctx, dir); err == nil {
		t.Fatal("dialled a nether that ended")
	}
}

// TestSecretsKept: the fake keeps its own copy of the secrets a launch
// handed it, so a caller that wipes its map after the launch (as nexus
// must) still finds what the guest got.
func TestSecretsKept(t *testing.T) {
	f := New()
	dir := filepath.Join(t.TempDir(), "a")
	os.MkdirAll(dir, 0o700)
	given := map[string][]byte{"K": []byte("value")}
	if _, err := f.Launch(dir, runner.Settings{}, given); err != nil {
		t.Fatal(err)
	}
	given["K"][0] = 0
	if got := f.Secrets(dir); string(got["K"]) != "value" {
		t.Fatalf("the guest holds %q", got)
	}
	if c, err := conf.Load(dir); err != nil || c.SecretsFD != 3 {
		t.Fatalf("a launch with secrets: secrets_fd %d, %v", c.SecretsFD, err)
	}
}

// TestImages: a capture records the image its session runs, a restore
// runs its artifact's image whatever later boots run, and a Ready hook
// keeps the guest's agent from answering.
func TestImages(t *testing.T) {
	f := New()
	ctx := context.Background()
	root := t.TempDir()
	dir, _ := launchIn(t, f, root, "a", runner.Settings{})
	if _, err := dial(t, f, dir).Snapshot(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
	other := runner.Image{Kernel: strings.Repeat("1", 64), Rootfs: strings.Repeat("2", 64)}
	f.SetImage(other)
	if img, _ := f.BootImage(false, ""); img != other {
		t.Fatalf("boots run %+v after SetImage", img)
	}
	if img, _ := f.BootImage(false, runner.RootfsBusybox); img.Rootfs != "" || img.Kernel != other.Kernel {
		t.Fatalf("a busybox boot runs %+v", img)
	}
	kid, _ := launchIn(t, f, root, "kid", runner.Settings{RestoreFrom: filepath.Join(dir, "snap")})
	if _, err := dial(t, f, kid).Snapshot(ctx, "snap2"); err != nil {
		t.Fatal(err)
	}
	if a, _ := f.Artifact(filepath.Join(kid, "snap2")); a.Kernel != Kernel || a.Rootfs != Rootfs {
		t.Fatalf("a restore's capture records %s %s, want its artifact's image", a.Kernel, a.Rootfs)
	}
	f.Fail = func(d string, step Step) error {
		if step == Ready && d == kid {
			return errors.New("not yet")
		}
		return nil
	}
	if dial(t, f, kid).Info().AgentConnected() || !dial(t, f, dir).Info().AgentConnected() {
		t.Fatal("the Ready hook did not hold back only its sandbox's agent")
	}
}
