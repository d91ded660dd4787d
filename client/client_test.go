package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/frame"
)

// fakeServer answers __info__ with report (framed) and hands every other
// line to handle, which writes raw wire bytes. handle returning false
// closes the connection.
func fakeServer(t *testing.T, report string, handle controltest.Handler) string {
	t.Helper()
	return controltest.Server{Info: report, Handle: handle}.Start(t)
}

// always keeps the connection open without replying.
func always(string, io.Writer) bool { return true }

const v2Report = "proto_version=2\nbackend=kvm\narch=x86_64\nmax_output_bytes=1048576\n"

func dial(t *testing.T, sock string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func run(t *testing.T, c *Client, line string) (int, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out bytes.Buffer
	exit, err := c.Run(ctx, line, &out)
	return exit, out.String(), err
}

func TestHandshake(t *testing.T) {
	sock := fakeServer(t, v2Report, always)
	c := dial(t, sock)
	if c.ProtoVersion() != 2 {
		t.Fatalf("ProtoVersion = %d", c.ProtoVersion())
	}
	info := c.Info()
	if info["backend"] != "kvm" || info["arch"] != "x86_64" {
		t.Fatalf("Info = %v", info)
	}
	info["backend"] = "changed"
	if c.Info()["backend"] != "kvm" {
		t.Fatal("Info returned the internal map")
	}
	if got, want := c.fr.Limit, int64(1048576+bodySlack); got != want {
		t.Fatalf("default limit %d, want %d", got, want)
	}
}

func TestHandshakeLimits(t *testing.T) {
	tests := []struct {
		name   string
		report string
		proto  int
		limit  int64
	}{
		{"unlimited", "proto_version=2\nmax_output_bytes=0\n", 2, -1},
		{"missing cap", "proto_version=2\n", 2, defaultMaxOutput + bodySlack},
		{"no version means v1", "backend=hvf\n", 1, defaultMaxOutput + bodySlack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := dial(t, fakeServer(t, tt.report, always))
			if c.ProtoVersion() != tt.proto || c.fr.Limit != tt.limit {
				t.Fatalf("proto %d limit %d, want %d %d", c.ProtoVersion(), c.fr.Limit, tt.proto, tt.limit)
			}
		})
	}
}

func TestHandshakeRejected(t *testing.T) {
	sock := controltest.Server{Refuse: frame.Framed("ERR too many clients", -1)}.Start(t)
	_, err := Dial(context.Background(), sock)
	var ce *ControlError
	if !errors.As(err, &ce) || ce.Msg != "ERR too many clients" {
		t.Fatalf("Dial error = %v", err)
	}
}

func TestDialNoSocket(t *testing.T) {
	_, err := Dial(context.Background(), filepath.Join(t.TempDir(), "missing.sock"))
	if err == nil || !strings.Contains(err.Error(), "missing.sock") {
		t.Fatalf("Dial error = %v", err)
	}
}

func TestRunV2(t *testing.T) {
	replies := map[string][]byte{
		"echo hi":     []byte("hi\n\x1e0\n"),
		"false":       []byte("\x1e1\n"),
		"printf":      append(frame.AppendEscaped(nil, []byte("a\x1e5\nb\x1f")), frame.Trailer(0)...),
		"__bogus__":   frame.Framed("ERR unknown command __bogus__", -1),
		"errout":      []byte("ERROR: disk full\nmore\n\x1e2\n"),
		"errexit0":    []byte("ERR-looking output\n\x1e0\n"),
		"__put__ a b": frame.Framed("OK put 3 bytes", 0),
	}
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		r, ok := replies[line]
		if !ok {
			r = frame.Framed("ERR unexpected "+line, -1)
		}
		// Split the write so frames straddle reads.
		c.Write(r[:len(r)/2])
		time.Sleep(time.Millisecond)
		c.Write(r[len(r)/2:])
		return true
	})
	c := dial(t, sock)
	tests := []struct {
		line    string
		exit    int
		out     string
		ctrlMsg string
	}{
		{"echo hi", 0, "hi\n", ""},
		{"false", 1, "", ""},
		{"printf", 0, "a\x1e5\nb\x1f", ""},
		{"__bogus__", -1, "", "ERR unknown command __bogus__"},
		{"errout", 2, "ERROR: disk full\nmore\n", ""},
		{"errexit0", 0, "ERR-looking output\n", ""},
		{"__put__ a b", 0, "OK put 3 bytes\n", ""},
		{"echo hi\n", 0, "hi\n", ""}, // a trailing newline is tolerated
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			exit, out, err := run(t, c, tt.line)
			if exit != tt.exit || out != tt.out {
				t.Fatalf("exit %d out %q, want %d %q (err %v)", exit, out, tt.exit, tt.out, err)
			}
			if tt.ctrlMsg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *ControlError
			if !errors.As(err, &ce) || ce.Exit != tt.exit || ce.Msg != tt.ctrlMsg {
				t.Fatalf("err = %#v, want ControlError %q", err, tt.ctrlMsg)
			}
		})
	}
}

func TestQuery(t *testing.T) {
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		c.Write(frame.Framed("uptime_ms=5\ncommands=0", 0))
		return true
	})
	c := dial(t, sock)
	got, err := c.Query(context.Background(), "__stats__")
	if err != nil || got != "uptime_ms=5\ncommands=0\n" {
		t.Fatalf("Query = %q, %v", got, err)
	}
}

func TestBodyOverLimitDrained(t *testing.T) {
	big := strings.Repeat("0123456789", 100_000) // 1 MB, escaped-safe
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		switch line {
		case "big":
			c.Write([]byte(big))
			c.Write(frame.Trailer(7))
		default:
			c.Write(frame.Framed("next", 0))
		}
		return true
	})
	c := dial(t, sock)
	c.SetMaxBody(10)
	exit, out, err := run(t, c, "big")
	if !errors.Is(err, ErrTruncated) || exit != 7 || out != "0123456789" {
		t.Fatalf("exit %d out %q err %v", exit, out, err)
	}
	exit, out, err = run(t, c, "after")
	if err != nil || exit != 0 || out != "next\n" {
		t.Fatalf("reply after drained frame: exit %d out %q err %v", exit, out, err)
	}
	c.SetMaxBody(0)
	if _, out, err = run(t, c, "big"); err != nil || out != big {
		t.Fatalf("unlimited: len %d err %v", len(out), err)
	}
}

func TestV1Fallback(t *testing.T) {
	sock := fakeServer(t, "proto_version=1\n", func(line string, c io.Writer) bool {
		switch line {
		case "__put__ a b":
			c.Write([]byte("OK put\n"))
		case "__bogus__":
			c.Write([]byte("ERR unknown command __bogus__\n"))
		case "okframed":
			c.Write([]byte("OK from the shell\n\x1e0\n"))
		case "oklate":
			c.Write([]byte("OK starting\n"))
			time.Sleep(100 * time.Millisecond) // well inside the settle window
			c.Write([]byte("done\n\x1e3\n"))
		case "plain":
			c.Write([]byte("hello\n\x1e0\n"))
		}
		return true
	})
	c := dial(t, sock)
	if c.ProtoVersion() != 1 {
		t.Fatalf("ProtoVersion = %d", c.ProtoVersion())
	}
	tests := []struct {
		line string
		exit int
		out  string
		ctrl bool
	}{
		{"__put__ a b", 0, "OK put\n", false},
		{"__bogus__", -1, "", true},
		{"okframed", 0, "OK from the shell\n", false},
		{"oklate", 3, "OK starting\ndone\n", false},
		{"plain", 0, "hello\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			exit, out, err := run(t, c, tt.line)
			var ce *ControlError
			if exit != tt.exit || out != tt.out || errors.As(err, &ce) != tt.ctrl {
				t.Fatalf("exit %d out %q err %v", exit, out, err)
			}
			if !tt.ctrl && err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestServerClosesMidFrame(t *testing.T) {
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		c.Write([]byte("partial output"))
		return false
	})
	c := dial(t, sock)
	exit, out, err := run(t, c, "cmd")
	if err == nil {
		t.Fatalf("no error; exit %d out %q", exit, out)
	}
	if out != "partial output" {
		t.Fatalf("out %q", out)
	}
	if _, _, err2 := run(t, c, "again"); err2 == nil || !strings.Contains(err2.Error(), "unusable") {
		t.Fatalf("second Run after broken stream: %v", err2)
	}
}

func TestMalformedTrailer(t *testing.T) {
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		c.Write([]byte("x\x1ebogus\n"))
		return true
	})
	c := dial(t, sock)
	if _, _, err := run(t, c, "cmd"); !errors.Is(err, frame.ErrMalformedTrailer) {
		t.Fatalf("err = %v", err)
	}
}

func TestContextDeadlineAndCancel(t *testing.T) {
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		return true // never reply
	})
	t.Run("deadline", func(t *testing.T) {
		c := dial(t, sock)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Run(ctx, "sleep 100", nil)
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
			t.Fatalf("err = %v after %v", err, time.Since(start))
		}
	})
	t.Run("cancel", func(t *testing.T) {
		c := dial(t, sock)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := c.Run(ctx, "sleep 100", nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestInvalidCommand(t *testing.T) {
	c := dial(t, fakeServer(t, v2Report, always))
	for _, line := range []string{"true\nreboot", "echo \x1e0", "x\x00"} {
		if _, _, err := run(t, c, line); !errors.Is(err, ErrInvalidCommand) {
			t.Errorf("Run(%q) = %v", line, err)
		}
	}
}

// TestShellRefusesControlLines: Shell never sends a line nether would read
// as one of its own verbs, and sends every other line as it is.
func TestShellRefusesControlLines(t *testing.T) {
	var mu sync.Mutex
	var got []string
	sock := fakeServer(t, v2Report, func(line string, c io.Writer) bool {
		mu.Lock()
		got = append(got, line)
		mu.Unlock()
		c.Write(frame.Framed("ran", 0))
		return true
	})
	c := dial(t, sock)
	tests := []struct {
		line   string
		refuse bool
	}{
		{"__info__", true},
		{"__shutdown__", true},
		{"  __park__ p", true},
		{"\t__get__ /etc/passwd nether.out", true},
		{"\v\f__snapshot__", true},
		{"__no_such_verb__", true},
		{"__", true},
		{"./__info__", false},
		{"'__info__'", false},
		{"echo __info__", false},
		{"_info_", false},
		{"\u00a0__info__", false}, // a non-ASCII space is a path byte, as nether reads it
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			mu.Lock()
			got = nil
			mu.Unlock()
			_, err := c.Shell(context.Background(), tt.line, io.Discard)
			mu.Lock()
			sent := got
			mu.Unlock()
			if tt.refuse {
				if !errors.Is(err, ErrControlLine) || !errors.Is(err, ErrInvalidCommand) {
					t.Fatalf("Shell(%q) = %v, want ErrControlLine", tt.line, err)
				}
				if len(sent) != 0 {
					t.Fatalf("Shell(%q) sent %q", tt.line, sent)
				}
				return
			}
			if err != nil {
				t.Fatalf("Shell(%q) = %v", tt.line, err)
			}
			if len(sent) != 1 || sent[0] != tt.line {
				t.Fatalf("Shell(%q) sent %q", tt.line, sent)
			}
		})
	}
}
