package session

import (
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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
