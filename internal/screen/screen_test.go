package screen

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"
)

// reply is a parsed __screen__ or __screendiff__ reply.
type reply struct {
	kind                      string
	count, cols, rows, cy, cx int
	lines                     []string
}

// parseReply parses a reply and checks it is well formed: a header of
// six fields, then exactly count lines, each ending in '\n', none holding
// a control byte, DEL or invalid UTF-8.
func parseReply(t testing.TB, b []byte) reply {
	t.Helper()
	head, body, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		t.Fatalf("reply %q has no header line", b)
	}
	f := strings.Fields(string(head))
	if len(f) != 6 || string(head) != strings.Join(f, " ") {
		t.Fatalf("header %q: want 6 single-space separated fields", head)
	}
	r := reply{kind: f[0]}
	for i, p := range []*int{&r.count, &r.cols, &r.rows, &r.cy, &r.cx} {
		n, err := strconv.Atoi(f[i+1])
		if err != nil || n < 0 {
			t.Fatalf("header %q: field %d is not a count", head, i+1)
		}
		*p = n
	}
	if r.cy >= r.rows || r.cx >= r.cols {
		t.Fatalf("header %q: cursor outside the %dx%d grid", head, r.cols, r.rows)
	}
	if len(body) > 0 && body[len(body)-1] != '\n' {
		t.Fatalf("reply body does not end in a newline: %q", body)
	}
	if len(body) > 0 {
		r.lines = strings.Split(string(body[:len(body)-1]), "\n")
	}
	if len(r.lines) != r.count {
		t.Fatalf("header says %d lines, body has %d: %q", r.count, len(r.lines), b)
	}
	for _, l := range r.lines {
		if strings.ContainsFunc(l, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
			t.Fatalf("line %q holds a raw control byte", l)
		}
		if !utf8.ValidString(l) {
			t.Fatalf("line %q is not valid UTF-8", l)
		}
	}
	return r
}

// grid is the live grid of a __screen__ reply.
func (r reply) grid() []string { return r.lines[len(r.lines)-r.rows:] }

// scrollback is the scrollback part of a __screen__ reply.
func (r reply) scrollback() []string { return r.lines[:len(r.lines)-r.rows] }

func newTerminal(t testing.TB, cols, rows, scrollback int) *Terminal {
	t.Helper()
	term := New(cols, rows, scrollback)
	t.Cleanup(func() { term.Close() })
	return term
}

func write(t testing.TB, term *Terminal, s string) {
	t.Helper()
	if n, err := term.Write([]byte(s)); n != len(s) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(s))
	}
}

func TestScreen(t *testing.T) {
	tests := []struct {
		name   string
		input  string
		grid   []string
		cy, cx int
	}{
		{"empty", "", []string{"", "", ""}, 0, 0},
		{"text and cursor", "hello\r\nworld", []string{"hello", "world", ""}, 1, 5},
		{"cursor addressed", "\x1b[3;7Hx", []string{"", "", "      x"}, 2, 7},
		{"trailing blanks trimmed", "ab   \r\n\x1b[41m    \x1b[0m", []string{"ab", "", ""}, 1, 4},
		{"inner blanks kept", "a  b", []string{"a  b", "", ""}, 0, 4},
		{"erase line", "abcdef\r\x1b[2C\x1b[K", []string{"ab", "", ""}, 0, 2},
		{"clear screen", "one\r\ntwo\x1b[2J\x1b[H", []string{"", "", ""}, 0, 0},
		{"tab", "a\tb", []string{"a       b", "", ""}, 0, 9},
		{"wide characters", "日本語", []string{"日本語", "", ""}, 0, 6},
		{"combining mark", "e\u0301!", []string{"e\u0301!", "", ""}, 0, 2},
		{"backslash escaped", `a\b`, []string{`a\\b`, "", ""}, 0, 3},
		{"wrap pending keeps cursor in grid", strings.Repeat("x", 10), []string{strings.Repeat("x", 10), "", ""}, 0, 9},
		{"wraps", strings.Repeat("x", 12), []string{strings.Repeat("x", 10), "xx", ""}, 1, 2},
		{"DEC line drawing", "\x1b(0qqq\x1b(B", []string{"───", "", ""}, 0, 3},
		{"backspace overwrites", "ab\bc", []string{"ac", "", ""}, 0, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			term := newTerminal(t, 10, 3, 10)
			write(t, term, tt.input)
			r := parseReply(t, term.Screen())
			if r.kind != "SCREEN" || r.cols != 10 || r.rows != 3 {
				t.Fatalf("header %+v: want SCREEN 10x3", r)
			}
			if got := r.grid(); strings.Join(got, "|") != strings.Join(tt.grid, "|") {
				t.Errorf("grid = %q, want %q", got, tt.grid)
			}
			if r.cy != tt.cy || r.cx != tt.cx {
				t.Errorf("cursor = row %d col %d, want row %d col %d", r.cy, r.cx, tt.cy, tt.cx)
			}
		})
	}
}

// TestLineFeed pins how line ends look: CR LF as a serial console sends
// it, and a bare LF read as CR LF (see Write).
func TestLineFeed(t *testing.T) {
	want := []string{"one", "two", ""}
	for _, input := range []string{"one\r\ntwo", "one\ntwo", "one\r\r\ntwo", "one\n\rtwo"} {
		t.Run(strconv.Quote(input), func(t *testing.T) {
			term := newTerminal(t, 10, 3, 10)
			// Byte by byte as well as at once: a CR LF split across
			// writes must look the same.
			for _, split := range []bool{false, true} {
				write(t, term, "\x1b[2J\x1b[H")
				if split {
					for i := range len(input) {
						write(t, term, input[i:i+1])
					}
				} else {
					write(t, term, input)
				}
				if got := parseReply(t, term.Screen()).grid(); strings.Join(got, "|") != strings.Join(want, "|") {
					t.Errorf("split=%v: grid = %q, want %q", split, got, want)
				}
			}
		})
	}
}

func TestScrollback(t *testing.T) {
	lines := func(from, to int) []string {
		var s []string
		for i := from; i <= to; i++ {
			s = append(s, fmt.Sprintf("line %d", i))
		}
		return s
	}
	tests := []struct {
		name       string
		scrollback int
		printed    int
		want       []string
	}{
		{"nothing scrolled yet", 5, 3, nil},
		{"scrolled lines, oldest first", 5, 6, lines(1, 3)},
		{"bounded, newest kept", 5, 20, lines(13, 17)},
		{"none kept", 0, 20, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			term := newTerminal(t, 10, 3, tt.scrollback)
			write(t, term, strings.Join(lines(1, tt.printed), "\r\n"))
			r := parseReply(t, term.Screen())
			if got := r.scrollback(); strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Errorf("scrollback = %q, want %q", got, tt.want)
			}
			if got, want := r.grid(), lines(max(1, tt.printed-2), tt.printed); strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("grid = %q, want %q", got, want)
			}
			if r.count != len(tt.want)+3 {
				t.Errorf("count = %d, want %d", r.count, len(tt.want)+3)
			}
		})
	}
}

// diffRows returns a __screendiff__ reply's rows as "<row> <text>".
func diffRows(t *testing.T, term *Terminal, v *View) (reply, []string) {
	t.Helper()
	r := parseReply(t, term.Diff(v))
	if r.kind != "SCREENDIFF" {
		t.Fatalf("kind %q, want SCREENDIFF", r.kind)
	}
	last := -1
	for _, l := range r.lines {
		n, _, ok := strings.Cut(l, " ")
		row, err := strconv.Atoi(n)
		if !ok || err != nil || row <= last || row >= r.rows {
			t.Fatalf("diff line %q: want \"<row> <text>\", rows ascending within the grid", l)
		}
		last = row
	}
	return r, r.lines
}

func TestDiff(t *testing.T) {
	term := newTerminal(t, 10, 3, 10)
	write(t, term, "$ ")
	var v View

	steps := []struct {
		name   string
		do     func()
		want   []string
		cy, cx int
	}{
		{"first call returns every row", func() {}, []string{"0 $", "1 ", "2 "}, 0, 2},
		{"nothing changed", func() {}, nil, 0, 2},
		{"one line printed", func() { write(t, term, "ls\r\n") }, []string{"0 $ ls"}, 1, 0},
		{"cursor moved only", func() { write(t, term, "\x1b[3;4H") }, nil, 2, 3},
		{"two rows changed", func() { write(t, term, "\x1b[Hx\x1b[3Hy") }, []string{"0 x ls", "2 y"}, 2, 1},
		{"same text rewritten", func() { write(t, term, "\ry") }, nil, 2, 1},
		{"scroll changes every row", func() { write(t, term, "\r\nz") }, []string{"0 ", "1 y", "2 z"}, 2, 1},
		{"clear blanks the rows that had text", func() { write(t, term, "\x1b[2J") }, []string{"1 ", "2 "}, 2, 1},
		{"resize returns every row", func() { term.Resize(12, 4) }, []string{"0 ", "1 ", "2 ", "3 "}, 2, 1},
		{"after resize, changes only", func() { write(t, term, "\x1b[4Hbottom") }, []string{"3 bottom"}, 3, 6},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			s.do()
			r, got := diffRows(t, term, &v)
			if strings.Join(got, "|") != strings.Join(s.want, "|") {
				t.Errorf("rows = %q, want %q", got, s.want)
			}
			if r.cy != s.cy || r.cx != s.cx {
				t.Errorf("cursor = row %d col %d, want row %d col %d", r.cy, r.cx, s.cy, s.cx)
			}
		})
	}
}

func TestDiffViewsAreIndependent(t *testing.T) {
	term := newTerminal(t, 10, 2, 0)
	var a, b View
	diffRows(t, term, &a)
	write(t, term, "hi")
	if _, got := diffRows(t, term, &a); len(got) != 1 {
		t.Fatalf("a: rows %q, want the one changed", got)
	}
	if _, got := diffRows(t, term, &b); len(got) != 2 {
		t.Fatalf("b's first call: rows %q, want both", got)
	}
	if _, got := diffRows(t, term, nil); len(got) != 2 {
		t.Fatalf("nil view: rows %q, want both", got)
	}
}

// within fails the test if f has not returned after d.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %s", what, d)
	}
}

// TestQueriesNeverBlock: the emulator answers these through a pipe that
// blocks until read; a guest printing them must not stop Write.
func TestQueriesNeverBlock(t *testing.T) {
	queries := []string{
		"\x1b[6n",       // cursor position report
		"\x1b[5n",       // status report
		"\x1b[?6n",      // extended cursor position report
		"\x1b[c",        // primary device attributes
		"\x1b[>c",       // secondary device attributes
		"\x1b[?1$p",     // mode report
		"\x1b[2$p",      // ANSI mode report
		"\x1b]10;?\x07", // foreground color query
		"\x1b]11;?\x1b\\",
		"\x1b[?1004h\x1b[?2048h", // focus and in-band resize reports on
	}
	term := newTerminal(t, 80, 24, 100)
	flood := []byte(strings.Repeat(strings.Join(queries, ""), 2000))
	within(t, 30*time.Second, "Write of a flood of terminal queries", func() {
		term.Write(flood)
		term.Resize(100, 30) // in-band resize report
		write(t, term, "still here")
	})
	if got := parseReply(t, term.Screen()).grid()[0]; got != "still here" {
		t.Errorf("row 0 = %q, want the text written after the queries", got)
	}
}

// TestHostileParamsAreCheap sends every CSI command with the largest
// parameters the parser keeps: each must cost little, whatever the
// emulator does with a count (ECH erases count cells one by one).
func TestHostileParamsAreCheap(t *testing.T) {
	// No Close in a cleanup: should a sequence hang, Close would wait for
	// it behind the lock; the test fails instead.
	term := New(80, 24, 100)
	write(t, term, "x")
	var worst time.Duration
	var worstSeq string
	within(t, time.Minute, "the hostile sequences", func() {
		for _, prefix := range []string{"", "?", ">", "<", "="} {
			for _, inter := range []string{"", " ", "!", "\"", "$", "'", "*"} {
				for final := byte('@'); final <= '~'; final++ {
					for _, param := range []string{"2147483647", "99999999999999999999", "65535;65535;65535"} {
						seq := "\x1b[" + prefix + param + inter + string(final)
						start := time.Now()
						term.Write([]byte(seq + "x"))
						if d := time.Since(start); d > worst {
							worst, worstSeq = d, seq
						}
					}
				}
			}
		}
	})
	// Unclamped, ESC[2147483647X takes seconds and ESC[2147483647b
	// minutes; clamped, the worst is a line's worth of REP. Generous for
	// -race on a loaded machine.
	if worst > 200*time.Millisecond {
		t.Errorf("%q took %s", worstSeq, worst)
	}
	t.Logf("slowest: %q in %s", worstSeq, worst)
	parseReply(t, term.Screen())
	term.Close()
}

// TestMarginsPastTheEdge: the emulator takes scroll margins past the
// screen's edge and then indexes outside its rows (found by FuzzWrite);
// the margins are clamped, so the sequences work as on a real terminal.
func TestMarginsPastTheEdge(t *testing.T) {
	tests := []struct {
		name  string
		input string
		grid  []string
	}{
		{"bottom margin past the last row", "a\r\nb\x1b[1;99r\x1b[L", []string{"", "a", "b"}},
		{"both margins past the last row", "a\x1b[50;99r\x1b[3Hc\x1b[M", []string{"a", "", ""}},
		{"right margin past the last column", "abc\x1b[?69h\x1b[2;99s\x1b[1;2H\x1b[2@\x1b[?69l", []string{"a  bc", "", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			term := newTerminal(t, 10, 3, 10)
			write(t, term, tt.input)
			if got := parseReply(t, term.Screen()).grid(); strings.Join(got, "|") != strings.Join(tt.grid, "|") {
				t.Errorf("grid = %q, want %q", got, tt.grid)
			}
		})
	}
}

// TestEmulatorPanicResets: should the emulator panic on some input still
// unknown, the terminal starts over and says so instead of taking the
// console pump (and nether) down.
func TestEmulatorPanicResets(t *testing.T) {
	term := newTerminal(t, 80, 3, 10)
	// A stand-in for an emulator bug: a CSI command that panics.
	term.emu.RegisterCsiHandler('y', func(ansi.Params) bool { panic("boom") })
	write(t, term, "before\r\n\x1b[ylost")
	write(t, term, "after")
	got := parseReply(t, term.Screen()).grid()
	want := []string{"[nether: the terminal emulator failed on the guest's output and was reset: boom]", "after", ""}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("grid = %q, want %q", got, want)
	}
	// The new emulator's replies are drained too, and Close stops the
	// drain of both.
	within(t, 10*time.Second, "a query after the reset", func() { write(t, term, strings.Repeat("\x1b[6n", 100)) })
	within(t, 10*time.Second, "Close", func() { term.Close() })
}

// TestCombiningFloodIsBounded: a cell holds one grapheme cluster, and a
// run of combining marks is one cluster; the screen must not grow with it.
func TestCombiningFloodIsBounded(t *testing.T) {
	term := newTerminal(t, 80, 24, 1000)
	mark := "\u0301"
	write(t, term, "a"+strings.Repeat(mark, 200000)+"b")
	for i := range 30 {
		write(t, term, "\r\n"+strconv.Itoa(i)+strings.Repeat(mark, 5000))
	}
	if n := len(term.Screen()); n > 64<<10 {
		t.Errorf("Screen is %d bytes after a flood of combining marks; want it bounded", n)
	}
}

func TestCloseStopsDrain(t *testing.T) {
	term := New(80, 24, 10)
	write(t, term, "before\x1b[6n")
	within(t, 5*time.Second, "Close", func() { term.Close() })
	within(t, 5*time.Second, "second Close", func() { term.Close() })
	// Output after Close is dropped without an error; the screen stays
	// readable.
	write(t, term, "\r\nafter\x1b[6n")
	if got := parseReply(t, term.Screen()).grid()[:2]; got[0] != "before" || got[1] != "" {
		t.Errorf("grid after Close = %q, want only what came before", got)
	}
}

func TestNewClampsSizes(t *testing.T) {
	term := newTerminal(t, 0, -3, -1)
	write(t, term, "abc\r\ndef")
	r := parseReply(t, term.Screen())
	if r.cols != 1 || r.rows != 1 || r.count != 1 {
		t.Errorf("header %+v: want a 1x1 grid and no scrollback", r)
	}
}

// TestConcurrentUse is for -race: the console pump writes while clients
// read the screen and their diffs.
func TestConcurrentUse(t *testing.T) {
	term := newTerminal(t, 40, 10, 50)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for i := range 500 {
			write(t, term, fmt.Sprintf("line %d \x1b[6n\r\n", i))
		}
	}()
	for range 2 {
		go func() {
			defer wg.Done()
			var v View
			for range 100 {
				parseReply(t, term.Screen())
				parseReply(t, term.Diff(&v))
			}
		}()
	}
	wg.Wait()
}

// consoleText is typical serial console output: kernel messages, a
// prompt with colour, a command's output.
var consoleText = []byte(strings.Repeat(
	"[    0.412345] virtio_console virtio1: port nether.channel ready\r\n"+
		"\x1b[1;32mroot@sandbox\x1b[0m:\x1b[1;34m~\x1b[0m# ls -l /etc\r\n"+
		"-rw-r--r--    1 root     root            86 Jan  1 00:00 passwd\r\n"+
		"drwxr-xr-x    2 root     root             0 Jan  1 00:00 nether\r\n", 64))

func BenchmarkWrite(b *testing.B) {
	term := New(80, 24, 1000)
	defer term.Close()
	b.SetBytes(int64(len(consoleText)))
	for b.Loop() {
		term.Write(consoleText)
	}
}
