package e2e

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/framebuf"
)

func observeCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func eventTexts(ev client.Events) string {
	var b strings.Builder
	for _, e := range ev.Lines {
		b.WriteString(e.Kind + " " + e.Text + "\n")
	}
	return b.String()
}

// TestTimelineAndCmdLog: a real sandbox's timeline across a snapshot
// (cursors return only later events), its command log with exits and CPU,
// and a fork of that snapshot, whose own timeline starts by naming where
// it came from.
func TestTimelineAndCmdLog(t *testing.T) {
	t.Parallel()
	base := sharedBase(t)
	sb := forkOf(t, base, "sandbox_id = obs-parent")
	c := sb.dial()
	ctx := observeCtx(t)
	mustRun(t, c, "echo one")
	if _, exit := run(t, c, "sh -c 'exit 7'"); exit != 7 {
		t.Fatalf("exit 7 came back as %d", exit)
	}
	mustRun(t, c, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")

	log, err := c.CmdLog(ctx)
	if err != nil {
		t.Fatalf("__cmdlog__: %v", err)
	}
	if len(log.Entries) != 3 {
		t.Fatalf("__cmdlog__ has %d entries, want 3: %+v", len(log.Entries), log.Entries)
	}
	want := []struct {
		exit int
		cmd  string
	}{{0, "echo one"}, {7, "sh -c 'exit 7'"}, {0, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"}}
	for i, e := range log.Entries {
		if e.Exit != want[i].exit || e.Command != want[i].cmd {
			t.Errorf("entry %d = %+v, want exit %d command %q", i, e, want[i].exit, want[i].cmd)
		}
		if i > 0 && e.MS < log.Entries[i-1].MS {
			t.Errorf("entry %d starts at %d ms, before the one before it (%d)", i, e.MS, log.Entries[i-1].MS)
		}
	}
	if busy := log.Entries[2].CPUMS; busy <= 0 {
		t.Errorf("a busy loop logged cpu_ms=%d", busy)
	}
	t.Logf("command log: %+v", log.Entries)

	ev, err := c.Events(ctx, 0)
	if err != nil {
		t.Fatalf("__events__: %v", err)
	}
	text := eventTexts(ev)
	for _, w := range []string{"LIFE start fork from=" + base + " parent=" + sharedID, "LIFE restored", "LIFE agent_up", "CMD start n=1 echo one", "CMD end n=2 exit=7"} {
		if !strings.Contains(text, w) {
			t.Errorf("__events__ has no %q:\n%s", w, text)
		}
	}
	cursor := ev.Cursor
	art := takeSnapshot(t, sb, c, "obs.snap")
	later, err := c.Events(ctx, cursor)
	if err != nil {
		t.Fatalf("__events__ %d: %v", cursor, err)
	}
	if len(later.Lines) != 1 || later.Lines[0].Kind != "LIFE" || !strings.HasPrefix(later.Lines[0].Text, "snapshot path=obs.snap pause_ms=") {
		t.Fatalf("events after %d: %s", cursor, eventTexts(later))
	}
	if later.Lines[0].Seq != cursor+1 || later.Cursor != cursor+1 {
		t.Errorf("after cursor %d: seq %d, new cursor %d", cursor, later.Lines[0].Seq, later.Cursor)
	}
	none, err := c.Events(ctx, later.Cursor)
	if err != nil || len(none.Lines) != 0 || none.Cursor != later.Cursor {
		t.Errorf("nothing new: %+v %v", none, err)
	}
	shutdown(t, sb, c)

	fork := forkOf(t, art, "sandbox_id = obs-child")
	fc := fork.dial()
	fev, err := fc.Events(ctx, later.Cursor)
	if err != nil {
		t.Fatalf("fork __events__: %v", err)
	}
	if fev.Cursor >= later.Cursor || len(fev.Lines) == 0 || fev.Lines[0].Seq != 1 {
		t.Fatalf("the fork's timeline answered the parent's cursor %d with cursor %d and %d events", later.Cursor, fev.Cursor, len(fev.Lines))
	}
	if first := fev.Lines[0].Text; !strings.HasPrefix(first, "start fork from="+art+" parent=obs-parent parent_generation=1 sandbox=obs-child") {
		t.Errorf("the fork's first event %q does not say where it came from", first)
	}
	if strings.Contains(eventTexts(fev), "echo one") {
		t.Errorf("the fork's timeline carries the parent's commands:\n%s", eventTexts(fev))
	}
	if flog, err := fc.CmdLog(ctx); err != nil || len(flog.Entries) != 0 {
		t.Errorf("the fork's command log: %+v %v, want empty", flog, err)
	}
}

// TestScreen: the serial console through the terminal emulator. A shell
// runs on the console in control mode, so the screen shows its prompt;
// text the guest prints on its console shows on __screen__;
// __screendiff__ returns the whole grid first and nothing when nothing
// changed.
// promptLine is a root shell's prompt on the screen, whose lines carry no
// trailing blanks.
var promptLine = regexp.MustCompile(`(?m)^# ?`)

func TestScreen(t *testing.T) {
	t.Parallel()
	base := sharedBase(t)
	sb := forkOf(t, base)
	c := sb.dial()
	ctx := observeCtx(t)
	mustRun(t, c, "echo screen-marker-42 > /dev/console")
	var scr client.Screen
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if scr, err = c.Screen(ctx); err != nil {
			t.Fatalf("__screen__: %v", err)
		}
		// The marker, and the console shell's prompt: a root image's
		// login shell reads /etc/profile first, which under TCG can still
		// be going on in a fork of a base captured seconds after its boot.
		if text := strings.Join(scr.Lines, "\n"); strings.Contains(text, "screen-marker-42") && promptLine.MatchString(text) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("__screen__ never showed what the guest printed and a shell prompt:\n%s", strings.Join(scr.Lines, "\n"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("screen (%dx%d, cursor %d,%d):\n%s", scr.Cols, scr.Rows, scr.CursorRow, scr.CursorCol, strings.Join(scr.Grid(), "\n"))
	if scr.Cols != 80 || scr.Rows != 24 {
		t.Errorf("screen is %dx%d, want 80x24", scr.Cols, scr.Rows)
	}
	if !promptLine.MatchString(strings.Join(scr.Lines, "\n")) {
		t.Errorf("no shell prompt on the console's screen")
	}
	first, err := c.ScreenDiff(ctx)
	if err != nil || len(first.Changed) != scr.Rows {
		t.Fatalf("first __screendiff__: %d rows, %v; want all %d", len(first.Changed), err, scr.Rows)
	}
	again, err := c.ScreenDiff(ctx)
	if err != nil || len(again.Changed) != 0 {
		t.Fatalf("__screendiff__ with nothing printed since: %+v, %v", again.Changed, err)
	}
	// An observer may read the screen, not the primary's diff.
	obs := sb.dial()
	if _, err := obs.Screen(ctx); err != nil {
		t.Errorf("observer __screen__: %v", err)
	}
	if _, err := obs.ScreenDiff(ctx); err == nil || !strings.Contains(err.Error(), "read-only observer") {
		t.Errorf("observer __screendiff__: %v, want the read-only refusal", err)
	}
}

// TestFrame: a gpu = 1 sandbox's display. __frame__ decodes as a PPM of
// the size it reports; text written to the guest's first VT changes
// tiles of __framediff__; a sandbox without gpu = 1 answers ERR naming
// the key; and a gpu = 1 restore of a base captured without a display is
// refused by name before any guest runs.
func TestFrame(t *testing.T) {
	t.Parallel()
	base := sharedBase(t)
	sb := start(t, "gpu = 1")
	c := sb.dial()
	ctx := observeCtx(t)
	if info := sb.info(c); info["gpu"] != "on" {
		t.Fatalf("__info__ gpu=%q", info["gpu"])
	}
	mustRun(t, c, "true") // the guest is up
	var raw bytes.Buffer
	if _, err := c.Run(ctx, "__frame__", &raw); err != nil {
		t.Fatalf("__frame__: %v", err)
	}
	img, err := framebuf.ParsePPM(raw.Bytes())
	if err != nil {
		t.Fatalf("__frame__ is not a PPM: %v", err)
	}
	if img.Width < 320 || img.Height < 200 || len(img.Pix) != img.Width*img.Height*3 {
		t.Fatalf("__frame__ is %dx%d with %d bytes of pixels", img.Width, img.Height, len(img.Pix))
	}
	t.Logf("frame %dx%d", img.Width, img.Height)
	first, err := c.FrameDiff(ctx)
	if err != nil || first.Width != img.Width || first.Height != img.Height {
		t.Fatalf("first __framediff__: %dx%d, %v", first.Width, first.Height, err)
	}
	var whole client.Frame
	first.Apply(&whole)
	mustRun(t, c, "printf '\\033[2J\\033[H%s\\n' 'FRAME MARKER FRAME MARKER FRAME MARKER' > /dev/tty1")
	var changed int
	deadline := time.Now().Add(20 * time.Second)
	for changed < 2 && time.Now().Before(deadline) {
		d, err := c.FrameDiff(ctx)
		if err != nil {
			t.Fatalf("__framediff__: %v", err)
		}
		d.Apply(&whole)
		changed += len(d.Tiles)
		time.Sleep(50 * time.Millisecond)
	}
	if changed < 2 {
		t.Fatalf("writing to /dev/tty1 changed %d tiles of the display", changed)
	}
	now, err := c.Frame(ctx)
	if err != nil {
		t.Fatalf("__frame__: %v", err)
	}
	if !bytes.Equal(now.RGB, whole.RGB) {
		// The VGA cursor blinks: allow a tile's worth of difference.
		diff := 0
		for i := range now.RGB {
			if now.RGB[i] != whole.RGB[i] {
				diff++
			}
		}
		if diff > 64*64*3 {
			t.Errorf("the frame rebuilt from diffs differs from __frame__ in %d bytes", diff)
		}
	}

	plain := forkOf(t, base)
	pc := plain.dial()
	for _, line := range []string{"__frame__", "__framediff__"} {
		if body, exit := run(t, pc, line); exit != -1 || !strings.Contains(body, "needs gpu = 1 in nether.conf") {
			t.Errorf("%s without gpu: %q exit %d", line, body, exit)
		}
	}
	refused := spawn(t, t.TempDir(), "restore = 1", "restore_from = "+base, "gpu = 1")
	if err := refused.h.Wait(time.Minute); err != nil {
		t.Fatalf("a gpu = 1 restore of a base without a display: %v", err)
	}
	if stderr := refused.stderr.String(); refused.h.ExitCode() == 0 || !strings.Contains(stderr, "was taken with gpu=0; this nether has gpu=1") {
		t.Errorf("a gpu = 1 restore of a base without a display: exit %d, stderr %q", refused.h.ExitCode(), tail(stderr, 600))
	}
}
