package controltest

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/frame"
)

// exchange sends lines on a fresh connection to sock and returns all it
// reads until the server closes or goes quiet.
func exchange(t *testing.T, sock string, lines ...string) string {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, l := range lines {
		// A server that refuses or hangs up may be gone before a line
		// leaves (EPIPE); what it sent first is still there to read.
		if _, err := io.WriteString(c, l+"\n"); err != nil {
			break
		}
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	var b strings.Builder
	io.Copy(&b, bufio.NewReader(c))
	return b.String()
}

func TestServer(t *testing.T) {
	replies := Replies(map[string][]byte{"known": []byte("k\x1e0\n")}, func(line string) []byte {
		if line == "silent" {
			return nil
		}
		return frame.Framed("other:"+line, 0)
	})
	tests := []struct {
		name  string
		srv   Server
		lines []string
		want  string
	}{
		{"info is the framed report", Server{Info: "proto_version=2", Handle: replies}, []string{"__info__"}, "proto_version=2\n\x1e0\n"},
		{"scripted reply", Server{Info: "x=1", Handle: replies}, []string{"known"}, "k\x1e0\n"},
		{"fallback reply", Server{Info: "x=1", Handle: replies}, []string{"a b"}, "other:a b\n\x1e0\n"},
		{"no reply", Server{Info: "x=1", Handle: replies}, []string{"silent"}, ""},
		{"replies in order", Server{Info: "x=1", Handle: replies}, []string{"known", "__info__"}, "k\x1e0\nx=1\n\x1e0\n"},
		{"no Info: __info__ is handled", Server{Handle: replies}, []string{"__info__"}, "other:__info__\n\x1e0\n"},
		{"no Handle: no reply", Server{Info: "x=1"}, []string{"known"}, ""},
		{"refusal", Server{Refuse: []byte("ERR go away\n\x1e-1\n"), Handle: replies}, []string{"known"}, "ERR go away\n\x1e-1\n"},
		{"handler closes", Server{Handle: func(string, io.Writer) bool { return false }}, []string{"x", "y"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := exchange(t, tt.srv.Start(t), tt.lines...); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestSocketPathShort(t *testing.T) {
	for range 3 {
		if p := SocketPath(t); len(p) >= 104 {
			t.Fatalf("socket path %d bytes long: %s", len(p), p)
		}
	}
}
