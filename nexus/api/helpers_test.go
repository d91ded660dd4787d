package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/frame"
	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/lifecycle"
	"github.com/nethersandbox/nether/nexus/store"
)

// env is a Nexus on a fresh state directory and the API over it on an
// httptest server. Its nether is a script that exits 1 after a moment:
// nothing here boots a guest, and a start fails the way it does when a
// nether dies while starting.
type env struct {
	t   *testing.T
	n   *nexus.Nexus
	dir string
	srv *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	// Short, not t.TempDir(): nexus.Open refuses a state directory whose
	// sandboxes' control sockets would not fit sun_path.
	dir, err := os.MkdirTemp("", "nxapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(t.TempDir(), "failing-nether")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'nether: no guest in unit tests' >&2\nsleep 0.2\nexit 1\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	n, err := nexus.Open(context.Background(), nexus.Options{StateDir: dir, Nether: bin, ReadyTimeout: 5 * time.Second, LeaseWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(recording(NewHandler(n, nil)))
	t.Cleanup(srv.Close)
	return &env{t: t, n: n, dir: n.StateDir(), srv: srv}
}

// do sends a request and returns the answer with its body read.
func (e *env) do(method, path, body string) (*http.Response, []byte) {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	return resp, b
}

// want sends a request that must answer status, and decodes its JSON body
// into v (when v is not nil).
func (e *env) want(status int, method, path, body string, v any) *http.Response {
	e.t.Helper()
	resp, b := e.do(method, path, body)
	if resp.StatusCode != status {
		e.t.Fatalf("%s %s: status %d, want %d; body %s", method, path, resp.StatusCode, status, b)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			e.t.Fatalf("%s %s: decoding %s: %v", method, path, b, err)
		}
	}
	return resp
}

// wantErr sends a request that must fail with status and kind, its message
// containing each of words; it returns the error body.
func (e *env) wantErr(status int, kind, method, path, body string, words ...string) errorBody {
	e.t.Helper()
	var eb errorBody
	resp := e.want(status, method, path, body, &eb)
	if eb.Kind != kind {
		e.t.Fatalf("%s %s: kind %q, want %q (%s)", method, path, eb.Kind, kind, eb.Error)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		e.t.Fatalf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	for _, w := range words {
		if !strings.Contains(eb.Error, w) {
			e.t.Fatalf("%s %s: error %q lacks %q", method, path, eb.Error, w)
		}
	}
	return eb
}

// put writes a record straight into the store, as another nexus would.
func (e *env) put(sb *store.Sandbox) {
	e.t.Helper()
	db, err := store.Open(e.dir)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := db.Update(func(tx *store.Tx) error { return tx.PutSandbox(sb) }); err != nil {
		e.t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(e.dir, "sandboxes", sb.ID), 0o700); err != nil {
		e.t.Fatal(err)
	}
}

// fakeGuest is a running sandbox without a guest: its record says
// running with the pid of a sleep (alive, so reconciling keeps it
// running; a forced removal may signal it), and its control socket is a
// scripted stand-in for nether's.
type fakeGuest struct {
	sb  *store.Sandbox
	dir string // the sandbox's directory (nether's launch directory)

	mu    sync.Mutex
	files map[string][]byte // guest path -> bytes, for __put__ and __get__
	lines []string          // every line nether received, in order
	// gate holds the "slow" command between its two chunks until it is
	// opened.
	gate     chan struct{}
	openGate sync.Once
}

func (g *fakeGuest) open() { g.openGate.Do(func() { close(g.gate) }) }

func (e *env) fakeGuest(name string) *fakeGuest {
	e.t.Helper()
	g := &fakeGuest{files: map[string][]byte{}, gate: make(chan struct{})}
	stand := exec.Command("sleep", "600")
	if err := stand.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		stand.Process.Kill()
		stand.Wait()
	})
	g.sb = &store.Sandbox{ID: ulid.Make().String(), Name: name, State: lifecycle.Running, Hostname: name,
		Created: time.Now().UTC(), PID: stand.Process.Pid}
	e.put(g.sb)
	g.dir = filepath.Join(e.dir, "sandboxes", g.sb.ID)
	sock := controltest.Server{Info: "proto_version=2\nagent=connected", Handle: g.handle}.Start(e.t)
	// nexus dials <sandbox dir>/ctl.sock; connecting follows a symlink.
	if err := os.Symlink(sock, filepath.Join(g.dir, "ctl.sock")); err != nil {
		e.t.Fatal(err)
	}
	// Before the fake server's cleanup, which waits for its handlers.
	e.t.Cleanup(g.open)
	return g
}

// handle answers what the API's operations send a sandbox's nether.
func (g *fakeGuest) handle(line string, w io.Writer) bool {
	g.mu.Lock()
	g.lines = append(g.lines, line)
	g.mu.Unlock()
	f := strings.Fields(line)
	switch {
	case line == "slow":
		// Output in two chunks with a pause the test controls: a client
		// that sees "one" before it opens the gate sees a stream.
		w.Write([]byte("one\n"))
		<-g.gate
		w.Write([]byte("two\n"))
		w.Write(frame.Trailer(3))
	case line == "quick":
		w.Write(frame.Framed("hello", 0))
	case line == "silent":
		w.Write(frame.Trailer(7))
	case line == "binary":
		w.Write(frame.AppendEscaped(nil, []byte{0xff, 0x1e, 0x00, 0xfe}))
		w.Write(frame.Trailer(0))
	case line == "refused":
		// How nether answers when it cannot run a command at all.
		w.Write(frame.Framed("ERR agent not connected (guest not ready)", -1))
	case line == "observer":
		// How nether answers a second client while another drives it.
		w.Write(frame.Framed("ERR read-only observer: exec needs the primary client", -1))
	case f[0] == "__snapshot__":
		w.Write(frame.Framed("ERR snapshot: guest not quiescent: channel: 1 streams open (set snapshot_allow_dirty=1 to capture anyway)", -1))
	case line == "cut":
		// Output, then the connection drops before the trailer.
		w.Write([]byte("partial\n"))
		return false
	case len(f) == 3 && f[0] == "__put__":
		b, err := os.ReadFile(filepath.Join(g.dir, f[1]))
		if err != nil {
			w.Write(frame.Framed("ERR "+err.Error(), 1))
			break
		}
		g.mu.Lock()
		g.files[f[2]] = b
		g.mu.Unlock()
		w.Write(frame.Framed("", 0))
	case len(f) == 3 && f[0] == "__get__":
		g.mu.Lock()
		b, ok := g.files[f[1]]
		g.mu.Unlock()
		if !ok {
			// nether's own words for each way a guest file cannot be
			// read (control's ERR, the agent's reason).
			switch f[1] {
			case "/etc", "/dev/zero", "/tmp/fifo":
				w.Write(frame.Framed("ERR get: "+f[1]+": not a regular file", -1))
			case "/root/secret":
				w.Write(frame.Framed("ERR get: opening /root/secret: permission denied", -1))
			case "/srv/huge":
				w.Write(frame.Framed("ERR get: over the transfer limit of 1073741824 bytes", -1))
			default:
				w.Write(frame.Framed("ERR get: opening "+f[1]+": no such file or directory", -1))
			}
			break
		}
		if err := os.WriteFile(filepath.Join(g.dir, f[2]), b, 0o600); err != nil {
			w.Write(frame.Framed("ERR "+err.Error(), 1))
			break
		}
		w.Write(frame.Framed("", 0))
	default:
		w.Write(frame.Framed("unknown fake command "+line, 127))
	}
	return true
}

// received is every line nether has received so far.
func (g *fakeGuest) received() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.lines...)
}

func (g *fakeGuest) file(path string) []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return bytes.Clone(g.files[path])
}
