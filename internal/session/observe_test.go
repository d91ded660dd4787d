package session

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

// logLines splits a streamed log reply into its header and lines, and
// checks the header's count.
func logLines(t *testing.T, reply string, countField int) (header []string, lines []string) {
	t.Helper()
	head, body, _ := strings.Cut(reply, "\n")
	header = strings.Fields(head)
	if body != "" {
		lines = strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	}
	if len(header) <= countField || header[countField] != strconv.Itoa(len(lines)) {
		t.Fatalf("header %q announces a count that is not the %d lines that follow:\n%s", head, len(lines), reply)
	}
	return header, lines
}

// The timeline and the command log of a booted sandbox, across a
// snapshot, and in its fork, which starts its own timeline naming where it
// came from.
func TestEventsAndCmdLog(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "sandbox_id = parent-1")
	c := sb.dial()
	mustRun(t, c, "echo hi")
	run(t, c, "exit -1") // a hostile trailer: the agent sends "-1"
	mustRun(t, c, "__snapshot__ base")

	_, cmds := logLines(t, mustRun(t, c, "__cmdlog__"), 1)
	if len(cmds) != 2 || !regexp.MustCompile(`^\d+ exit=0 cpu_ms=\d+ echo hi$`).MatchString(cmds[0]) ||
		!regexp.MustCompile(`^\d+ exit=255 cpu_ms=\d+ exit -1$`).MatchString(cmds[1]) {
		t.Fatalf("__cmdlog__ lines %q", cmds)
	}

	head, events := logLines(t, mustRun(t, c, "__events__"), 2)
	text := strings.Join(events, "\n")
	for _, want := range []string{
		" LIFE start boot sandbox=parent-1 ",
		" LIFE engine_started backend=fake",
		" LIFE agent_up",
		" CMD start n=1 echo hi",
		" CMD end n=1 exit=0 ",
		" CMD end n=2 exit=255 ",
		" LIFE snapshot path=base pause_ms=",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("__events__ has no %q:\n%s", want, text)
		}
	}
	cursor := head[1]
	parentCursor, _ := strconv.Atoi(cursor)
	mustRun(t, c, "true")
	_, later := logLines(t, mustRun(t, c, "__events__ "+cursor), 2)
	if len(later) != 2 || !strings.Contains(later[0], "CMD start n=3 true") || !strings.Contains(later[1], "CMD end n=3 exit=0") {
		t.Fatalf("events after cursor %s: %q", cursor, later)
	}
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")
	art := filepath.Join(t.TempDir(), "base")
	if err := os.Rename(filepath.Join(sb.dir, "base"), art); err != nil {
		t.Fatal(err)
	}

	fork := start(t, eng, "", "restore = 1\nrestore_from = "+art+"\nsandbox_id = child-1")
	fc := fork.dial()
	mustRun(t, fc, "true")
	// The parent's cursor is from another timeline: the fork answers its
	// whole ring, and its smaller cursor tells the client so.
	head, events = logLines(t, mustRun(t, fc, "__events__ "+cursor), 2)
	if forkCursor, _ := strconv.Atoi(head[1]); forkCursor >= parentCursor {
		t.Errorf("the fork's cursor %s is not below the parent's %s", head[1], cursor)
	}
	if !regexp.MustCompile(`^1 \d+ LIFE start fork from=\S+ parent=parent-1 parent_generation=0 sandbox=child-1 `).MatchString(events[0]) {
		t.Errorf("the fork's first event %q does not say where it came from", events[0])
	}
	if text := strings.Join(events, "\n"); strings.Contains(text, "echo hi") || !strings.Contains(text, "LIFE restored") {
		t.Errorf("the fork's timeline:\n%s", text)
	}
	_, cmds = logLines(t, mustRun(t, fc, "__cmdlog__"), 1)
	if len(cmds) != 1 || !strings.HasSuffix(cmds[0], " true") {
		t.Errorf("the fork's command log %q: want only its own command", cmds)
	}
}

// The console's terminal and the display of a fake sandbox: __screen__
// shows what the guest printed, __screendiff__ only what changed since the
// client's last call, __frame__ a PPM of the display, __framediff__ its
// changed tiles; a sandbox without gpu = 1 answers the frame commands with
// an ERR naming the key.
func TestScreenAndFrame(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "gpu = 1")
	c := sb.dial()
	ctx := context.Background()
	if info := infoOf(t, c); info["gpu"] != "on" {
		t.Fatalf("__info__ gpu=%q, want on", info["gpu"])
	}
	mustRun(t, c, "console hello from the console")
	waitScreen := func(want string) client.Screen {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			scr, err := c.Screen(ctx)
			if err != nil {
				t.Fatalf("__screen__: %v", err)
			}
			if strings.Contains(strings.Join(scr.Lines, "\n"), want) {
				return scr
			}
			if time.Now().After(deadline) {
				t.Fatalf("__screen__ never showed %q:\n%s", want, strings.Join(scr.Lines, "\n"))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	scr := waitScreen("hello from the console")
	if scr.Cols != 80 || scr.Rows != 24 || len(scr.Grid()) != 24 {
		t.Errorf("screen %dx%d with a grid of %d rows", scr.Cols, scr.Rows, len(scr.Grid()))
	}
	first, err := c.ScreenDiff(ctx)
	if err != nil || len(first.Changed) != 24 {
		t.Fatalf("first __screendiff__: %d rows, %v; want the whole grid", len(first.Changed), err)
	}
	if again, err := c.ScreenDiff(ctx); err != nil || len(again.Changed) != 0 {
		t.Fatalf("__screendiff__ with nothing new: %+v, %v", again, err)
	}
	mustRun(t, c, "console second line")
	waitScreen("second line")
	diff, err := c.ScreenDiff(ctx)
	if err != nil || len(diff.Changed) == 0 || len(diff.Changed) > 2 || !strings.Contains(diff.Changed[0].Text, "second line") {
		t.Fatalf("__screendiff__ after one line: %+v, %v", diff, err)
	}

	frame, err := c.Frame(ctx)
	if err != nil || frame.Width != fake.DisplayWidth || frame.Height != fake.DisplayHeight || len(frame.RGB) != frame.Width*frame.Height*3 {
		t.Fatalf("__frame__: %dx%d, %d bytes, %v", frame.Width, frame.Height, len(frame.RGB), err)
	}
	fd, err := c.FrameDiff(ctx)
	if err != nil || len(fd.Tiles) == 0 {
		t.Fatalf("first __framediff__: %+v, %v", len(fd.Tiles), err)
	}
	if fd, err = c.FrameDiff(ctx); err != nil || len(fd.Tiles) != 0 {
		t.Fatalf("__framediff__ with nothing new: %d tiles, %v", len(fd.Tiles), err)
	}
	mustRun(t, c, "draw 5 5")
	if fd, err = c.FrameDiff(ctx); err != nil || len(fd.Tiles) != 1 || fd.Tiles[0].X != 0 || fd.Tiles[0].Y != 0 {
		t.Fatalf("__framediff__ after one pixel: %+v, %v", fd.Tiles, err)
	}

	plain := start(t, eng, "", "")
	pc := plain.dial()
	for _, line := range []string{"__frame__", "__framediff__"} {
		out, exit, err := run(t, pc, line)
		if exit != -1 || !strings.Contains(out+fmt.Sprint(err), line+": needs gpu = 1 in nether.conf") {
			t.Errorf("%s without gpu: %q exit %d err %v", line, out, exit, err)
		}
	}
}

// A fork's screen starts as its base's was at the capture: the serial
// console's picture is host state, carried in the artifact's console
// section, not guest memory.
func TestForkInheritsScreen(t *testing.T) {
	eng := fake.New(slog.Default())
	sb := start(t, eng, "", "")
	c := sb.dial()
	mustRun(t, c, "console the base was here")
	deadline := time.Now().Add(5 * time.Second)
	for {
		scr, err := c.Screen(context.Background())
		if err == nil && strings.Contains(strings.Join(scr.Lines, "\n"), "the base was here") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the base's screen never showed its console line: %+v %v", scr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mustRun(t, c, "__snapshot__ base")
	mustRun(t, c, "__shutdown__")
	sb.expectEnd(5*time.Second, 0, "shutdown")
	art := filepath.Join(t.TempDir(), "base")
	if err := os.Rename(filepath.Join(sb.dir, "base"), art); err != nil {
		t.Fatal(err)
	}
	fork := start(t, eng, "", "restore = 1\nrestore_from = "+art)
	fc := fork.dial()
	mustRun(t, fc, "console the fork is here")
	deadline = time.Now().Add(5 * time.Second)
	for {
		scr, err := fc.Screen(context.Background())
		text := strings.Join(scr.Lines, "\n")
		if err == nil && strings.Contains(text, "the fork is here") {
			if !strings.Contains(text, "the base was here") {
				t.Fatalf("the fork's screen lost its base's console:\n%s", text)
			}
			if strings.Index(text, "the base was here") > strings.Index(text, "the fork is here") {
				t.Fatalf("the fork's screen has its base's line after its own:\n%s", text)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fork's screen never showed its own line: %q %v", text, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
