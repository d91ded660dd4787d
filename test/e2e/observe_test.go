package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
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
