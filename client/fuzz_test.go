package client

import (
	"bufio"
	"bytes"
	"io"
	"testing"

	"github.com/nethersandbox/nether/internal/controltest"
)

// fuzzSeeds are the canned replies plus near misses; the committed corpus
// under testdata/fuzz adds hostile headers.
var fuzzSeeds = []string{
	controltest.EventsAll, controltest.EventsAfter2, controltest.EventsAfter7,
	controltest.CmdLog, controltest.NetLog, controltest.Screen, controltest.ScreenDiff,
	controltest.Frame, controltest.FrameDiff,
	"P6\n0 0\n255\n", "FRAMEDIFF 0 0 1 0\n", "EVENTS 0 0\n",
}

// wantHeaders indexes the header a fuzzed readPayload expects.
var wantHeaders = []string{"", headerEvents, headerCmdLog, headerNetLog, headerScreen, headerScreenDiff, headerFrame, headerFrameDiff}

// FuzzReadPayload feeds arbitrary bytes to the framing reader through a
// tiny buffer (so lines span many reads). It must not panic; it must copy
// exactly the bytes it consumed; and whatever it accepts as a frame must
// decode.
func FuzzReadPayload(f *testing.F) {
	for i, s := range fuzzSeeds {
		f.Add([]byte(s+"\x1e0\n"), uint8(i))
	}
	f.Fuzz(func(t *testing.T, data []byte, want uint8) {
		br := bufio.NewReaderSize(bytes.NewReader(data), 16)
		var out bytes.Buffer
		p, err := readPayload(br, &out, wantHeaders[int(want)%len(wantHeaders)])
		if p.consumed != int64(out.Len()) || !bytes.HasPrefix(data, out.Bytes()) {
			t.Fatalf("copied %q for %d consumed bytes of %q", out.Bytes(), p.consumed, data)
		}
		if err != nil {
			return
		}
		rest, _ := io.ReadAll(br)
		if out.Len()+len(rest) != len(data) {
			t.Fatalf("copied %d + left %d != %d bytes", out.Len(), len(rest), len(data))
		}
		payload := out.Bytes()
		var perr error
		switch {
		case bytes.HasPrefix(payload, []byte("P6\n")):
			_, perr = parseFrame(payload)
		case bytes.HasPrefix(payload, []byte("FRAMEDIFF ")):
			_, perr = parseFrameDiff(payload)
		}
		if perr != nil {
			t.Fatalf("framed payload %q does not decode: %v", payload, perr)
		}
	})
}

// FuzzParsers feeds arbitrary bytes to every decoder of a framed payload
// and to the helpers that use their results.
func FuzzParsers(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		parseEvents(data)
		parseCmdLog(data)
		parseNetLog(data)
		if s, err := parseScreen(data); err == nil {
			s.Grid()
		}
		parseScreenDiff(data)
		if fr, err := parseFrame(data); err == nil {
			if img := fr.Image(); img.Bounds().Dx() != fr.Width {
				t.Fatalf("image width %d, frame %d", img.Bounds().Dx(), fr.Width)
			}
		}
		if d, err := parseFrameDiff(data); err == nil && d.Width*d.Height <= 1<<16 {
			// Apply allocates the diff's frame size, which only the header
			// bounds; keep the fuzzer's frames small.
			var fr Frame
			d.Apply(&fr)
			if len(fr.RGB) != d.Width*d.Height*3 {
				t.Fatalf("applied frame holds %d bytes, want %d", len(fr.RGB), d.Width*d.Height*3)
			}
		}
		unescapeText(string(data))
	})
}
