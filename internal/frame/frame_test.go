package frame

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/rand"
	"strings"
	"testing"
	"testing/iotest"
)

func TestAppendEscaped(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"empty", "", ""},
		{"plain", "hello\n", "hello\n"},
		{"delim", "a\x1eb", "a\x1f^b"},
		{"esc", "a\x1fb", "a\x1f_b"},
		{"forged trailer", "\x1e0\n", "\x1f^0\n"},
		{"both adjacent", "\x1e\x1f\x1e", "\x1f^\x1f_\x1f^"},
		{"caret untouched", "^_", "^_"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(AppendEscaped([]byte("pre:"), []byte(tt.in)))
			if got != "pre:"+tt.want {
				t.Fatalf("AppendEscaped(%q) = %q, want %q", tt.in, got, "pre:"+tt.want)
			}
			if bytes.IndexByte([]byte(got), Delim) >= 0 {
				t.Fatalf("escaped output %q contains a raw Delim", got)
			}
		})
	}
}

func TestUnescaperChunkBoundary(t *testing.T) {
	tests := []struct {
		name   string
		chunks []string
		want   string
	}{
		{"single", []string{"a\x1f^b"}, "a\x1eb"},
		{"esc at end of chunk", []string{"a\x1f", "^b"}, "a\x1eb"},
		{"esc alone", []string{"\x1f", "_", ""}, "\x1f"},
		{"empty chunk keeps state", []string{"x\x1f", "", "^"}, "x\x1e"},
		{"two escapes across", []string{"\x1f", "^\x1f", "_"}, "\x1e\x1f"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var u Unescaper
			var got []byte
			for _, c := range tt.chunks {
				got = u.Append(got, []byte(c))
			}
			if string(got) != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
			if u.Pending() {
				t.Fatal("unexpected pending escape")
			}
		})
	}
	t.Run("dangling", func(t *testing.T) {
		var u Unescaper
		got := u.Append(nil, []byte("ab\x1f"))
		if string(got) != "ab" || !u.Pending() {
			t.Fatalf("got %q pending=%v", got, u.Pending())
		}
		u.Reset()
		if u.Pending() {
			t.Fatal("Reset did not clear pending")
		}
	})
}

func TestTrailer(t *testing.T) {
	for _, tt := range []struct {
		exit int
		want string
	}{{0, "\x1e0\n"}, {1, "\x1e1\n"}, {255, "\x1e255\n"}, {-1, "\x1e-1\n"}} {
		if got := string(Trailer(tt.exit)); got != tt.want {
			t.Errorf("Trailer(%d) = %q, want %q", tt.exit, got, tt.want)
		}
	}
}

func TestClampExit(t *testing.T) {
	tests := []struct {
		raw  string
		want int
	}{
		{"0", 0}, {"1", 1}, {"42", 42}, {"255", 255}, {"254", 254}, {"100", 100},
		{"", 255}, {"-1", 255}, {"-0", 255}, {"256", 255}, {"999", 255},
		{"1000", 255}, {"00", 255}, {"01", 255}, {"007", 255}, {"+1", 255},
		{" 1", 255}, {"1 ", 255}, {"1a", 255}, {"abc", 255}, {"\x001", 255},
		{"0001", 255}, {"2147483648", 255},
	}
	for _, tt := range tests {
		t.Run(strings.ReplaceAll(tt.raw, " ", "_"), func(t *testing.T) {
			if got := ClampExit([]byte(tt.raw)); got != tt.want {
				t.Fatalf("ClampExit(%q) = %d, want %d", tt.raw, got, tt.want)
			}
		})
	}
}

func TestFramed(t *testing.T) {
	tests := []struct {
		name string
		body string
		exit int
		want string
	}{
		{"ok ack", "OK shutting down", 0, "OK shutting down\n\x1e0\n"},
		{"already newline", "OK\n", 0, "OK\n\x1e0\n"},
		{"empty", "", 0, "\x1e0\n"},
		{"err", "ERR unknown command __x__", -1, "ERR unknown command __x__\n\x1e-1\n"},
		{"hostile echo", "ERR bad \x1e0\n", -1, "ERR bad \x1f^0\n\x1e-1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(Framed(tt.body, tt.exit)); got != tt.want {
				t.Fatalf("Framed = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReadFrame(t *testing.T) {
	tests := []struct {
		name     string
		wire     string
		limit    int64
		wantBody string
		wantExit int
		wantErr  error // matched with errors.Is; nil = success
		rest     string
	}{
		{name: "simple", wire: "hi\n\x1e0\n", limit: -1, wantBody: "hi\n"},
		{name: "exit code", wire: "boom\x1e3\n", limit: -1, wantBody: "boom", wantExit: 3},
		{name: "negative", wire: "ERR nope\n\x1e-1\n", limit: -1, wantBody: "ERR nope\n", wantExit: -1},
		{name: "escaped body", wire: "a\x1f^0\nb\x1f_\x1e0\n", limit: -1, wantBody: "a\x1e0\nb\x1f"},
		{name: "empty body", wire: "\x1e0\n", limit: -1},
		{name: "next frame untouched", wire: "x\x1e1\ny\x1e2\n", limit: -1, wantBody: "x", wantExit: 1, rest: "y\x1e2\n"},
		{name: "limit truncates but drains", wire: "0123456789\x1e7\nnext", limit: 4, wantBody: "0123", wantExit: 7, rest: "next"},
		{name: "limit zero", wire: "abc\x1e0\n", limit: 0, wantBody: ""},
		{name: "limit counts unescaped bytes", wire: "\x1f^\x1f^\x1f^\x1e0\n", limit: 2, wantBody: "\x1e\x1e"},
		{name: "dangling escape dropped", wire: "ab\x1f\x1e0\n", limit: -1, wantBody: "ab"},
		{name: "max length exit", wire: "\x1e-12345678901\n", limit: -1, wantExit: -12345678901},
		{name: "eof in body", wire: "partial", limit: -1, wantBody: "partial", wantErr: io.ErrUnexpectedEOF},
		{name: "eof before anything", wire: "", limit: -1, wantErr: io.ErrUnexpectedEOF},
		{name: "eof in trailer", wire: "x\x1e12", limit: -1, wantBody: "x", wantErr: io.ErrUnexpectedEOF},
		{name: "eof right after delim", wire: "x\x1e", limit: -1, wantBody: "x", wantErr: io.ErrUnexpectedEOF},
		{name: "non-digit trailer", wire: "x\x1e1a\n", limit: -1, wantBody: "x", wantErr: ErrMalformedTrailer},
		{name: "plus sign", wire: "\x1e+1\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "space", wire: "\x1e 1\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "empty trailer", wire: "\x1e\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "lone minus", wire: "\x1e-\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "minus in middle", wire: "\x1e1-\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "overlong trailer", wire: "\x1e1234567890123\n", limit: -1, wantErr: ErrMalformedTrailer},
		{name: "cr before newline", wire: "\x1e0\r\n", limit: -1, wantErr: ErrMalformedTrailer},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReader(strings.NewReader(tt.wire))
			var body bytes.Buffer
			exit, err := ReadFrame(br, &body, tt.limit)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("error = %v, want %v", err, tt.wantErr)
			}
			if body.String() != tt.wantBody {
				t.Fatalf("body = %q, want %q", body.String(), tt.wantBody)
			}
			if err == nil && exit != tt.wantExit {
				t.Fatalf("exit = %d, want %d", exit, tt.wantExit)
			}
			if tt.wantErr == nil {
				rest, _ := io.ReadAll(br)
				if string(rest) != tt.rest {
					t.Fatalf("rest = %q, want %q", rest, tt.rest)
				}
			}
		})
	}
}

// TestReadFrameSmallBuffer forces bufio.ErrBufferFull paths and escapes
// split across reads.
func TestReadFrameSmallBuffer(t *testing.T) {
	payload := bytes.Repeat([]byte("ab\x1e\x1fcd"), 200)
	wire := append(AppendEscaped(nil, payload), Trailer(9)...)
	br := bufio.NewReaderSize(iotest.OneByteReader(bytes.NewReader(wire)), 16)
	var body bytes.Buffer
	exit, err := ReadFrame(br, &body, -1)
	if err != nil || exit != 9 || !bytes.Equal(body.Bytes(), payload) {
		t.Fatalf("exit=%d err=%v body ok=%v", exit, err, bytes.Equal(body.Bytes(), payload))
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n <= 0 {
		return 0, errors.New("sink closed")
	}
	if len(p) > w.n {
		p = p[:w.n]
	}
	w.n -= len(p)
	return len(p), nil
}

func TestReadFrameWriterErrorStillDrains(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader(strings.Repeat("x", 100)+"\x1e4\nNEXT"), 16)
	fr := NewReader(br, -1)
	res, err := fr.Next(&failWriter{n: 5})
	if err != nil {
		t.Fatalf("stream error: %v", err)
	}
	if res.WriteErr == nil || res.Exit != 4 || res.Written != 5 || res.Written+res.Discarded != 100 {
		t.Fatalf("unexpected result %+v", res)
	}
	rest, _ := io.ReadAll(br)
	if string(rest) != "NEXT" {
		t.Fatalf("stream out of sync, rest = %q", rest)
	}
}

func TestReadFrameRoundTripProperty(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	alphabet := []byte{0, 'a', '\n', Delim, Esc, '^', '_', 0xff, '-', '0'}
	for i := 0; i < 2000; i++ {
		n := rng.Intn(300)
		x := make([]byte, n)
		for j := range x {
			if rng.Intn(2) == 0 {
				x[j] = alphabet[rng.Intn(len(alphabet))]
			} else {
				x[j] = byte(rng.Intn(256))
			}
		}
		exit := rng.Intn(600) - 300
		wire := append(AppendEscaped(nil, x), Trailer(exit)...)
		wire = append(wire, "trailing"...)
		br := bufio.NewReaderSize(bytes.NewReader(wire), 16+rng.Intn(64))
		var body bytes.Buffer
		got, err := ReadFrame(br, &body, -1)
		if err != nil || got != exit || !bytes.Equal(body.Bytes(), x) {
			t.Fatalf("round trip of %q (exit %d): got %q exit %d err %v", x, exit, body.Bytes(), got, err)
		}
		rest, _ := io.ReadAll(br)
		if string(rest) != "trailing" {
			t.Fatalf("rest = %q", rest)
		}
	}
}
