package fake

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/agentclient"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/framebuf"
)

type dirSink string

func (d dirSink) CreateFile(name string) (*os.File, error) {
	return os.OpenFile(filepath.Join(string(d), name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
}

// boot starts a fake machine and an agent client driving it.
func boot(t *testing.T, e *Engine, spec engine.Spec) (*Machine, *agentclient.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	m, err := e.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); m.Quit(context.Background()) })
	mux := channel.New(channel.Host, slog.Default())
	mux.Attach(m.Channel(), true)
	c := agentclient.New(slog.Default(), mux, 0)
	go c.Serve(ctx)
	return m.(*Machine), c
}

// run executes command and returns its output and exit status.
func run(t *testing.T, c *agentclient.Client, command string) (string, string) {
	t.Helper()
	st, err := c.Exec(context.Background(), command)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(st)
	return string(out), string(st.Status())
}

func screen(t *testing.T, m engine.Machine) framebuf.Image {
	t.Helper()
	b, err := m.Screendump(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	img, err := framebuf.ParsePPM(b)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func pixel(img framebuf.Image, x, y int) string {
	i := (y*img.Width + x) * 3
	return string(img.Pix[i : i+3])
}

func TestDisplayCommands(t *testing.T) {
	m, c := boot(t, New(slog.Default()), engine.Spec{Display: true})
	if err := c.WaitUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	img := screen(t, m)
	if img.Width != DisplayWidth || img.Height != DisplayHeight || pixel(img, 3, 4) != "\x00\x00\x00" {
		t.Fatalf("boot frame %dx%d, pixel %q", img.Width, img.Height, pixel(img, 3, 4))
	}
	for _, tc := range []struct {
		command, out, status string
		w, h                 int
		white                [2]int // a pixel that must be white after, {-1} for none
	}{
		{"draw 3 4", "", "0", DisplayWidth, DisplayHeight, [2]int{3, 4}},
		{"draw 159 95", "", "0", DisplayWidth, DisplayHeight, [2]int{159, 95}},
		{"draw 160 0", "draw: 160,0 is outside the 160x96 display\n", "1", DisplayWidth, DisplayHeight, [2]int{159, 95}},
		{"draw x 0", "draw: strconv.Atoi", "1", DisplayWidth, DisplayHeight, [2]int{3, 4}},
		{"resize 20 10", "", "0", 20, 10, [2]int{-1}},
		{"resize 0 10", "resize: 0x10 is outside", "1", 20, 10, [2]int{-1}},
		{"draw 19 9", "", "0", 20, 10, [2]int{19, 9}},
	} {
		t.Run(tc.command, func(t *testing.T) {
			out, status := run(t, c, tc.command)
			if !strings.HasPrefix(out, tc.out) || status != tc.status {
				t.Fatalf("%q: output %q status %q, want %q... status %q", tc.command, out, status, tc.out, tc.status)
			}
			img := screen(t, m)
			if img.Width != tc.w || img.Height != tc.h {
				t.Fatalf("frame %dx%d, want %dx%d", img.Width, img.Height, tc.w, tc.h)
			}
			if tc.white[0] >= 0 && pixel(img, tc.white[0], tc.white[1]) != "\xff\xff\xff" {
				t.Fatalf("pixel %v is not white", tc.white)
			}
		})
	}
}

func TestNoDisplay(t *testing.T) {
	m, c := boot(t, New(slog.Default()), engine.Spec{})
	if _, err := m.Screendump(context.Background()); !errors.Is(err, engine.ErrNoDisplay) {
		t.Fatalf("err = %v, want ErrNoDisplay", err)
	}
	if out, status := run(t, c, "draw 1 1"); status != "1" || !strings.Contains(out, "no display") {
		t.Fatalf("draw without a display: %q %q", out, status)
	}
}

// TestDisplayCapture: the frame crosses a capture, and a restore with
// another device set is refused as QEMU's is.
func TestDisplayCapture(t *testing.T) {
	e := New(slog.Default())
	m, c := boot(t, e, engine.Spec{Display: true})
	run(t, c, "draw 70 70")
	want := screen(t, m)
	ctx := context.Background()
	if err := m.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cap, err := m.Capture(ctx, dirSink(dir))
	if err != nil {
		t.Fatal(err)
	}
	in := &engine.Incoming{Dir: dir, Section: cap.Section}
	if _, err := e.Start(ctx, engine.Spec{Incoming: in}); !errors.Is(err, engine.ErrDeviceMismatch) {
		t.Fatalf("restore without the display: %v, want ErrDeviceMismatch", err)
	}
	r, err := e.Start(ctx, engine.Spec{Incoming: in, Display: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Quit(ctx)
	if err := r.LoadIncoming(ctx); err != nil {
		t.Fatal(err)
	}
	got := screen(t, r)
	if got.Width != want.Width || pixel(got, 70, 70) != "\xff\xff\xff" || string(got.Pix) != string(want.Pix) {
		t.Fatal("the restored frame differs from the captured one")
	}

	// And a machine without a display refuses a restore that asks for one.
	m2, _ := boot(t, e, engine.Spec{})
	m2.Pause(ctx)
	dir2 := t.TempDir()
	cap2, err := m2.Capture(ctx, dirSink(dir2))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Start(ctx, engine.Spec{Incoming: &engine.Incoming{Dir: dir2, Section: cap2.Section}, Display: true}); !errors.Is(err, engine.ErrDeviceMismatch) {
		t.Fatalf("restore with a display: %v, want ErrDeviceMismatch", err)
	}
}
