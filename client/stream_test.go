package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/frame"
)

func TestStreamHeadersCoverProtocol(t *testing.T) {
	for _, sp := range cmdline.Protocol() {
		if sp.Reply == cmdline.Streamed && streamHeaders[sp.Name] == "" {
			t.Errorf("streamed verb %s has no reply header in streamHeaders", sp.Name)
		}
	}
}

// observeServer answers the streamed commands with controltest's canned
// replies, trickled chunk bytes at a time when chunk > 0, and "next"
// with a framed reply.
func observeServer(t *testing.T, gpu bool, chunk int) string {
	t.Helper()
	replies := controltest.ObserveReplies(gpu)
	replies["next"] = frame.Framed("next", 0)
	h := controltest.Replies(replies, func(line string) []byte {
		return frame.Framed("ERR unexpected "+line, -1)
	})
	if chunk > 0 {
		h = controltest.Trickle(h, chunk)
	}
	return fakeServer(t, v2Report, h)
}

func TestStreamedRun(t *testing.T) {
	tests := []struct {
		line string
		gpu  bool
		out  string
		ctrl string
	}{
		{"__events__", true, controltest.EventsAll, ""},
		{"__events__ 5", true, controltest.EventsAfter5, ""},
		{"__events__ 7", true, controltest.EventsAfter7, ""},
		{"__cmdlog__", true, controltest.CmdLog, ""},
		{"__netlog__", true, controltest.NetLog, ""},
		{"__screen__", true, controltest.Screen, ""},
		{"__screendiff__", true, controltest.ScreenDiff, ""},
		{"__frame__", true, controltest.Frame, ""},
		{"__framediff__", true, controltest.FrameDiff, ""},
		{"__frame__", false, "", "ERR __frame__ needs gpu = 1 in nether.conf"},
		{"__framediff__", false, "", "ERR __framediff__ needs gpu = 1 in nether.conf"},
	}
	for _, delivery := range []struct {
		name  string
		chunk int
	}{{"whole", 0}, {"byte by byte", 1}, {"7-byte writes", 7}} {
		t.Run(delivery.name, func(t *testing.T) {
			socks := map[bool]string{
				true:  observeServer(t, true, delivery.chunk),
				false: observeServer(t, false, delivery.chunk),
			}
			for _, tt := range tests {
				t.Run(tt.line, func(t *testing.T) {
					// One connection runs the reply and then a framed
					// command: it must find the next reply exactly where
					// the streamed one ended.
					c := dial(t, socks[tt.gpu])
					exit, out, err := run(t, c, tt.line)
					if out != tt.out {
						t.Fatalf("out %q, want %q (exit %d err %v)", out, tt.out, exit, err)
					}
					if tt.ctrl != "" {
						var ce *ControlError
						if !errors.As(err, &ce) || ce.Msg != tt.ctrl || exit != -1 {
							t.Fatalf("exit %d err %v, want ControlError %q", exit, err, tt.ctrl)
						}
					} else if err != nil || exit != 0 {
						t.Fatalf("exit %d err %v", exit, err)
					}
					if exit, out, err := run(t, c, "next"); err != nil || exit != 0 || out != "next\n" {
						t.Fatalf("next reply: exit %d out %q err %v", exit, out, err)
					}
				})
			}
		})
	}
}

// TestStreamedFollowedByNextReply sends the next command's reply in the
// same write as the streamed one: reading a byte too many would eat it.
func TestStreamedFollowedByNextReply(t *testing.T) {
	for line, payload := range controltest.ObserveReplies(true) {
		t.Run(line, func(t *testing.T) {
			sock := fakeServer(t, v2Report, func(got string, w io.Writer) bool {
				if got == line {
					w.Write(append(append([]byte(nil), payload...), frame.Framed("next", 0)...))
				}
				return true // "next" was answered already
			})
			c := dial(t, sock)
			if exit, out, err := run(t, c, line); err != nil || exit != 0 || out != string(payload) {
				t.Fatalf("exit %d out %q err %v", exit, out, err)
			}
			if exit, out, err := run(t, c, "next"); err != nil || exit != 0 || out != "next\n" {
				t.Fatalf("next reply: exit %d out %q err %v", exit, out, err)
			}
		})
	}
}

func TestObserveTyped(t *testing.T) {
	c := dial(t, observeServer(t, true, 3))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	last := Event{Seq: 7, MS: 1450, Kind: "LIFE", Text: "snapshot \x1b[1mbase\x1b[0m \\ done"}
	ring := []Event{
		{Seq: 4, MS: 900, Kind: "LIFE", Text: "boot"},
		{Seq: 5, MS: 1200, Kind: "CMD", Text: "ls -la"},
		{Seq: 6, MS: 1300, Kind: "NET", Text: "TCP 93.184.216.34:443 BLOCK"},
		last,
	}
	frame2x2 := Frame{Width: 2, Height: 2, RGB: []byte(controltest.FramePixels)}
	tests := []struct {
		name string
		get  func() (any, error)
		want any
	}{
		{"events whole ring", func() (any, error) { return c.Events(ctx, 0) }, Events{Cursor: 7, Lines: ring}},
		{"events after 5", func() (any, error) { return c.Events(ctx, 5) }, Events{Cursor: 7, Lines: ring[2:]}},
		{"events dropped", func() (any, error) { return c.Events(ctx, 2) }, Events{Cursor: 7, Dropped: 1, Lines: ring}},
		{"events none new", func() (any, error) { return c.Events(ctx, 7) }, Events{Cursor: 7, Lines: []Event{}}},
		{"cmdlog", func() (any, error) { return c.CmdLog(ctx) }, CmdLog{Entries: []CmdLogEntry{
			{MS: 1200, Exit: 0, CPUMS: 3, Command: "ls -la"},
			{MS: 1500, Exit: 2, CPUMS: 41, Command: "make \x1e test"},
		}}},
		{"netlog", func() (any, error) { return c.NetLog(ctx) }, NetLog{Dropped: 5, Entries: []NetLogEntry{
			{MS: 1300, Proto: "TCP", Addr: "93.184.216.34:443", Allowed: false},
			{MS: 1310, Proto: "UDP", Addr: "10.0.2.3:53", Allowed: true},
		}}},
		{"screen", func() (any, error) { return c.Screen(ctx) }, Screen{Cols: 80, Rows: 3, CursorRow: 2, CursorCol: 2,
			Lines: []string{"scrollback", "$ ls", "README  tab\tend", "$"}}},
		{"screendiff", func() (any, error) { return c.ScreenDiff(ctx) }, ScreenDiff{Cols: 80, Rows: 3, CursorRow: 2, CursorCol: 2,
			Changed: []ScreenRow{{1, "README  tab\tend"}, {2, "$"}}}},
		{"frame", func() (any, error) { return c.Frame(ctx) }, frame2x2},
		{"framediff", func() (any, error) { return c.FrameDiff(ctx) }, FrameDiff{Width: 3, Height: 2, Tile: 2, Tiles: []Tile{
			{X: 0, Y: 0, W: 2, H: 2, RGB: []byte(controltest.FramePixels)},
			{X: 2, Y: 0, W: 1, H: 2, RGB: []byte("\x01\x02\x03\x1e\n\x1f")},
		}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.get()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func TestScreenGrid(t *testing.T) {
	tests := []struct {
		name string
		s    Screen
		want []string
	}{
		{"scrollback", Screen{Rows: 2, Lines: []string{"a", "b", "c"}}, []string{"b", "c"}},
		{"exact", Screen{Rows: 2, Lines: []string{"b", "c"}}, []string{"b", "c"}},
		{"short reply", Screen{Rows: 5, Lines: []string{"c"}}, []string{"c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.Grid(); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Grid = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestFrameDiffApply(t *testing.T) {
	diff, err := parseFrameDiff([]byte(controltest.FrameDiff))
	if err != nil {
		t.Fatal(err)
	}
	var f Frame
	diff.Apply(&f) // a size change: the frame is replaced
	pix := controltest.FramePixels
	want := pix[0:6] + "\x01\x02\x03" + pix[6:12] + "\x1e\n\x1f"
	if f.Width != 3 || f.Height != 2 || string(f.RGB) != want {
		t.Fatalf("frame %dx%d %q, want 3x2 %q", f.Width, f.Height, f.RGB, want)
	}
	partial := FrameDiff{Width: 3, Height: 2, Tile: 2, Tiles: []Tile{{X: 2, Y: 1, W: 1, H: 1, RGB: []byte{9, 9, 9}}}}
	partial.Apply(&f)
	if want = want[:15] + "\x09\x09\x09"; string(f.RGB) != want {
		t.Fatalf("after a partial diff %q, want %q", f.RGB, want)
	}
	img := f.Image()
	if r, g, b, a := img.At(2, 1).RGBA(); r>>8 != 9 || g>>8 != 9 || b>>8 != 9 || a>>8 != 0xff {
		t.Fatalf("Image pixel (2,1) = %d %d %d %d", r>>8, g>>8, b>>8, a>>8)
	}
}

// TestStreamedMalformed covers replies the client must refuse: each is an
// error, and the connection is then refused for later commands, since
// where the next reply starts is unknown.
func TestStreamedMalformed(t *testing.T) {
	longLine := "EVENTS 1 1\n1 1 CMD " + strings.Repeat("x", MaxStreamLine) + "\n"
	tests := []struct {
		name    string
		line    string
		reply   string
		errPart string
	}{
		{"unknown header", "__events__", "FUTURE 1 2\n", "expected a reply with header EVENTS"},
		{"header of another shape", "__screen__", controltest.CmdLog, "expected a reply with header SCREEN"},
		{"missing count", "__cmdlog__", "CMDLOG\n", "no line count"},
		{"count not a number", "__cmdlog__", "CMDLOG -1\n", "not a non-negative integer"},
		{"count over the cap", "__events__", "EVENTS 1 2000000\n", "exceeds the client's limit"},
		{"unknown header field", "__cmdlog__", "CMDLOG 0 lost=3\n", "unknown field"},
		{"double space", "__screen__", "SCREEN 0  80 24 0 0\n", "empty field"},
		{"screen short header", "__screen__", "SCREEN 0 80 24\n", "wants 5 numbers"},
		{"line over the cap", "__events__", longLine, "longer than"},
		{"ppm with comment", "__frame__", "P6\n# made by nether\n1 1\n255\nabc", "frame width \"#\""},
		{"ppm maxval", "__frame__", "P6\n1 1\n65535\nabcdef", "maxval"},
		{"frame over the cap", "__frame__", "P6\n100000 100000\n255\n", "exceeds the client's limit"},
		{"tile outside the frame", "__framediff__", "FRAMEDIFF 2 2 2 1\n1 1 2 2\n", "does not fit"},
		{"too many tiles", "__framediff__", "FRAMEDIFF 2 2 1 5\n", "tile count 5 exceeds"},
		{"zero tile size", "__framediff__", "FRAMEDIFF 2 2 0 0\n", "tile size 0"},
		{"repeated tiles", "__framediff__", "FRAMEDIFF 3 1 2 2\n0 0 2 1\nabcdef0 0 2 1\nabcdef", "more pixels than"},
		{"header cut short", "__screen__", "SCR", "unexpected EOF"},
		{"lines cut short", "__cmdlog__", "CMDLOG 2\n1 exit=0 cpu_ms=0 a\n", "unexpected EOF"},
		{"pixels cut short", "__frame__", "P6\n2 2\n255\nabc", "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := fakeServer(t, v2Report, func(line string, w io.Writer) bool {
				w.Write([]byte(tt.reply))
				return !strings.Contains(tt.errPart, "EOF") // close to cut it short
			})
			c := dial(t, sock)
			_, _, err := run(t, c, tt.line)
			if err == nil || !strings.Contains(err.Error(), tt.errPart) {
				t.Fatalf("err = %v, want one containing %q", err, tt.errPart)
			}
			if !strings.Contains(tt.errPart, "EOF") && !errors.Is(err, ErrStreamFormat) {
				t.Fatalf("err = %v, want ErrStreamFormat", err)
			}
			if _, _, err := run(t, c, "__info__"); err == nil || !strings.Contains(err.Error(), "unusable") {
				t.Fatalf("command after a malformed reply: %v", err)
			}
		})
	}
}

// TestReadPayloadAnyHeader reads a reply to a streamed verb this client
// does not know (want ""): a known header is read, an unknown one is an
// error.
func TestReadPayloadAnyHeader(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		consume string
		errPart string
	}{
		{"known header", controltest.Screen + "rest", controltest.Screen, ""},
		{"unknown header", "VIDEO 3\nabc", "VIDEO 3\n", "unknown reply header \"VIDEO 3\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := readPayload(bufio.NewReader(strings.NewReader(tt.in)), &out, "")
			if tt.errPart == "" && err != nil || tt.errPart != "" && (err == nil || !strings.Contains(err.Error(), tt.errPart)) {
				t.Fatalf("err = %v, want %q", err, tt.errPart)
			}
			if out.String() != tt.consume {
				t.Fatalf("consumed %q, want %q", out.String(), tt.consume)
			}
		})
	}
}

// TestStreamedWriterFails checks that a failing writer does not leave the
// stream out of sync: the payload is still read to its end.
func TestStreamedWriterFails(t *testing.T) {
	c := dial(t, observeServer(t, true, 0))
	_, err := c.Run(context.Background(), "__frame__", failingWriter{})
	if err == nil || !strings.Contains(err.Error(), "writing reply body") {
		t.Fatalf("err = %v", err)
	}
	if exit, out, err := run(t, c, "next"); err != nil || exit != 0 || out != "next\n" {
		t.Fatalf("next reply: exit %d out %q err %v", exit, out, err)
	}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

// TestStreamedStalls checks that a reply stalling mid-payload is bounded
// by ctx alone: there is no idle timer to end it early, however long the
// pause.
func TestStreamedStalls(t *testing.T) {
	sock := fakeServer(t, v2Report, func(line string, w io.Writer) bool {
		w.Write([]byte("CMDLOG 2\n1 exit=0 cpu_ms=0 a\n"))
		if line == "__cmdlog__" {
			time.Sleep(700 * time.Millisecond) // longer than the old idle window
			w.Write([]byte("2 exit=0 cpu_ms=0 b\n"))
		}
		return true
	})
	t.Run("pause is not the end", func(t *testing.T) {
		c := dial(t, sock)
		log, err := c.CmdLog(context.Background())
		if err != nil || len(log.Entries) != 2 {
			t.Fatalf("CmdLog = %+v, %v", log, err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		c := dial(t, sock)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := c.Run(ctx, "__cmdlog__", nil)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
	})
}
