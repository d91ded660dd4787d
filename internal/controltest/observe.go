package controltest

import (
	"io"
	"time"

	"github.com/nethersandbox/nether/internal/frame"
)

// Canned replies of the streamed observe commands, byte for byte in the
// wire format of control protocol v2: no trailer, no escaping of the
// payload, each self-delimiting by its header. They describe one small
// sandbox, so tests can assert decoded values:
//
//   - a timeline whose ring holds events 4..7 (events 1..3 were dropped);
//   - two logged commands, one with a 0x1e in its (escaped) text;
//   - two egress attempts, one blocked;
//   - an 80x3 terminal with one line of scrollback and the cursor at row 2,
//     column 2, a tab escaped as \x09 in row 1;
//   - a 2x2 frame, and a 3x2 frame diff in 2-pixel tiles, whose pixels
//     include the bytes framing and a naive reader would trip on (0x1e,
//     0x1f, '\n', NUL and "ERR").
const (
	EventsAll = "EVENTS 7 4\n" +
		"4 900 LIFE boot\n" +
		"5 1200 CMD ls -la\n" +
		"6 1300 NET TCP 93.184.216.34:443 BLOCK\n" +
		"7 1450 LIFE snapshot \\x1b[1mbase\\x1b[0m \\\\ done\n"
	// EventsAfter5 answers "__events__ 5".
	EventsAfter5 = "EVENTS 7 2\n" +
		"6 1300 NET TCP 93.184.216.34:443 BLOCK\n" +
		"7 1450 LIFE snapshot \\x1b[1mbase\\x1b[0m \\\\ done\n"
	// EventsAfter2 answers "__events__ 2": events 3 has left the ring.
	EventsAfter2 = "EVENTS 7 4 dropped=1\n" +
		"4 900 LIFE boot\n" +
		"5 1200 CMD ls -la\n" +
		"6 1300 NET TCP 93.184.216.34:443 BLOCK\n" +
		"7 1450 LIFE snapshot \\x1b[1mbase\\x1b[0m \\\\ done\n"
	// EventsAfter7 answers "__events__ 7": nothing new.
	EventsAfter7 = "EVENTS 7 0\n"

	CmdLog = "CMDLOG 2\n" +
		"1200 exit=0 cpu_ms=3 ls -la\n" +
		"1500 exit=2 cpu_ms=41 make \\x1e test\n"

	NetLog = "NETLOG 2 dropped=5\n" +
		"1300 TCP 93.184.216.34:443 BLOCK\n" +
		"1310 UDP 10.0.2.3:53 ALLOW\n"

	Screen = "SCREEN 4 80 3 2 2\n" +
		"scrollback\n" +
		"$ ls\n" +
		"README  tab\\x09end\n" +
		"$\n"
	ScreenDiff = "SCREENDIFF 2 80 3 2 2\n" +
		"1 README  tab\\x09end\n" +
		"2 $\n"

	// FramePixels are the 2x2 RGB pixels of Frame.
	FramePixels = "\x1e\x1f\n" + "\x00\xff\x7f" + "ERR" + "\n\n\n"
	Frame       = "P6\n2 2\n255\n" + FramePixels

	// FrameDiff covers a 3x2 frame with a 2x2 tile and a 1x2 edge tile.
	FrameDiff = "FRAMEDIFF 3 2 2 2\n" +
		"0 0 2 2\n" + FramePixels +
		"2 0 1 2\n" + "\x01\x02\x03" + "\x1e\n\x1f"
)

// NoGPU is the framed control error of __frame__ or __framediff__ (verb)
// on a sandbox without gpu=1.
func NoGPU(verb string) []byte {
	return frame.Framed("ERR "+verb+" needs gpu = 1 in nether.conf", -1)
}

// ObserveReplies maps each streamed observe command line to its canned
// reply above, for Replies. Without gpu, __frame__ and __framediff__
// answer NoGPU, as nether does.
func ObserveReplies(gpu bool) map[string][]byte {
	m := map[string][]byte{
		"__events__":     []byte(EventsAll),
		"__events__ 5":   []byte(EventsAfter5),
		"__events__ 2":   []byte(EventsAfter2),
		"__events__ 7":   []byte(EventsAfter7),
		"__cmdlog__":     []byte(CmdLog),
		"__netlog__":     []byte(NetLog),
		"__screen__":     []byte(Screen),
		"__screendiff__": []byte(ScreenDiff),
		"__frame__":      []byte(Frame),
		"__framediff__":  []byte(FrameDiff),
	}
	if !gpu {
		m["__frame__"] = NoGPU("__frame__")
		m["__framediff__"] = NoGPU("__framediff__")
	}
	return m
}

// Trickle returns a Handler that passes h's replies on at most chunk bytes
// per write, pausing between writes so that each tends to reach the
// client in its own read: a reader that assumes a reply arrives whole, or
// that a pause ends it, fails against it.
func Trickle(h Handler, chunk int) Handler {
	return func(line string, w io.Writer) bool {
		return h(line, &trickleWriter{w: w, chunk: max(chunk, 1)})
	}
}

type trickleWriter struct {
	w     io.Writer
	chunk int
}

func (t *trickleWriter) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		if written > 0 {
			time.Sleep(200 * time.Microsecond)
		}
		n, err := t.w.Write(p[written:min(len(p), written+t.chunk)])
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
