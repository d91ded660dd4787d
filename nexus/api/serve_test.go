package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAdmit(t *testing.T) {
	for _, tc := range []struct {
		p    peer
		self int
		ok   bool
	}{
		{peer{uid: 1000}, 1000, true},
		{peer{uid: 0}, 0, true},
		{peer{uid: 0}, 1000, false}, // not even root: the socket is the owner's
		{peer{uid: 1001}, 1000, false},
		{peer{uid: 1000, err: errors.New("SO_PEERCRED: not supported")}, 1000, false}, // unknown: refused
		{peer{uid: -1, err: errors.New("not a Unix connection")}, 1000, false},
	} {
		if err := admit(tc.p, tc.self); (err == nil) != tc.ok {
			t.Errorf("admit(%+v, %d) = %v, want ok=%v", tc.p, tc.self, err, tc.ok)
		}
	}
}

// TestOwnerOnly: a request whose connection's peer is another user, or
// unknown, is answered 403 forbidden and never reaches the API.
func TestOwnerOnly(t *testing.T) {
	reached := 0
	h := ownerOnly(1000, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		w.WriteHeader(204)
	}), slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		status int
	}{
		{"owner", context.WithValue(context.Background(), peerKey{}, peer{uid: 1000}), 204},
		{"another user", context.WithValue(context.Background(), peerKey{}, peer{uid: 1001}), 403},
		{"credentials failed", context.WithValue(context.Background(), peerKey{}, peer{uid: 1000, err: errors.New("no")}), 403},
		{"no peer taken", context.Background(), 403},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/sandboxes", nil).WithContext(tc.ctx))
		if rec.Code != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, rec.Code, tc.status)
		}
		if tc.status == 403 {
			var eb errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || eb.Kind != "forbidden" || !strings.Contains(eb.Error, "owner-only") && !strings.Contains(eb.Error, "credentials") {
				t.Errorf("%s: %q (%v)", tc.name, rec.Body.String(), err)
			}
			if rec.Header().Get("Connection") != "close" {
				t.Errorf("%s: the connection is kept open", tc.name)
			}
		}
	}
	if reached != 1 {
		t.Fatalf("the API was reached %d times, want once (the owner)", reached)
	}
}

func unixClient(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// TestServe: the socket is 0600 and answers its owner; a second server
// on a live socket is refused; on cancel, a request in flight (a streamed
// exec) is let finish, new connections are not taken, and the socket is
// removed.
func TestServe(t *testing.T) {
	e := newEnv(t)
	g := e.fakeGuest("fake")
	sock := filepath.Join(e.dir, "api.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, e.n, sock, nil) }()
	c := unixClient(sock)
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := c.Get("http://nexus/v1/sandboxes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(string(b), `"fake"`) {
				t.Fatalf("GET /v1/sandboxes over the socket: %d %s", resp.StatusCode, b)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the socket does not answer: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the socket: %v %v, want a 0600 socket", fi.Mode(), err)
	}
	if err := Serve(ctx, e.n, sock, nil); err == nil || !strings.Contains(err.Error(), "served by a running process") {
		t.Fatalf("a second server on the live socket: %v", err)
	}

	// A streamed exec in flight when the server is told to stop.
	resp, err := c.Post("http://nexus/v1/sandboxes/fake/exec", "application/json", strings.NewReader(`{"command": "slow"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if l, err := br.ReadString('\n'); l != "one\n" || err != nil {
		t.Fatalf("first chunk %q %v", l, err)
	}
	cancel()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) with a request in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket is still there while shutting down: %v", err)
	}
	fresh := unixClient(sock)
	if r, err := fresh.Get("http://nexus/v1/sandboxes"); err == nil {
		r.Body.Close()
		t.Fatal("a new connection was taken while shutting down")
	}
	g.open()
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "two\n" || resp.Trailer.Get(TrailerExit) != "3" {
		t.Fatalf("the in-flight exec: %q %v, trailers %v", rest, err, resp.Trailer)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its last request ended")
	}
}
