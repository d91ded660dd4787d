package main

import (
	"bytes"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/frame"
)

// fakeNether answers a few lines the way nether would, and echoes any
// other line back framed, so a test can see the line nether-ctl sent.
// The observe commands get controltest's canned replies, trickled a few
// bytes at a time, with or without gpu.
func fakeNether(t *testing.T, gpu bool) string {
	t.Helper()
	replies := controltest.ObserveReplies(gpu)
	replies["exit 3"] = []byte("out\x1f^put\n\x1e3\n")
	replies["__bogus__"] = frame.Framed("ERR unknown command __bogus__", -1)
	replies["__screen__ 1"] = []byte("SCREEN 1 80 24 0 0\n") // a line short
	replies["__screen__ 2"] = []byte("SCREEN 80x24\n")
	return controltest.Server{
		Info: "proto_version=2\nmax_output_bytes=4",
		Handle: controltest.Trickle(controltest.Replies(replies, func(line string) []byte {
			return frame.Framed("echo:"+line, 0)
		}), 5),
	}.Start(t)
}

func TestRun(t *testing.T) {
	sock := fakeNether(t, true)
	noGPU := fakeNether(t, false)
	refusing := controltest.Server{Refuse: frame.Framed("ERR too many clients (limit 16)", -1)}.Start(t)
	tests := []struct {
		name       string
		args       []string
		exit       int
		stdout     string
		stderrPart string
	}{
		{"guest exit propagates", []string{sock, "exit", "3"}, 3, "out\x1eput\n", ""},
		{"args joined", []string{"-timeout", "5s", sock, "ls", "-la", "/tmp"}, 0, "echo:ls -la /tmp\n", ""},
		{"control error", []string{sock, "__bogus__"}, exitFailure, "", "ERR unknown command __bogus__\n"},
		{"refused at connect", []string{refusing, "__info__"}, exitFailure, "", "ERR too many clients (limit 16)\n"},
		{"missing socket", []string{filepath.Join(t.TempDir(), "x.sock"), "__info__"}, exitFailure, "", "is nether running with control_socket= set?"},
		{"no command", []string{sock}, exitFailure, "", "need a socket path and a command"},
		{"bad flag", []string{"-bogus", sock, "ls"}, exitFailure, "", "--help"},
		{"help", []string{"--help"}, 0, usage, ""},
		{"events", []string{sock, "__events__", "5"}, 0, controltest.EventsAfter5, ""},
		{"screen", []string{sock, "__screen__"}, 0, controltest.Screen, ""},
		{"frame as PPM", []string{sock, "__frame__"}, 0, controltest.Frame, ""},
		{"framediff", []string{sock, "__framediff__"}, 0, controltest.FrameDiff, ""},
		{"streamed command refused", []string{noGPU, "__frame__"}, exitFailure, "", "ERR __frame__ needs gpu = 1 in nether.conf\n"},
		{"streamed reply cut short", []string{"-timeout", "300ms", sock, "__screen__", "1"}, exitFailure, "SCREEN 1 80 24 0 0\n", "timed out"},
		{"streamed reply malformed", []string{sock, "__screen__", "2"}, exitFailure, "SCREEN 80x24\n", "malformed streamed reply"},
		{"png with another command", []string{"-png", "x.png", sock, "__screen__"}, exitFailure, "", "-png only applies to __frame__"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			exit := run(tt.args, &stdout, &stderr)
			if exit != tt.exit || stdout.String() != tt.stdout || !strings.Contains(stderr.String(), tt.stderrPart) {
				t.Fatalf("exit %d stdout %q stderr %q", exit, stdout.String(), stderr.String())
			}
		})
	}
}

func TestPNG(t *testing.T) {
	sock := fakeNether(t, true)
	noGPU := fakeNether(t, false)
	t.Run("saved", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "frame.png")
		var stdout, stderr bytes.Buffer
		if exit := run([]string{"-png", out, sock, "__frame__"}, &stdout, &stderr); exit != 0 || stdout.Len() != 0 {
			t.Fatalf("exit %d stdout %q stderr %q", exit, stdout.String(), stderr.String())
		}
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		img, err := png.Decode(f)
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() != 2 || b.Dy() != 2 {
			t.Fatalf("image bounds %v, want 2x2", b)
		}
		pix := controltest.FramePixels
		for i := range 4 {
			r, g, b, a := img.At(i%2, i/2).RGBA()
			want := [4]uint32{uint32(pix[i*3]), uint32(pix[i*3+1]), uint32(pix[i*3+2]), 0xff}
			if got := [4]uint32{r >> 8, g >> 8, b >> 8, a >> 8}; got != want {
				t.Errorf("pixel %d = %v, want %v", i, got, want)
			}
		}
	})
	t.Run("refused leaves no file", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "frame.png")
		var stdout, stderr bytes.Buffer
		exit := run([]string{"-png", out, noGPU, "__frame__"}, &stdout, &stderr)
		if exit != exitFailure || !strings.Contains(stderr.String(), "needs gpu = 1") {
			t.Fatalf("exit %d stderr %q", exit, stderr.String())
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("stat %s: %v", out, err)
		}
	})
	t.Run("unwritable path", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "missing", "frame.png")
		var stdout, stderr bytes.Buffer
		exit := run([]string{"-png", out, sock, "__frame__"}, &stdout, &stderr)
		if exit != exitFailure || !strings.Contains(stderr.String(), "saving the frame") {
			t.Fatalf("exit %d stderr %q", exit, stderr.String())
		}
	})
}
