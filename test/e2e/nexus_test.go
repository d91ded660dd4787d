package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// nx is one nexus state directory under test, driving bin/nexus (built
// with -race) with the race-built nether.
type nx struct {
	t   *testing.T
	dir string
}

func newNexus(t *testing.T) *nx {
	t.Helper()
	needGuest(t)
	// Short: a sandbox's control socket lives under it.
	dir, err := os.MkdirTemp("", "nx-")
	if err != nil {
		t.Fatal(err)
	}
	return watchNexus(t, dir)
}

// watchNexus registers the end-of-test checks of a nexus state directory:
// every sandbox is removed, no nether of its runs on, and the directory
// goes.
func watchNexus(t *testing.T, dir string) *nx {
	t.Helper()
	x := &nx{t: t, dir: dir}
	t.Cleanup(func() {
		// Remove every sandbox, then check nothing of nexus's runs on.
		out, _, _ := x.run("ls", "--json")
		var sbs []struct{ ID string }
		json.Unmarshal([]byte(out), &sbs)
		for _, sb := range sbs {
			x.run("rm", "--force", sb.ID)
		}
		if left := nethersIn(filepath.Join(dir, "sandboxes")); len(left) > 0 {
			t.Errorf("nether processes outlived their sandboxes: %v", left)
			for _, pid := range left {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(dir, "sandboxes", "*", "nether.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s (tail):\n%s", l, tail(string(b), 1500))
			}
		}
		os.RemoveAll(dir)
	})
	return x
}

// run runs nexus and returns stdout, stderr and the exit code.
func (x *nx) run(args ...string) (string, string, int) {
	cmd := exec.Command(nexusBin, append([]string{"--state-dir", x.dir}, args...)...)
	cmd.Env = append(os.Environ(), "NEXUS_NETHER="+netherBin, "NETHER_GUEST_DIR="+guestDir)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		x.t.Fatalf("nexus %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// must runs nexus and fails the test unless it exits 0.
func (x *nx) must(args ...string) string {
	x.t.Helper()
	out, errs, code := x.run(args...)
	if code != 0 {
		x.t.Fatalf("nexus %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// ids are the ids create, fork and snapshot create print: the first
// field of each line ("<id>  <name>").
func ids(out string) []string {
	var ids []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			ids = append(ids, f[0])
		}
	}
	return ids
}

// ids1 is the one id of a command that made one record.
func ids1(out string) string {
	if all := ids(out); len(all) == 1 {
		return all[0]
	}
	return strings.TrimSpace(out) // not one record: the caller's lookup fails, naming it
}

// refused runs a request that must fail with exit code want, its message
// containing each of words.
func (x *nx) refused(want int, args []string, words ...string) {
	x.t.Helper()
	out, errs, code := x.run(args...)
	if code != want {
		x.t.Fatalf("nexus %s: exit %d, want %d\n%s%s", strings.Join(args, " "), code, want, out, errs)
	}
	for _, w := range words {
		if !strings.Contains(errs, w) {
			x.t.Fatalf("nexus %s: %q lacks %q", strings.Join(args, " "), errs, w)
		}
	}
}

type nxSandbox struct {
	ID, Name, State, Parent, Snapshot, Hostname, Pool, Reason, Plan, Admission string
}

func (x *nx) inspect(ref string) nxSandbox {
	x.t.Helper()
	var sb nxSandbox
	if err := json.Unmarshal([]byte(x.must("inspect", ref)), &sb); err != nil {
		x.t.Fatal(err)
	}
	return sb
}

func (x *nx) list() []nxSandbox {
	x.t.Helper()
	var sbs []nxSandbox
	if err := json.Unmarshal([]byte(x.must("ls", "--json")), &sbs); err != nil {
		x.t.Fatal(err)
	}
	return sbs
}

func (x *nx) state(ref string) string { return x.inspect(ref).State }

// nethersIn lists the live nether processes working in a directory under
// root.
func nethersIn(root string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd")
		if err != nil || filepath.Dir(cwd) != root {
			continue
		}
		if exe, _ := os.Readlink("/proc/" + e.Name() + "/exe"); filepath.Base(exe) == "nether" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestNexusLifecycle walks every legal edge of the lifecycle table and
// asks for every illegal one on the way, each refused with exit 3 and a
// message naming the sandbox, its state and the verb.
func TestNexusLifecycle(t *testing.T) {
	t.Parallel()
	x := newNexusFromBase(t) // "life" cold-boots; "doomed" is a fork
	x.must("create", "--name", "life", "--ram-mb", "256", "--app-port", "8000")
	illegal := func(state string, verbs ...string) {
		t.Helper()
		for _, v := range verbs {
			args := strings.Fields(v)
			x.refused(3, append(args, "life"), "sandbox life is "+state, "is not allowed")
		}
		if got := x.state("life"); got != state {
			t.Fatalf("after refused requests the state is %s, want %s", got, state)
		}
	}
	illegal("created", "stop", "pause", "resume")
	x.refused(3, []string{"snapshot", "create", "life"}, "sandbox life is created")

	x.must("start", "life")
	illegal("running", "start", "resume", "rm")
	nexusAppPortReachable(t, x, "life")
	x.must("exec", "life", "--", "echo one > /root/gen")
	snap := ids1(x.must("snapshot", "create", "life", "life-base"))
	if x.state("life") != "running" {
		t.Fatal("a snapshot moved the sandbox out of running")
	}
	if _, _, code := x.run("exec", "life", "--", "exit 7"); code != 7 {
		t.Errorf("nexus exec of 'exit 7' exited %d", code)
	}
	nexusExecIsTheGuestsShell(t, x, "life")

	// Pause and resume through two generations; the guest's state goes
	// with it.
	for gen := 1; gen <= 2; gen++ {
		x.must("pause", "life")
		illegal("paused", "stop", "pause", "start")
		x.refused(3, []string{"snapshot", "create", "life"}, "sandbox life is paused")
		x.must("resume", "life")
		x.must("exec", "life", "--", fmt.Sprintf("echo gen%d >> /root/gen", gen))
	}
	if out := x.must("exec", "life", "--", "cat /root/gen"); out != "one\ngen1\ngen2\n" {
		t.Errorf("after two pause/resume generations the guest has %q", out)
	}

	x.must("stop", "life")
	illegal("stopped", "stop", "pause", "resume")
	x.refused(3, []string{"snapshot", "create", "life"}, "is stopped", "a stopped sandbox has no memory to capture")
	x.must("start", "life") // stopped -> running boots again
	x.must("rm", "--force", "life")
	if _, _, code := x.run("inspect", "life"); code != 4 {
		t.Errorf("inspect of a removed sandbox exited %d, want 4", code)
	}

	// created -> removed, and a name freed by rm is free again.
	x.must("create", "--name", "life")
	x.refused(6, []string{"create", "--name", "life"}, "already exists")
	x.must("rm", "life")

	// A nether that dies is noticed by the next command: error, with the
	// reason, and an error sandbox can only be removed.
	x.must("fork", nxBaseSnap, "--name", "doomed")
	pid := nethersIn(filepath.Join(x.dir, "sandboxes"))
	if len(pid) != 1 {
		t.Fatalf("want one nether running, found %v", pid)
	}
	syscall.Kill(pid[0], syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for x.state("doomed") != "error" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	sb := x.inspect("doomed")
	if sb.State != "error" || !strings.Contains(sb.Reason, "without a final record") {
		t.Fatalf("a killed nether's sandbox: %+v", sb)
	}
	x.refused(3, []string{"start", "doomed"}, "sandbox doomed is error")
	x.must("rm", "doomed")
	x.must("snapshot", "rm", snap)
}

// TestNexusFork: four children of one snapshot, forked at once, each with
// its provenance and its own identity, memory and CRNG; a referenced
// snapshot cannot be removed, and can once its children are gone.
func TestNexusFork(t *testing.T) {
	t.Parallel()
	x := newNexusFromBase(t)
	x.must("fork", nxBaseSnap, "--name", "base")
	x.must("exec", "base", "--", "echo inherited > /root/marker")
	x.must("snapshot", "create", "base", "warm")
	t0 := time.Now()
	kids := ids(x.must("fork", "warm", "-n", "4", "--name", "kid"))
	t.Logf("nexus fork -n 4 took %s", time.Since(t0).Round(time.Millisecond))
	if len(kids) != 4 {
		t.Fatalf("fork -n 4 printed %q", kids)
	}
	base := x.inspect("base")
	seen := map[string]map[string]bool{"hostname": {}, "machine-id": {}, "urandom": {}}
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("kid-%d", i)
		sb := x.inspect(name)
		if sb.State != "running" || sb.Parent != base.ID || sb.Snapshot == "" {
			t.Errorf("%s: %+v", name, sb)
		}
		for what, cmd := range map[string]string{"hostname": "hostname", "machine-id": "cat /etc/machine-id", "urandom": "head -c 16 /dev/urandom | od -An -tx1"} {
			v := x.must("exec", name, "--", cmd)
			if seen[what][v] {
				t.Errorf("%s: %s %q is another child's too", name, what, v)
			}
			seen[what][v] = true
		}
		if out := x.must("exec", name, "--", "cat /root/marker"); out != "inherited\n" {
			t.Errorf("%s did not inherit the base's file: %q", name, out)
		}
	}
	// Each child's memory is its own.
	x.must("exec", "kid-1", "--", "echo mine > /root/marker")
	if out := x.must("exec", "kid-2", "--", "cat /root/marker"); out != "inherited\n" {
		t.Errorf("kid-2 sees kid-1's write: %q", out)
	}
	if out := x.must("exec", "base", "--", "cat /root/marker"); out != "inherited\n" {
		t.Errorf("the parent sees a child's write: %q", out)
	}
	tree := x.must("tree", "base")
	for _, want := range []string{"base (", "snapshot warm (", "kid-1 (", "kid-4 ("} {
		if !strings.Contains(tree, want) {
			t.Errorf("nexus tree lacks %q:\n%s", want, tree)
		}
	}
	if dot := x.must("tree", "--dot"); !strings.HasPrefix(dot, "digraph lineage {") {
		t.Errorf("nexus tree --dot: %q", dot)
	}
	x.refused(1, []string{"snapshot", "rm", "warm"}, "in use by 4 sandbox(es)", "kid-1", "kid-4")
	x.must(append([]string{"rm", "--force"}, kids...)...)
	x.must("snapshot", "rm", "warm")
	// Forking a running sandbox takes a snapshot of it first.
	kid := ids1(x.must("fork", "base"))
	if sb := x.inspect(kid); sb.Parent != base.ID || sb.Snapshot == "" {
		t.Errorf("a fork of a running sandbox: %+v", sb)
	}
	// The audit chain holds all of it, in order, linked.
	if out := x.must("audit", "verify"); !strings.HasPrefix(out, "audit chain intact: ") {
		t.Errorf("nexus audit verify: %q", out)
	}
	var recs []struct {
		Event, Outcome, Sandbox, Parent, Snapshot, Node string
	}
	if err := json.Unmarshal([]byte(x.must("audit", "ls", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	var events []string
	recs = recs[nxBaseAudits:] // the base's own: create boot snapshot rm
	for i, r := range recs {
		events = append(events, r.Event)
		refused := i == 6 // the snapshot rm while the children ran
		if r.Node == "" || refused != (r.Outcome != "ok") || refused && !strings.Contains(r.Outcome, "in use by 4") {
			t.Errorf("audit record %d: %+v", i, r)
		}
		if r.Event == "fork" && (r.Snapshot == "" || i > 0 && r.Parent != base.ID) { // the first: the base's fork of nxBaseSnap
			t.Errorf("a fork's audit record lacks its causes: %+v", r)
		}
	}
	want := "fork snapshot fork fork fork fork snapshot-rm rm rm rm rm snapshot-rm snapshot fork"
	if got := strings.Join(events, " "); got != want {
		t.Errorf("audit events:\n got %s\nwant %s", got, want)
	}
}

// TestNexusCorruptSnapshot: a snapshot whose files changed after commit
// is refused by name.
func TestNexusCorruptSnapshot(t *testing.T) {
	t.Parallel()
	x := newNexusFromBase(t)
	x.must("fork", nxBaseSnap, "--name", "src")
	id := ids1(x.must("snapshot", "create", "src", "fragile"))
	meta := filepath.Join(x.dir, "snapshots", id, "meta.json")
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(meta, bytes.Replace(b, []byte(`"kind"`), []byte(` "kind"`), 1), 0o600)
	x.refused(1, []string{"fork", "fragile"}, "snapshot fragile is corrupted")
}

// TestNexusKill9: a nexus killed in the middle of a fork or a snapshot
// leaves a store the next command reconciles: no half-born sandbox shown,
// no nether that no record knows, no artifact no record names.
func TestNexusKill9(t *testing.T) {
	x := newNexusFromBase(t)
	x.must("fork", nxBaseSnap, "--name", "src")
	x.must("snapshot", "create", "src", "s")
	for _, tc := range []struct {
		name  string
		args  []string
		after time.Duration
	}{
		{"mid-fork", []string{"fork", "s", "-n", "2"}, 300 * time.Millisecond},
		{"mid-snapshot", []string{"snapshot", "create", "src"}, 100 * time.Millisecond},
		{"mid-pause", []string{"pause", "src"}, 150 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(nexusBin, append([]string{"--state-dir", x.dir}, tc.args...)...)
			cmd.Env = append(os.Environ(), "NEXUS_NETHER="+netherBin, "NETHER_GUEST_DIR="+guestDir)
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(tc.after)
			cmd.Process.Kill()
			cmd.Wait()
			sbs := x.list() // reconciles
			pids := nethersIn(filepath.Join(x.dir, "sandboxes"))
			t.Logf("after kill -9 %s: %d sandboxes listed, %d nethers running", tc.name, len(sbs), len(pids))
			// Every nether that runs belongs to a listed, running sandbox.
			running := 0
			for _, sb := range sbs {
				if sb.State == "running" {
					running++
				}
			}
			if len(pids) != running {
				t.Errorf("%d nethers run for %d running sandboxes: %+v", len(pids), running, sbs)
			}
			snaps := x.must("snapshot", "ls", "--json")
			var ss []struct{ ID, Dir string }
			json.Unmarshal([]byte(snaps), &ss)
			// nxBaseSnap's record names the base's artifact, outside this
			// directory; every other record names one in it.
			own := 0
			for _, s := range ss {
				if s.Dir != nxBaseArt {
					own++
				}
			}
			ents, _ := os.ReadDir(filepath.Join(x.dir, "snapshots"))
			if len(ents) != own || own != len(ss)-1 {
				t.Errorf("%d artifacts on disk for %d snapshot records (the base's among them: %v)", len(ents), len(ss), own == len(ss)-1)
			}
			for _, sb := range sbs {
				if sb.Name != "src" {
					x.must("rm", "--force", sb.ID)
				}
			}
			// A pause that was cut short either parked (its nether goes
			// on and exits) or did not: src ends up paused or answering.
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				if x.state("src") == "paused" {
					x.must("resume", "src")
				}
				if out, _, code := x.run("exec", "src", "--", "echo alive"); code == 0 && out == "alive\n" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after kill -9 %s the sandbox neither answers nor is paused: %+v", tc.name, x.inspect("src"))
				}
			}
		})
	}
}

// TestNexusConcurrent: two nexus commands on one sandbox take turns: one
// stops it, the other waits for its lease, then finds it stopped.
func TestNexusConcurrent(t *testing.T) {
	t.Parallel()
	x := newNexusFromBase(t)
	x.must("fork", nxBaseSnap, "--name", "twice")
	type result struct {
		code int
		errs string
	}
	res := make(chan result, 2)
	for range 2 {
		go func() {
			_, errs, code := x.run("stop", "twice")
			res <- result{code, errs}
		}()
	}
	a, b := <-res, <-res
	if a.code+b.code != 3 || (a.code != 0 && b.code != 0) {
		t.Fatalf("two stops at once: exits %d (%s) and %d (%s); want one 0 and one 3", a.code, a.errs, b.code, b.errs)
	}
	if x.state("twice") != "stopped" {
		t.Fatalf("after two stops: %s", x.state("twice"))
	}
}

type nxPool struct {
	Snapshot             string
	Size, Members, Ready int
}

func (x *nx) pool(snap string) nxPool {
	x.t.Helper()
	var ps []nxPool
	if err := json.Unmarshal([]byte(x.must("pool", "ls", "--json")), &ps); err != nil {
		x.t.Fatal(err)
	}
	for _, p := range ps {
		if p.Snapshot == snap {
			return p
		}
	}
	return nxPool{}
}

// TestNexusPool: a fork of a snapshot with a warm pool claims members;
// every claim gets an identity no other member or claim had; the pool
// is topped up behind the claims; a snapshot with a pool is not removed.
func TestNexusPool(t *testing.T) {
	t.Parallel()
	x := newNexusFromBase(t)
	x.must("fork", nxBaseSnap, "--name", "pbase")
	snap := ids1(x.must("snapshot", "create", "pbase", "pwarm"))
	x.must("pool", "set", "pwarm", "--size", "3")
	if p := x.pool(snap); p.Size != 3 || p.Members != 3 {
		t.Fatalf("after pool set --size 3: %+v", p)
	}
	members := map[string]bool{}
	for _, sb := range x.list() {
		if sb.Pool != "" {
			members[sb.ID] = true
		}
	}
	t0 := time.Now()
	kids := ids(x.must("fork", "pwarm", "-n", "3", "--name", "claimed"))
	t.Logf("three claims took %s", time.Since(t0).Round(time.Millisecond))
	seen := map[string]map[string]bool{"hostname": {}, "machine-id": {}, "urandom": {}}
	for i, id := range kids {
		if !members[id] {
			t.Errorf("child %s was not a pool member: the fork restored instead of claiming", id)
		}
		sb := x.inspect(id)
		want := fmt.Sprintf("claimed-%d", i+1)
		if sb.Name != want || sb.Pool != "" || sb.State != "running" || sb.Hostname != want {
			t.Errorf("claimed child: %+v", sb)
		}
		if h := strings.TrimSpace(x.must("exec", id, "--", "hostname")); h != want {
			t.Errorf("claimed child's guest hostname %q, want %q", h, want)
		}
		for what, cmd := range map[string]string{"hostname": "hostname", "machine-id": "cat /etc/machine-id", "urandom": "head -c 16 /dev/urandom | od -An -tx1"} {
			v := x.must("exec", id, "--", cmd)
			if seen[what][v] {
				t.Errorf("%s: %s %q is another claim's too", id, what, v)
			}
			seen[what][v] = true
		}
	}
	// Topped up behind the claims, by a detached nexus pool fill.
	deadline := time.Now().Add(2 * time.Minute)
	for x.pool(snap).Ready < 3 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	if p := x.pool(snap); p.Ready != 3 {
		t.Fatalf("the pool was not topped up: %+v", p)
	}
	x.refused(1, []string{"snapshot", "rm", "pwarm"}, "in use by 3 sandbox(es)")
	x.must(append([]string{"rm", "--force"}, kids...)...)
	x.refused(1, []string{"snapshot", "rm", "pwarm"}, "has a warm pool of 3")
	x.must("pool", "set", "pwarm", "--size", "0")
	x.must("snapshot", "rm", "pwarm")
	if left := x.list(); len(left) != 1 {
		t.Errorf("after emptying the pool: %+v", left)
	}
}

// nexusExecIsTheGuestsShell: the red team's probes of exec. A line nether
// would read as its own verb is a usage error that never reaches nether
// (the sandbox stays running, nothing is written, no record is forged),
// and even nether's own control socket refuses to let a transfer read or
// write the files nexus reads from the sandbox's directory.
func nexusExecIsTheGuestsShell(t *testing.T, x *nx, ref string) {
	t.Helper()
	dir := filepath.Join(x.dir, "sandboxes", x.inspect(ref).ID)
	outBefore, _ := os.ReadFile(filepath.Join(dir, "nether.out"))
	for _, line := range []string{"__info__", "__shutdown__", "__park__ p", " __snapshot__ s1",
		"__get__ /etc/hostname nether.out", "__put__ nether.log /tmp/log"} {
		x.refused(2, []string{"exec", ref, "--", line}, "reserved control namespace")
	}
	if st := x.state(ref); st != "running" {
		t.Fatalf("after refused control lines the sandbox is %s", st)
	}
	for _, p := range []string{"p", "s1"} {
		if _, err := os.Stat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("a refused exec left %s in the sandbox's directory: %v", p, err)
		}
	}
	// --json exec: the API's format=json answer, and the command's status.
	out, _, code := x.run("--json", "exec", ref, "--", "echo hi; exit 3")
	var r struct {
		Output, Encoding string
		Exit             int
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.Output != "hi\n" || r.Encoding != "utf-8" || r.Exit != 3 || code != 3 {
		t.Errorf("--json exec: %q (exit %d, %v), want output hi, exit 3", out, code, err)
	}
	// A program whose name begins with __ still runs, given its path.
	if out := x.must("exec", ref, "--", "printf 'echo ran' > /tmp/__x && chmod +x /tmp/__x && cd /tmp && ./__x"); out != "ran\n" {
		t.Errorf("a guest program named __x: %q", out)
	}

	// Straight to nether: its stdout and stderr are nexus's nether.out and
	// nether.log, protected like nether.conf.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, filepath.Join(dir, "ctl.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, line := range []string{"__get__ /etc/hostname nether.out", "__get__ /etc/hostname nether.log",
		"__put__ nether.out /tmp/out", "__put__ nether.log /tmp/log", "__put__ nether.conf /tmp/conf"} {
		var out strings.Builder
		exit, err := c.Run(ctx, line, &out)
		if err == nil && exit == 0 {
			t.Errorf("nether ran %q: %q", line, out.String())
		} else if !strings.Contains(out.String()+fmt.Sprint(err), "nether's own") {
			t.Errorf("%q refused with %q (%v), want it named nether's own file", line, out.String(), err)
		}
	}
	if outAfter, _ := os.ReadFile(filepath.Join(dir, "nether.out")); !bytes.Equal(outBefore, outAfter) {
		t.Errorf("nether.out changed: %q -> %q", outBefore, outAfter)
	}
}

// nexusAppPortReachable: --app-port gives the sandbox a data socket that
// inspect names, and an HTTP request through it reaches the guest's
// server on that port.
func nexusAppPortReachable(t *testing.T, x *nx, ref string) {
	t.Helper()
	var d struct {
		DataSocket    string `json:"data_socket"`
		ControlSocket string `json:"control_socket"`
		Settings      struct {
			CPUs  int `json:"cpus"`
			RAMMB int `json:"ram_mb"`
		} `json:"settings"`
	}
	out := x.must("inspect", ref)
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatal(err)
	}
	if d.DataSocket == "" || d.ControlSocket == "" || d.Settings.CPUs != 1 || d.Settings.RAMMB != 256 {
		t.Fatalf("inspect of a running sandbox with --app-port: %s", out)
	}
	x.must("exec", ref, "--", "mkdir -p /tmp/www && echo served-by-the-guest > /tmp/www/index.html && "+
		"(cd /tmp/www && nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &) && "+
		"for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1")
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.DataSocket)
		}}}
	resp, err := hc.Get("http://guest/index.html")
	if err != nil {
		t.Fatalf("GET through the data socket %s: %v", d.DataSocket, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "served-by-the-guest\n" {
		t.Fatalf("through the data socket: %d %q", resp.StatusCode, body)
	}
	x.must("exec", ref, "--", "pkill -f '[h]ttp.server'; true")
}
