package api

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
)

// TestErrorMapping: every error kind answers its documented status, and
// nexus.Kind classifies wrapped errors.
func TestErrorMapping(t *testing.T) {
	for _, tc := range []struct {
		err    error
		kind   string
		status int
	}{
		{&lifecycle.IllegalTransitionError{Sandbox: "web", State: lifecycle.Paused, Verb: lifecycle.Pause}, "illegal_transition", 409},
		{fmt.Errorf("sandbox web: %w", &lifecycle.IllegalTransitionError{Sandbox: "web", State: lifecycle.Created, Verb: lifecycle.Stop}), "illegal_transition", 409},
		{fmt.Errorf("%w: no sandbox named %q", store.ErrNotFound, "x"), "not_found", 404},
		{fmt.Errorf("%w: sandbox web is busy", nexus.ErrBusy), "busy", 409},
		{fmt.Errorf("%w: a sandbox named %q already exists", store.ErrNameTaken, "web"), "name_taken", 409},
		{fmt.Errorf("%w: name %q", nexus.ErrInvalid, "-x"), "bad_request", 400},
		{fmt.Errorf("%w: 01AB is the start of 2 ids", store.ErrAmbiguous), "bad_request", 400},
		{fmt.Errorf("client: %w", client.ErrInvalidCommand), "bad_request", 400},
		{errors.New("its guest did not come up"), "internal", 500},
		{&apiError{status: 409, kind: kindInUse, err: errors.New("snapshot s is in use by 2 sandbox(es): a, b")}, "in_use", 409},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, tc.err)
		var eb errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
			t.Fatal(err)
		}
		if rec.Code != tc.status || eb.Kind != tc.kind || eb.Error != tc.err.Error() {
			t.Errorf("%v: answered %d %q %q, want %d %q", tc.err, rec.Code, eb.Kind, eb.Error, tc.status, tc.kind)
		}
	}
	if k := nexus.Kind(nil); k != "" {
		t.Errorf("Kind(nil) = %q, want \"\"", k)
	}
}

// TestSandboxRecords: create, list, inspect (by name, id and id prefix),
// a taken name, remove, and the record gone.
func TestSandboxRecords(t *testing.T) {
	e := newEnv(t)
	var sb nexus.Sandbox
	e.want(201, "POST", "/v1/sandboxes", `{"name": "web", "cpus": 2, "ram_mb": 256, "net": true}`, &sb)
	if sb.Name != "web" || sb.State != lifecycle.Created || sb.Config.CPUs != 2 || sb.Config.RAMMB != 256 || !sb.Config.Net || sb.ID == "" {
		t.Fatalf("created %+v", sb)
	}
	var unnamed nexus.Sandbox
	e.want(201, "POST", "/v1/sandboxes", "", &unnamed)
	if unnamed.Name != "" || unnamed.State != lifecycle.Created {
		t.Fatalf("an empty body made %+v, want an unnamed created sandbox", unnamed)
	}
	e.wantErr(409, "name_taken", "POST", "/v1/sandboxes", `{"name": "web"}`, "web")
	var all []nexus.Sandbox
	e.want(200, "GET", "/v1/sandboxes", "", &all)
	if len(all) != 2 || all[0].ID != sb.ID || all[1].ID != unnamed.ID {
		t.Fatalf("list %+v, want web then the unnamed one", all)
	}
	for _, ref := range []string{"web", sb.ID, sb.ID[:12]} {
		var got nexus.Sandbox
		e.want(200, "GET", "/v1/sandboxes/"+ref, "", &got)
		if got.ID != sb.ID {
			t.Fatalf("GET /v1/sandboxes/%s: %s, want %s", ref, got.ID, sb.ID)
		}
	}
	resp, body := e.do("DELETE", "/v1/sandboxes/web", "")
	if resp.StatusCode != 204 || len(body) != 0 {
		t.Fatalf("DELETE: %d %q, want 204 and no body", resp.StatusCode, body)
	}
	e.wantErr(404, "not_found", "GET", "/v1/sandboxes/web", "", "web")
	e.wantErr(400, "bad_request", "DELETE", "/v1/sandboxes/"+unnamed.ID+"?force=maybe", "", "force")
	e.want(204, "DELETE", "/v1/sandboxes/"+unnamed.ID+"?force=true", "", nil)
	e.want(200, "GET", "/v1/sandboxes", "", &all)
	if len(all) != 0 {
		t.Fatalf("after removing both: %+v", all)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "sandboxes", sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("the removed sandbox's directory: %v", err)
	}
}

// TestMalformedBodies: unknown fields are refused naming them, and so are
// wrong types, trailing data, oversized bodies and invalid settings;
// nothing is made by a refused request.
func TestMalformedBodies(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		method, path, body string
		status             int
		words              []string
	}{
		{"POST", "/v1/sandboxes", `{"name": "a", "disk_size": 64}`, 400, []string{`unknown field "disk_size"`}},
		{"POST", "/v1/sandboxes", `{"name": "a", "disk_size_mb": 5}`, 400, []string{"disk_size_mb 5", "out of range (8..1048576)"}},
		{"POST", "/v1/sandboxes", `{"name": "a", "run_as": "Bob"}`, 400, []string{"run_as Bob", "is not a user name"}},
		{"POST", "/v1/sandboxes", `{"name": "a", "rootfs": "rootfs.img"}`, 400, []string{"rootfs", "absolute path"}},
		{"POST", "/v1/sandboxes", `{"name": "a", "rootfs": "/nonexistent/rootfs.img"}`, 400, []string{"/nonexistent/rootfs.img does not exist"}},
		{"POST", "/v1/forks", `{"from": "x", "run_as": "no body"}`, 400, []string{"run_as", "no body"}},
		{"POST", "/v1/sandboxes", `{"name": "a", "cpus": "two"}`, 400, []string{"cpus"}},
		{"POST", "/v1/sandboxes", `{"name": "a"} {"name": "b"}`, 400, []string{"data after the JSON object"}},
		{"POST", "/v1/sandboxes", `{"name": "a"`, 400, []string{"not this route's JSON"}},
		{"POST", "/v1/sandboxes", `[1, 2]`, 400, []string{"not this route's JSON"}},
		{"POST", "/v1/sandboxes", `{"name": "-a"}`, 400, []string{"-a"}},
		{"POST", "/v1/sandboxes", `{"name": "a", "net_allow": "not-a-cidr"}`, 400, []string{"not-a-cidr"}},
		{"POST", "/v1/sandboxes", `{"name": "` + strings.Repeat("x", 2<<20) + `"}`, 413, []string{"over 1048576 bytes"}},
		{"POST", "/v1/sandboxes/a/start", `{"force": true}`, 400, []string{`unknown field "force"`}},
		{"POST", "/v1/sandboxes/a/exec", `{"cmd": "ls"}`, 400, []string{`unknown field "cmd"`}},
		{"POST", "/v1/sandboxes/a/exec", `{}`, 400, []string{"command"}},
		{"POST", "/v1/sandboxes/a/exec?format=xml", `{"command": "ls"}`, 400, []string{"xml"}},
		{"POST", "/v1/snapshots", `{"sandbox": "a", "label": "x"}`, 400, []string{`unknown field "label"`}},
		{"POST", "/v1/snapshots", `{}`, 400, []string{"sandbox"}},
		{"POST", "/v1/snapshots", `{"sandbox": "a", "name": "no spaces"}`, 400, []string{"no spaces"}},
		{"POST", "/v1/forks", `{"from": "s", "count": 2}`, 400, []string{`unknown field "count"`}},
		{"POST", "/v1/forks", `{"n": 2}`, 400, []string{"from"}},
		{"POST", "/v1/forks", `{"from": "s", "n": -1}`, 400, []string{"-1"}},
		{"POST", "/v1/forks", `{"from": "s", "n": 2, "names": ["a", "b", "c"]}`, 400, []string{"3 names for 2 children"}},
		{"PUT", "/v1/pools/s", `{}`, 400, []string{"size"}},
		{"PUT", "/v1/pools/s", `{"size": 3, "min": 1}`, 400, []string{`unknown field "min"`}},
		{"PUT", "/v1/pools/s", fmt.Sprintf(`{"size": %d}`, nexus.MaxPoolSize+1), 400, []string{"pool size"}},
		{"PUT", "/v1/pools/s", `{"size": -1}`, 400, []string{"pool size"}},
		{"PUT", "/v1/sandboxes/a/files", "bytes", 400, []string{"path"}},
		{"GET", "/v1/sandboxes/a/files?path=relative/f", "", 400, []string{"absolute"}},
	} {
		e.wantErr(tc.status, "bad_request", tc.method, tc.path, tc.body, tc.words...)
	}
	var all []nexus.Sandbox
	e.want(200, "GET", "/v1/sandboxes", "", &all)
	if len(all) != 0 {
		t.Fatalf("refused requests made sandboxes: %+v", all)
	}
}

// TestPoolSizeBound: the API's bound is PoolSet's own, at both ends.
func TestPoolSizeBound(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	if _, err := e.n.PoolSet(ctx, "nosuch", nexus.MaxPoolSize); nexus.Kind(err) != nexus.KindNotFound {
		t.Fatalf("PoolSet(%d) on a missing snapshot: %v, want not found (the size is legal)", nexus.MaxPoolSize, err)
	}
	if _, err := e.n.PoolSet(ctx, "nosuch", nexus.MaxPoolSize+1); err == nil || nexus.Kind(err) == nexus.KindNotFound {
		t.Fatalf("PoolSet(%d): %v, want the size refused before the snapshot is looked up", nexus.MaxPoolSize+1, err)
	}
	e.wantErr(404, "not_found", "PUT", "/v1/pools/nosuch", fmt.Sprintf(`{"size": %d}`, nexus.MaxPoolSize), "nosuch")
	e.wantErr(404, "not_found", "PUT", "/v1/pools/nosuch", `{"size": 0}`, "nosuch")
}

// TestRouteRefusals: the mux's own 404 and 405 answer in the API's JSON.
func TestRouteRefusals(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ method, path, allow string }{
		{"DELETE", "/v1/sandboxes", "GET, HEAD, POST"},
		{"PUT", "/v1/tree", "GET, HEAD"},
		{"GET", "/v1/sandboxes/x/start", "POST"},
		{"POST", "/v1/sandboxes/x", "DELETE, GET, HEAD"},
		{"PATCH", "/v1/pools/x", "PUT"},
	} {
		resp := e.want(405, tc.method, tc.path, "", nil)
		if got := resp.Header.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
		e.wantErr(405, "method_not_allowed", tc.method, tc.path, "", tc.method)
	}
	e.wantErr(404, "not_found", "GET", "/v1/nosuch", "", "no such route")
	e.wantErr(404, "not_found", "GET", "/v2/sandboxes", "", "no such route")
	e.wantErr(404, "not_found", "POST", "/v1/sandboxes/x/reboot", "", "no such route")
}

// TestMissingRefs: every route that names a sandbox or snapshot answers
// 404 not_found for one that does not exist.
func TestMissingRefs(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/v1/sandboxes/ghost", ""},
		{"DELETE", "/v1/sandboxes/ghost", ""},
		{"DELETE", "/v1/sandboxes/ghost?force=true", ""},
		{"POST", "/v1/sandboxes/ghost/start", ""},
		{"POST", "/v1/sandboxes/ghost/stop", ""},
		{"POST", "/v1/sandboxes/ghost/pause", ""},
		{"POST", "/v1/sandboxes/ghost/resume", ""},
		{"POST", "/v1/sandboxes/ghost/exec", `{"command": "true"}`},
		{"POST", "/v1/sandboxes/ghost/exec?format=json", `{"command": "true"}`},
		{"PUT", "/v1/sandboxes/ghost/files?path=/tmp/f", "data"},
		{"GET", "/v1/sandboxes/ghost/files?path=/tmp/f", ""},
		{"GET", "/v1/sandboxes/ghost/logs", ""},
		{"GET", "/v1/snapshots/ghost", ""},
		{"DELETE", "/v1/snapshots/ghost", ""},
		{"POST", "/v1/snapshots", `{"sandbox": "ghost"}`},
		{"POST", "/v1/forks", `{"from": "ghost", "n": 2}`},
		{"PUT", "/v1/pools/ghost", `{"size": 1}`},
		{"GET", "/v1/tree?ref=ghost", ""},
	} {
		e.wantErr(404, "not_found", tc.method, tc.path, tc.body, "ghost")
	}
	// Empty lists are [] (not null): a client iterates them as they are.
	for _, path := range []string{"/v1/sandboxes", "/v1/snapshots", "/v1/pools", "/v1/tree"} {
		_, b := e.do("GET", path, "")
		if strings.TrimSpace(string(b)) != "[]" {
			t.Errorf("GET %s on an empty state directory: %q, want []", path, b)
		}
	}
}

// TestIllegalTransitions: the lifecycle table's refusals are 409
// illegal_transition, and so is exec or a copy on a sandbox that does not
// run; a sandbox that never ran has no log (404).
func TestIllegalTransitions(t *testing.T) {
	e := newEnv(t)
	e.want(201, "POST", "/v1/sandboxes", `{"name": "box"}`, nil)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes/box/pause", ""},
		{"POST", "/v1/sandboxes/box/stop", ""},
		{"POST", "/v1/sandboxes/box/resume", ""},
		{"POST", "/v1/sandboxes/box/exec", `{"command": "true"}`},
		{"POST", "/v1/sandboxes/box/exec?format=json", `{"command": "true"}`},
		{"PUT", "/v1/sandboxes/box/files?path=/tmp/f", "data"},
		{"GET", "/v1/sandboxes/box/files?path=/tmp/f", ""},
		{"POST", "/v1/snapshots", `{"sandbox": "box"}`},
		{"POST", "/v1/forks", `{"from": "box"}`},
	} {
		e.wantErr(409, "illegal_transition", tc.method, tc.path, tc.body, "box", "created")
	}
	e.wantErr(404, "not_found", "GET", "/v1/sandboxes/box/logs", "", "never ran")
	// A running sandbox may not be removed without force.
	e.fakeGuest("live")
	e.wantErr(409, "illegal_transition", "DELETE", "/v1/sandboxes/live", "", "running", "stop it first, or remove it with force")
	e.wantErr(409, "illegal_transition", "POST", "/v1/sandboxes/live/start", "", "running")
}

// TestBusy: a sandbox another operation holds answers 409 busy once the
// lease wait runs out.
func TestBusy(t *testing.T) {
	e := newEnv(t)
	e.put(&store.Sandbox{ID: "01J0000000000000000000BUSY", Name: "held", State: lifecycle.Created, Hostname: "held", Created: time.Now().UTC(),
		Lease: &store.Lease{Op: "start", Holder: os.Getpid(), Expires: time.Now().Add(time.Hour)}})
	e.wantErr(409, "busy", "POST", "/v1/sandboxes/held/start", "", "busy", "held")
}

// TestCreateStartFails: a create whose start fails says which record it
// made, and the record stays created.
func TestCreateStartFails(t *testing.T) {
	e := newEnv(t)
	eb := e.wantErr(500, "internal", "POST", "/v1/sandboxes", `{"name": "doomed", "start": true}`, "doomed")
	if eb.Sandbox == nil || eb.Sandbox.Name != "doomed" || eb.Sandbox.ID == "" {
		t.Fatalf("the error does not carry the record: %+v", eb)
	}
	var sb nexus.Sandbox
	e.want(200, "GET", "/v1/sandboxes/"+eb.Sandbox.ID, "", &sb)
	if sb.State != lifecycle.Created {
		t.Fatalf("after a failed start: %s, want created", sb.State)
	}
}

// TestExecStream: output reaches the client as the guest writes it, the
// exit code is a trailer, and failures before the first byte are JSON
// errors while a failure after it is a trailer.
func TestExecStream(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("fake")
	// The guest holds its second chunk until the gate opens: the status
	// line and the first chunk arriving before it opens prove neither
	// was buffered. (Both are awaited on a goroutine: a server that
	// buffers would not even answer the headers.)
	type first struct {
		resp *http.Response
		br   *bufio.Reader
		line string
		err  error
	}
	got := make(chan first, 1)
	go func() {
		resp, err := e.srv.Client().Post(e.srv.URL+"/v1/sandboxes/fake/exec", "application/json", strings.NewReader(`{"command": "slow"}`))
		if err != nil {
			got <- first{err: err}
			return
		}
		br := bufio.NewReader(resp.Body)
		l, err := br.ReadString('\n')
		got <- first{resp: resp, br: br, line: l, err: err}
	}()
	var f first
	select {
	case f = <-got:
	case <-time.After(10 * time.Second):
		g.open()
		t.Fatal("the first chunk did not arrive while the command still ran: the output is not streamed")
	}
	if f.err != nil {
		t.Fatal(f.err)
	}
	resp, br := f.resp, f.br
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/octet-stream" || f.line != "one\n" {
		t.Fatalf("status %d, Content-Type %q, first chunk %q", resp.StatusCode, resp.Header.Get("Content-Type"), f.line)
	}
	if _, ok := resp.Trailer[TrailerExit]; !ok {
		t.Fatalf("the Trailer header does not declare %s: %v", TrailerExit, resp.Header)
	}
	if got := resp.Trailer.Get(TrailerExit); got != "" {
		t.Fatalf("the exit code is known before the command ended: %q", got)
	}
	g.open()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	if string(rest) != "two\n" || resp.Trailer.Get(TrailerExit) != "3" || resp.Trailer.Get(TrailerError) != "" {
		t.Fatalf("rest %q, trailers %v; want two and exit 3", rest, resp.Trailer)
	}

	// No output at all: still 200, an empty body and the trailer.
	resp2, err := e.srv.Client().Post(e.srv.URL+"/v1/sandboxes/fake/exec", "application/json", strings.NewReader(`{"command": "silent"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp2.Body)
	resp2.Body.Close()
	if resp2.StatusCode != 200 || len(b) != 0 || resp2.Trailer.Get(TrailerExit) != "7" {
		t.Fatalf("silent: %d %q %v", resp2.StatusCode, b, resp2.Trailer)
	}

	// A line nether would read as its own verb never reaches it: exec is
	// the guest's shell, not nether's control socket.
	for _, line := range []string{"__info__", "__shutdown__", " __park__ p", "\t__get__ /etc/passwd nether.out", "__snapshot__ s"} {
		before := len(g.received())
		body, _ := json.Marshal(map[string]string{"command": line})
		e.wantErr(400, "bad_request", "POST", "/v1/sandboxes/fake/exec", string(body), "reserved control namespace")
		e.wantErr(400, "bad_request", "POST", "/v1/sandboxes/fake/exec?format=json", string(body), "reserved control namespace")
		if got := g.received(); len(got) != before {
			t.Fatalf("exec %q sent nether %q", line, got[before:])
		}
	}

	// Another client drives the sandbox: a conflict to retry, not a fault.
	e.wantErr(409, "busy", "POST", "/v1/sandboxes/fake/exec", `{"command": "observer"}`, "read-only observer")
	e.wantErr(409, "busy", "POST", "/v1/snapshots", `{"sandbox": "fake", "name": "s"}`, "guest not quiescent")

	// nether refuses the command before any output: an ordinary error.
	e.wantErr(500, "internal", "POST", "/v1/sandboxes/fake/exec", `{"command": "refused"}`, "agent not connected")

	// The exchange breaks after output began: the status is out, so the
	// trailer says why and there is no exit code.
	resp3, err := e.srv.Client().Post(e.srv.URL+"/v1/sandboxes/fake/exec", "application/json", strings.NewReader(`{"command": "cut"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp3.Body)
	resp3.Body.Close()
	if resp3.StatusCode != 200 || string(b) != "partial\n" || resp3.Trailer.Get(TrailerError) == "" {
		t.Fatalf("cut: %d %q %v; want the partial output and %s", resp3.StatusCode, b, resp3.Trailer, TrailerError)
	}
	if v, ok := resp3.Trailer[TrailerExit]; ok && len(v) > 0 && v[0] != "" {
		t.Fatalf("cut: an exit code %q for a command whose end is unknown", v)
	}
}

// TestExecJSON: ?format=json buffers the output with the exit code, as
// text or, when it is not UTF-8, as base64.
func TestExecJSON(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("fake")
	g.open()
	var a nexus.ExecResult
	e.want(200, "POST", "/v1/sandboxes/fake/exec?format=json", `{"command": "slow"}`, &a)
	if a.Output != "one\ntwo\n" || a.Encoding != "utf-8" || a.Exit != 3 || a.Truncated {
		t.Fatalf("%+v", a)
	}
	e.want(200, "POST", "/v1/sandboxes/fake/exec?format=json", `{"command": "binary"}`, &a)
	raw, err := base64.StdEncoding.DecodeString(a.Output)
	if a.Encoding != "base64" || err != nil || string(raw) != "\xff\x1e\x00\xfe" || a.Exit != 0 {
		t.Fatalf("%+v (%q, %v)", a, raw, err)
	}
	e.wantErr(500, "internal", "POST", "/v1/sandboxes/fake/exec?format=json", `{"command": "refused"}`, "agent not connected")
}

// TestFiles: a file goes into a running sandbox and comes back out
// byte for byte, through a private temporary directory that is gone
// after; a missing guest file is an error.
func TestFiles(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("fake")
	data := make([]byte, 3<<20) // over the JSON bound: files are not bounded by it
	for i := range data {
		data[i] = byte(i * 7)
	}
	var put putFileAnswer
	e.want(200, "PUT", "/v1/sandboxes/fake/files?path=/srv/blob", string(data), &put)
	if put.Path != "/srv/blob" || put.Size != int64(len(data)) {
		t.Fatalf("%+v", put)
	}
	if got := g.file("/srv/blob"); string(got) != string(data) {
		t.Fatalf("the guest got %d bytes, want the %d sent", len(got), len(data))
	}
	resp, b := e.do("GET", "/v1/sandboxes/fake/files?path=/srv/blob", "")
	if resp.StatusCode != 200 || string(b) != string(data) || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("GET: %d, %d bytes, %q", resp.StatusCode, len(b), resp.Header.Get("Content-Type"))
	}
	// What the guest cannot give is the caller's mistake, each with the
	// status a REST client expects; a path the control line cannot carry
	// is refused before nether sees it.
	for _, tc := range []struct {
		path   string
		status int
		kind   string
		words  string
	}{
		{"/srv/nothing", 404, "not_found", "no such file"},
		{"/etc", 400, "bad_request", "not a regular file"},
		{"/dev/zero", 400, "bad_request", "not a regular file"},
		{"/tmp/fifo", 400, "bad_request", "not a regular file"},
		{"/root/secret", 403, "refused", "permission denied"},
		{"/srv/huge", 413, "too_large", "transfer limit"},
		{"/tmp/a%20b", 400, "bad_request", "blank"},
		{"/tmp/a%09b", 400, "bad_request", "blank"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			before := len(g.received())
			e.wantErr(tc.status, tc.kind, "GET", "/v1/sandboxes/fake/files?path="+tc.path, "", tc.words)
			if tc.words == "blank" {
				if got := g.received(); len(got) != before {
					t.Fatalf("nether was sent %q for a path it cannot carry", got[before:])
				}
				e.wantErr(tc.status, tc.kind, "PUT", "/v1/sandboxes/fake/files?path="+tc.path, "x", tc.words)
			}
		})
	}
	left, _ := filepath.Glob(filepath.Join(e.dir, ".api-*"))
	cps, _ := filepath.Glob(filepath.Join(g.dir, ".cp-*"))
	if len(left)+len(cps) > 0 {
		t.Fatalf("temporary files left: %v %v", left, cps)
	}
}

// TestLogs: the console log, whole or a range of it.
func TestLogs(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("fake")
	if err := os.WriteFile(filepath.Join(g.dir, "console.log"), []byte("booting\nready\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, b := e.do("GET", "/v1/sandboxes/fake/logs", "")
	if resp.StatusCode != 200 || string(b) != "booting\nready\n" || resp.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("%d %q %q", resp.StatusCode, b, resp.Header.Get("Content-Type"))
	}
	req, _ := http.NewRequest("GET", e.srv.URL+"/v1/sandboxes/fake/logs", nil)
	req.Header.Set("Range", "bytes=8-")
	r2, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(r2.Body)
	r2.Body.Close()
	if r2.StatusCode != 206 || string(b) != "ready\n" {
		t.Fatalf("a range: %d %q, want 206 ready", r2.StatusCode, b)
	}
}

// TestReconcile: a sandbox whose nether ended on its own stops showing as
// running at the next request, but not while any nexus holds a lease
// (reconciling then could take a nether being born for an orphan).
func TestReconcile(t *testing.T) {
	e := newEnv(t)
	dead := &store.Sandbox{ID: "01J00000000000000000000DED", Name: "gone", State: lifecycle.Running, Hostname: "gone",
		Created: time.Now().UTC(), PID: 1 << 22, PIDStart: 1} // no such process
	e.put(dead)
	held := &store.Sandbox{ID: "01J0000000000000000000HELD", Name: "held", State: lifecycle.Created, Hostname: "held",
		Created: time.Now().UTC(), Lease: &store.Lease{Op: "start", Holder: os.Getpid(), Expires: time.Now().Add(time.Hour)}}
	e.put(held)
	var sb nexus.Sandbox
	e.want(200, "GET", "/v1/sandboxes/gone", "", &sb)
	if sb.State != lifecycle.Running {
		t.Fatalf("reconciled while a lease was live: %s", sb.State)
	}
	held.Lease = nil
	e.put(held)
	e.want(200, "GET", "/v1/sandboxes/gone", "", &sb)
	if sb.State != lifecycle.Error || !strings.Contains(sb.Reason, "without a final record") {
		t.Fatalf("after its nether died: %s (%s), want error", sb.State, sb.Reason)
	}
}

// TestSnapshotInUse: removing a snapshot sandboxes depend on is 409
// in_use naming them, and it is kept.
func TestSnapshotInUse(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("kid")
	db, err := store.Open(e.dir)
	if err != nil {
		t.Fatal(err)
	}
	snap := &store.Snapshot{ID: "01J00000000000000000000SNP", Name: "base", Source: "01J0000000000000000000GONE", Dir: filepath.Join(e.dir, "snapshots", "01J00000000000000000000SNP"),
		Digest: "sha256:00", Created: time.Now().UTC(), Refs: []string{g.sb.ID}}
	if err := os.MkdirAll(snap.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *store.Tx) error { return tx.PutSnapshot(snap) }); err != nil {
		t.Fatal(err)
	}
	e.wantErr(409, "in_use", "DELETE", "/v1/snapshots/base", "", "kid")
	var got nexus.Snapshot
	e.want(200, "GET", "/v1/snapshots/base", "", &got)
	var all []nexus.Snapshot
	e.want(200, "GET", "/v1/snapshots", "", &all)
	if len(all) != 1 || all[0].ID != snap.ID {
		t.Fatalf("%+v", all)
	}
	e.want(204, "DELETE", "/v1/sandboxes/kid?force=true", "", nil)
	e.want(204, "DELETE", "/v1/snapshots/base", "", nil)
	e.wantErr(404, "not_found", "GET", "/v1/snapshots/base", "", "base")
	if _, err := os.Stat(snap.Dir); !os.IsNotExist(err) {
		t.Fatalf("the snapshot's directory: %v", err)
	}
}

func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t)
	resp, b := e.do("GET", "/v1/openapi.yaml", "")
	if resp.StatusCode != 200 || string(b) != string(OpenAPI) || resp.Header.Get("Content-Type") != "application/yaml" {
		t.Fatalf("%d %q, %d bytes", resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
	}
}

// TestAudit: the records of what the API did, and the chain's check.
func TestAudit(t *testing.T) {
	e := newEnv(t)
	var sb nexus.Sandbox
	e.want(201, "POST", "/v1/sandboxes", `{"name": "web"}`, &sb)
	e.want(204, "DELETE", "/v1/sandboxes/web", "", nil)
	var recs []store.AuditRecord
	e.want(200, "GET", "/v1/audit?sandbox="+sb.ID, "", &recs)
	if len(recs) != 2 || recs[0].Event != "create" || recs[1].Event != "rm" || recs[1].Prev == "" {
		t.Fatalf("GET /v1/audit: %+v", recs)
	}
	var head store.AuditHead
	e.want(200, "GET", "/v1/audit/verify", "", &head)
	if head.Records != 2 || len(head.Hash) != 64 {
		t.Fatalf("GET /v1/audit/verify: %+v", head)
	}
	e.want(200, "GET", "/v1/audit?sandbox=nobody", "", &recs)
	if len(recs) != 0 {
		t.Fatalf("the records of nobody: %+v", recs)
	}
}
