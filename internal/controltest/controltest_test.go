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

func TestTrickle(t *testing.T) {
	reply := []byte(Frame + "after")
	tests := []struct {
		name  string
		chunk int
	}{
		{"one byte", 1},
		{"five bytes", 5},
		{"zero means one", 0},
		{"larger than the reply", 1 << 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var writes [][]byte
			h := Trickle(func(line string, w io.Writer) bool {
				n, err := w.Write(reply)
				if n != len(reply) || err != nil {
					t.Errorf("Write = %d, %v", n, err)
				}
				return true
			}, tt.chunk)
			h("x", writerFunc(func(p []byte) (int, error) {
				writes = append(writes, append([]byte(nil), p...))
				return len(p), nil
			}))
			var joined []byte
			for _, w := range writes {
				if len(w) > max(tt.chunk, 1) {
					t.Fatalf("a write of %d bytes, chunk %d", len(w), tt.chunk)
				}
				joined = append(joined, w...)
			}
			if string(joined) != string(reply) {
				t.Fatalf("wrote %q, want %q", joined, reply)
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestObserveReplies pins the canned replies' shapes: each streamed verb
// is answered, and without gpu the frame commands answer a framed ERR.
func TestObserveReplies(t *testing.T) {
	tests := []struct {
		name string
		gpu  bool
		line string
		want string
	}{
		{"events", true, "__events__", EventsAll},
		{"frame", true, "__frame__", Frame},
		{"frame without gpu", false, "__frame__", "ERR __frame__ needs gpu = 1 in nether.conf\n\x1e-1\n"},
		{"framediff without gpu", false, "__framediff__", "ERR __framediff__ needs gpu = 1 in nether.conf\n\x1e-1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(ObserveReplies(tt.gpu)[tt.line]); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
	if len(FramePixels) != 2*2*3 {
		t.Fatalf("FramePixels is %d bytes, want a 2x2 frame's 12", len(FramePixels))
	}
	sock := Server{Info: "x=1", Handle: Trickle(Replies(ObserveReplies(true), nil), 3)}.Start(t)
	if got := exchange(t, sock, "__screendiff__"); got != ScreenDiff {
		t.Fatalf("trickled over the socket: got %q, want %q", got, ScreenDiff)
	}
}
