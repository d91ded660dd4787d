package e2e

import (
	"bufio"
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
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/testharness"
)

// nxAPI is `nexus serve` on a state directory under test, and a client
// of its socket.
type nxAPI struct {
	t    *testing.T
	sock string
	c    *http.Client
}

// serveAPI runs `nexus serve` (built with -race) on x's state directory.
// Its cleanup, which runs before x's, removes every sandbox over the API,
// stops the server with SIGTERM and checks it shut down cleanly and
// reported no data race.
func serveAPI(t *testing.T, x *nx) *nxAPI {
	t.Helper()
	sock := filepath.Join(x.dir, "api.sock")
	cmd := exec.Command(nexusBin, "--state-dir", x.dir, "serve", "--socket", sock, "-v")
	cmd.Env = append(os.Environ(), "NEXUS_NETHER="+netherBin, "NETHER_GUEST_DIR="+guestDir)
	stderr := &testharness.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	a := &nxAPI{t: t, sock: sock, c: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}}
	t.Cleanup(func() {
		var sbs []struct{ ID string }
		if a.call("GET", "/v1/sandboxes", "", &sbs) == 200 {
			for _, sb := range sbs {
				if code := a.call("DELETE", "/v1/sandboxes/"+sb.ID+"?force=true", "", nil); code != 204 {
					t.Errorf("cleanup: DELETE %s answered %d", sb.ID, code)
				}
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("nexus serve after SIGTERM: %v", err)
			}
		case <-time.After(45 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Errorf("nexus serve did not end within 45 s of SIGTERM")
		}
		if r := testharness.RaceReports(stderr.String()); r != "" {
			t.Errorf("DATA RACE in nexus serve:\n%s", r)
		}
		if _, err := os.Lstat(sock); !os.IsNotExist(err) {
			t.Errorf("nexus serve left its socket: %v", err)
		}
		if t.Failed() {
			t.Logf("nexus serve stderr (tail):\n%s", tail(stderr.String(), 6000))
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := a.c.Get("http://nexus/v1/openapi.yaml")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("nexus serve exited: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nexus serve does not answer on %s: %v\n%s", sock, err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return a
}

// call sends a request and decodes the JSON answer into v; it returns
// the status.
func (a *nxAPI) call(method, path, body string, v any) int {
	a.t.Helper()
	resp, b := a.raw(method, path, body)
	if v != nil && len(b) > 0 {
		if err := json.Unmarshal(b, v); err != nil {
			a.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

func (a *nxAPI) raw(method, path, body string) (*http.Response, []byte) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://nexus"+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	resp, err := a.c.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return resp, b
}

// must sends a request that must answer status.
func (a *nxAPI) must(status int, method, path, body string, v any) {
	a.t.Helper()
	resp, b := a.raw(method, path, body)
	if resp.StatusCode != status {
		a.t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, status, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			a.t.Fatalf("%s %s: decoding %q: %v", method, path, b, err)
		}
	}
}

type apiErr struct{ Error, Kind string }

// refused sends a request that must fail with status and kind, its
// message containing each of words.
func (a *nxAPI) refused(status int, kind, method, path, body string, words ...string) {
	a.t.Helper()
	var e apiErr
	if got := a.call(method, path, body, &e); got != status || e.Kind != kind {
		a.t.Fatalf("%s %s: %d %q (%s), want %d %q", method, path, got, e.Kind, e.Error, status, kind)
	}
	for _, w := range words {
		if !strings.Contains(e.Error, w) {
			a.t.Fatalf("%s %s: %q lacks %q", method, path, e.Error, w)
		}
	}
}

// exec runs command in ref over a streamed exec and returns its output,
// its exit code (from the trailer) and how long after the first byte of
// output the stream ended.
func (a *nxAPI) exec(ref, command string) (string, string, time.Duration) {
	a.t.Helper()
	body, _ := json.Marshal(map[string]string{"command": command})
	resp, err := a.c.Post("http://nexus/v1/sandboxes/"+ref+"/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		a.t.Fatalf("exec %q in %s: %d %s", command, ref, resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	var out bytes.Buffer
	var firstAt time.Time
	for {
		b, err := br.ReadByte()
		if err == io.EOF {
			break
		}
		if err != nil {
			a.t.Fatalf("exec %q: reading: %v", command, err)
		}
		if firstAt.IsZero() {
			firstAt = time.Now()
		}
		out.WriteByte(b)
	}
	if e := resp.Trailer.Get("Nexus-Error"); e != "" {
		a.t.Fatalf("exec %q: Nexus-Error %q", command, e)
	}
	var after time.Duration
	if !firstAt.IsZero() {
		after = time.Since(firstAt)
	}
	return out.String(), resp.Trailer.Get("Nexus-Exit-Code"), after
}

type apiSandbox struct {
	ID, Name, State, Parent, Snapshot, Hostname string
}

// TestNexusAPI drives nexus over its HTTP API against real guests:
// create and start, a streamed exec with its exit code in the trailer,
// files in and out, a snapshot, a fork of two with provenance, pause and
// resume and an illegal pause, a snapshot removal refused while its
// children live and allowed after, and every sandbox removed at the end.
func TestNexusAPI(t *testing.T) {
	t.Parallel()
	x := newNexus(t)
	a := serveAPI(t, x)
	if fi, err := os.Stat(a.sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the API socket: %v %v, want 0600", fi, err)
	}

	var base apiSandbox
	t0 := time.Now()
	a.must(201, "POST", "/v1/sandboxes", `{"name": "base", "ram_mb": 256, "start": true}`, &base)
	t.Logf("POST /v1/sandboxes with start: %s", time.Since(t0).Round(time.Millisecond))
	if base.State != "running" || base.ID == "" {
		t.Fatalf("created %+v, want running", base)
	}

	// Streamed: the first line arrives a second before the command ends.
	out, exit, after := a.exec("base", "echo one; sleep 1; echo two; exit 3")
	if out != "one\ntwo\n" || exit != "3" {
		t.Fatalf("exec: %q exit %q, want one two and exit 3", out, exit)
	}
	if after < 700*time.Millisecond {
		t.Fatalf("the output arrived %s before the stream ended; a streamed exec shows the first line while the command sleeps", after)
	}
	t.Logf("streamed exec: the first line came %s before the end", after.Round(time.Millisecond))
	var ans struct {
		Output, Encoding string
		Exit             int
	}
	a.must(200, "POST", "/v1/sandboxes/base/exec?format=json", `{"command": "echo buffered; exit 4"}`, &ans)
	if ans.Output != "buffered\n" || ans.Encoding != "utf-8" || ans.Exit != 4 {
		t.Fatalf("exec ?format=json: %+v", ans)
	}

	// Files in and out, byte for byte.
	blob := make([]byte, 300<<10)
	for i := range blob {
		blob[i] = byte(i*31 + i>>8)
	}
	a.must(200, "PUT", "/v1/sandboxes/base/files?path=/root/blob", string(blob), nil)
	if out, exit, _ := a.exec("base", "wc -c < /root/blob"); strings.TrimSpace(out) != fmt.Sprint(len(blob)) || exit != "0" {
		t.Fatalf("the guest's copy: %q (exit %s), want %d bytes", out, exit, len(blob))
	}
	resp, got := a.raw("GET", "/v1/sandboxes/base/files?path=/root/blob", "")
	if resp.StatusCode != 200 || !bytes.Equal(got, blob) {
		t.Fatalf("GET files: %d, %d bytes back of %d", resp.StatusCode, len(got), len(blob))
	}
	// What the guest cannot give is the caller's mistake, told apart
	// (the red team's probes: each was a 500).
	a.exec("base", "mkfifo /tmp/fifo")
	for _, tc := range []struct {
		path, kind string
		status     int
	}{
		{"/tmp/no-such-file", "not_found", 404},
		{"/etc", "bad_request", 400},
		{"/dev/zero", "bad_request", 400},
		{"/tmp/fifo", "bad_request", 400},
		{"/tmp/a%20b", "bad_request", 400},
		{"/tmp/a%09b", "bad_request", 400},
	} {
		a.refused(tc.status, tc.kind, "GET", "/v1/sandboxes/base/files?path="+tc.path, "")
	}
	if resp, logs := a.raw("GET", "/v1/sandboxes/base/logs", ""); resp.StatusCode != 200 || len(logs) == 0 {
		t.Fatalf("GET logs: %d, %d bytes", resp.StatusCode, len(logs))
	}

	// Snapshot, fork two.
	a.exec("base", "echo inherited > /root/marker")
	var snap struct{ ID, Name, Source string }
	a.must(201, "POST", "/v1/snapshots", `{"sandbox": "base", "name": "snap"}`, &snap)
	if snap.Name != "snap" || snap.Source != base.ID {
		t.Fatalf("snapshot %+v", snap)
	}
	var kids []apiSandbox
	t0 = time.Now()
	a.must(201, "POST", "/v1/forks", `{"from": "snap", "n": 2, "names": ["kid"]}`, &kids)
	t.Logf("POST /v1/forks n=2: %s", time.Since(t0).Round(time.Millisecond))
	if len(kids) != 2 {
		t.Fatalf("fork n=2 answered %d children", len(kids))
	}
	var all []apiSandbox
	a.must(200, "GET", "/v1/sandboxes", "", &all)
	byName := map[string]apiSandbox{}
	for _, sb := range all {
		byName[sb.Name] = sb
	}
	for _, name := range []string{"kid-1", "kid-2"} {
		sb, ok := byName[name]
		if !ok || sb.State != "running" || sb.Parent != base.ID || sb.Snapshot != snap.ID {
			t.Fatalf("%s in the list: %+v (ok %v); want running, parent %s, snapshot %s", name, sb, ok, base.ID, snap.ID)
		}
		if out, _, _ := a.exec(name, "cat /root/marker; hostname"); out != "inherited\n"+name+"\n" {
			t.Fatalf("%s: %q, want the parent's file and its own hostname", name, out)
		}
	}
	var tree []struct {
		Kind, Name string
		Children   []struct {
			Kind, Name string
			Children   []struct{ Kind, Name string }
		}
	}
	a.must(200, "GET", "/v1/tree?ref=base", "", &tree)
	if len(tree) != 1 || tree[0].Name != "base" || len(tree[0].Children) != 1 || tree[0].Children[0].Name != "snap" || len(tree[0].Children[0].Children) != 2 {
		t.Fatalf("tree of base: %+v", tree)
	}

	// Pause and resume; pausing a paused sandbox is illegal.
	var sb apiSandbox
	a.must(200, "POST", "/v1/sandboxes/kid-1/pause", "", &sb)
	if sb.State != "paused" {
		t.Fatalf("after pause: %s", sb.State)
	}
	a.refused(409, "illegal_transition", "POST", "/v1/sandboxes/kid-1/pause", "", "kid-1", "paused")
	a.refused(409, "illegal_transition", "POST", "/v1/sandboxes/kid-1/exec", `{"command": "true"}`, "kid-1", "paused")
	a.must(200, "POST", "/v1/sandboxes/kid-1/resume", "", &sb)
	if sb.State != "running" {
		t.Fatalf("after resume: %s", sb.State)
	}
	if out, exit, _ := a.exec("kid-1", "cat /root/marker"); out != "inherited\n" || exit != "0" {
		t.Fatalf("after resume: %q exit %s", out, exit)
	}

	// The snapshot is kept while its children live, and named users are
	// told; it goes once they are gone.
	a.refused(409, "in_use", "DELETE", "/v1/snapshots/snap", "", "kid-1", "kid-2")
	a.refused(409, "illegal_transition", "DELETE", "/v1/sandboxes/kid-2", "", "running")
	for _, k := range kids {
		a.must(204, "DELETE", "/v1/sandboxes/"+k.ID+"?force=true", "", nil)
	}
	a.must(204, "DELETE", "/v1/snapshots/snap", "", nil)
	a.refused(404, "not_found", "GET", "/v1/snapshots/snap", "", "snap")
	a.must(200, "POST", "/v1/sandboxes/base/stop", "", &sb)
	if sb.State != "stopped" {
		t.Fatalf("after stop: %s", sb.State)
	}
	// The cleanup removes base over the API.
}
