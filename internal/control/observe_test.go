package control

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/cmdlog"
	"github.com/nethersandbox/nether/internal/timeline"
)

// readLog reads a streamed log reply (EVENTS/CMDLOG): the header, then the
// number of lines its count announces.
func (c *conn) readLog(header string) (head string, lines []string) {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.c.SetReadDeadline(time.Time{})
	head, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reading the %s header: %v", header, err)
	}
	f := strings.Fields(head)
	if len(f) < 2 || f[0] != header {
		c.t.Fatalf("header %q, want %s ...", head, header)
	}
	countField := f[1]
	if header == "EVENTS" {
		countField = f[2]
	}
	n, err := strconv.Atoi(countField)
	if err != nil {
		c.t.Fatalf("header %q: count %q", head, countField)
	}
	for range n {
		l, err := c.br.ReadString('\n')
		if err != nil {
			c.t.Fatalf("reading line %d of %d: %v", len(lines)+1, n, err)
		}
		lines = append(lines, strings.TrimSuffix(l, "\n"))
	}
	return strings.TrimSuffix(head, "\n"), lines
}

// readStreamed reads one streamed reply by its header (or the framed ERR
// a streamed command answers when it cannot run) and returns it whole.
func (c *conn) readStreamed() string {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer c.c.SetReadDeadline(time.Time{})
	head, err := c.br.ReadString('\n')
	if err != nil {
		c.t.Fatalf("reading a streamed header: %v (got %q)", err, head)
	}
	out := []byte(head)
	f := strings.Fields(head)
	lines := func(n string) {
		count, err := strconv.Atoi(n)
		if err != nil {
			c.t.Fatalf("header %q: count %q", head, n)
		}
		for range count {
			l, err := c.br.ReadString('\n')
			if err != nil {
				c.t.Fatalf("header %q: reading its lines: %v", head, err)
			}
			out = append(out, l...)
		}
	}
	raw := func(n int) {
		b := make([]byte, n)
		if _, err := io.ReadFull(c.br, b); err != nil {
			c.t.Fatalf("header %q: reading %d bytes: %v", head, n, err)
		}
		out = append(out, b...)
	}
	atoi := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			c.t.Fatalf("header %q: %q is not a number", head, s)
		}
		return n
	}
	switch f[0] {
	case "ERR":
		body, exit := c.readFrame(10 * time.Second)
		return string(out) + string(body) + "\x1e" + exit + "\n"
	case "EVENTS":
		lines(f[2])
	case "CMDLOG", "NETLOG", "SCREEN", "SCREENDIFF":
		lines(f[1])
	case "P6":
		size, _ := c.br.ReadString('\n')
		depth, _ := c.br.ReadString('\n')
		out = append(out, size+depth...)
		wh := strings.Fields(size)
		raw(atoi(wh[0]) * atoi(wh[1]) * 3)
	case "FRAMEDIFF":
		for range atoi(f[4]) {
			rec, err := c.br.ReadString('\n')
			if err != nil {
				c.t.Fatalf("FRAMEDIFF record: %v", err)
			}
			out = append(out, rec...)
			r := strings.Fields(rec)
			raw(atoi(r[2]) * atoi(r[3]) * 3)
		}
	default:
		c.t.Fatalf("unknown streamed header %q", head)
	}
	return string(out)
}

func startObserved(t *testing.T, fb *fakeBackend) (*harness, *timeline.Timeline) {
	tl := timeline.New(time.Now(), nil, 0)
	h := start(t, fb, 0, func(s *Server) {
		s.Observe = Observe{Events: tl, Commands: cmdlog.New(0)}
	})
	return h, tl
}

func TestCmdLog(t *testing.T) {
	fb := newFake()
	fb.up()
	fb.on("ok", script{chunks: [][]byte{[]byte("fine\n")}, status: "0"})
	fb.on("fails", script{status: "3"})
	fb.on("hostile", script{chunks: [][]byte{[]byte("x")}, status: "-1"})
	fb.on("garbage", script{status: "12abc"})
	fb.on("tab\there", script{status: "0"})
	h, _ := startObserved(t, fb)
	c := h.dial(t)
	for _, line := range []string{"ok", "fails", "hostile", "garbage", "tab\there"} {
		c.roundTrip(line)
	}
	c.roundTrip("__put__ a b") // transfers are on the timeline, not in the command log
	c.send("__cmdlog__")
	head, lines := c.readLog("CMDLOG")
	if head != "CMDLOG 5" {
		t.Fatalf("header %q, want CMDLOG 5", head)
	}
	re := regexp.MustCompile(`^\d+ exit=(\d+) cpu_ms=\d+ (.*)$`)
	want := []struct{ exit, cmd string }{{"0", "ok"}, {"3", "fails"}, {"255", "hostile"}, {"255", "garbage"}, {"0", `tab\x09here`}}
	for i, l := range lines {
		m := re.FindStringSubmatch(l)
		if m == nil || m[1] != want[i].exit || m[2] != want[i].cmd {
			t.Errorf("line %d = %q, want exit=%s and command %q", i, l, want[i].exit, want[i].cmd)
		}
	}
	// The connection is still in sync after the streamed reply.
	if got := c.roundTrip("ok"); got != framed("fine\n", "0") {
		t.Fatalf("after __cmdlog__: %q", got)
	}
}

func TestEvents(t *testing.T) {
	fb := newFake()
	fb.up()
	fb.on("ok", script{status: "0"})
	h, tl := startObserved(t, fb)
	tl.Add(timeline.LIFE, "boot")
	c := h.dial(t)
	c.roundTrip("ok")
	c.send("__events__")
	head, lines := c.readLog("EVENTS")
	if head != "EVENTS 3 3" {
		t.Fatalf("header %q, want EVENTS 3 3 (lines %q)", head, lines)
	}
	for i, re := range []string{`^1 \d+ LIFE boot$`, `^2 \d+ CMD start n=1 ok$`, `^3 \d+ CMD end n=1 exit=0 ms=\d+ cpu_ms=\d+$`} {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("line %d = %q, want it to match %s", i, lines[i], re)
		}
	}
	c.roundTrip("__get__ x y")
	c.send("__events__ 3")
	head, lines = c.readLog("EVENTS")
	if head != "EVENTS 5 2" || !strings.Contains(lines[0], "CMD start n=2 __get__ x y") || !strings.Contains(lines[1], "CMD end n=2 ok bytes=") {
		t.Fatalf("after cursor 3: %q %q", head, lines)
	}
	c.send("__events__ 5")
	if head, lines = c.readLog("EVENTS"); head != "EVENTS 5 0" || len(lines) != 0 {
		t.Fatalf("up to date: %q %q", head, lines)
	}
	// A read-only observer may read the logs.
	o := h.dial(t)
	o.send("__events__ 4")
	if head, _ := o.readLog("EVENTS"); head != "EVENTS 5 1" {
		t.Fatalf("observer: %q", head)
	}
}

// A server with no observation answers the log commands with a framed
// control error, not an empty or hanging stream.
func TestObserveOff(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	for _, line := range []string{"__events__", "__cmdlog__", "__netlog__"} {
		if got := c.roundTrip(line); !strings.HasPrefix(got, "ERR ") || !strings.HasSuffix(got, "\x1e-1\n") {
			t.Errorf("%s with observation off: %q", line, got)
		}
	}
}
