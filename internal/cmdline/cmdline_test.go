package cmdline

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		line    string
		want    Command
		wantErr error
		msg     string // exact error text, when set
	}{
		{name: "shell", line: "ls -la /tmp\n", want: Command{Shell: "ls -la /tmp"}},
		{name: "shell keeps inner blanks", line: "  echo  a\tb \r\n", want: Command{Shell: "echo  a\tb"}},
		{name: "single underscore is shell", line: "_foo", want: Command{Shell: "_foo"}},
		{name: "info", line: "__info__\n", want: Command{Name: "__info__"}},
		{name: "info crlf", line: " __info__\r\n", want: Command{Name: "__info__"}},
		{name: "put", line: "__put__ a.txt /tmp/a.txt", want: Command{Name: "__put__", Args: []string{"a.txt", "/tmp/a.txt"}}},
		{name: "get tabs", line: "__get__\t/etc/os-release \t out", want: Command{Name: "__get__", Args: []string{"/etc/os-release", "out"}}},
		{name: "snapshot default", line: "__snapshot__", want: Command{Name: "__snapshot__"}},
		{name: "snapshot path", line: "__snapshot__ base.snap", want: Command{Name: "__snapshot__", Args: []string{"base.snap"}}},
		{name: "park path", line: "__park__ p.snap  ", want: Command{Name: "__park__", Args: []string{"p.snap"}}},
		{name: "events", line: "__events__", want: Command{Name: "__events__"}},
		{name: "events seq", line: "__events__ 42", want: Command{Name: "__events__", Args: []string{"42"}}},
		{name: "claim", line: "__claim__ user-42 host-42\r\n", want: Command{Name: "__claim__", Args: []string{"user-42", "host-42"}}},
		// The parser only tokenises: whether a token is a usable sandbox
		// id or hostname is the session's to say (nether.conf's rules).
		{name: "claim unchecked tokens", line: "__claim__ \u00e9 a.b", want: Command{Name: "__claim__", Args: []string{"\u00e9", "a.b"}}},

		{name: "empty", line: "", wantErr: ErrEmpty},
		{name: "blank", line: " \t\r\n", wantErr: ErrEmpty},
		{name: "delim in shell", line: "echo \x1e0", wantErr: ErrFrameByte, msg: "command contains a frame delimiter byte (0x1e/0x1f)"},
		{name: "esc in shell", line: "echo \x1f", wantErr: ErrFrameByte},
		{name: "delim trailing", line: "ls\x1e", wantErr: ErrFrameByte},
		{name: "delim in control arg", line: "__get__ a\x1e b", wantErr: ErrFrameByte},
		{name: "nul", line: "cat\x00", wantErr: ErrNUL},
		{name: "inner newline", line: "true\nreboot", wantErr: ErrNewline},
		{name: "too long", line: strings.Repeat("a", MaxLine+1), wantErr: ErrTooLong},
		{name: "unknown", line: "__bogus__ x", wantErr: ErrUnknownCommand, msg: "unknown command __bogus__"},
		{name: "bare underscores", line: "__", wantErr: ErrUnknownCommand, msg: "unknown command __"},
		{name: "unknown nonprintable", line: "__\x1b[2J", wantErr: ErrUnknownCommand, msg: `unknown command "__\x1b[2J"`},
		{name: "get three", line: "__get__ a b c", wantErr: ErrArgs, msg: "__get__ takes exactly 2 arguments (<guestpath> <hostpath>), got 3"},
		{name: "put one", line: "__put__ a", wantErr: ErrArgs, msg: "__put__ takes exactly 2 arguments (<hostpath> <guestpath>), got 1"},
		{name: "put none", line: "__put__", wantErr: ErrArgs},
		{name: "snapshot two", line: "__snapshot__ a b", wantErr: ErrArgs, msg: "__snapshot__ takes at most 1 argument ([path]), got 2"},
		{name: "park two", line: "__park__ a b", wantErr: ErrArgs},
		{name: "info arg", line: "__info__ x", wantErr: ErrArgs, msg: "__info__ takes no arguments, got 1"},
		{name: "shutdown arg", line: "__shutdown__ now", wantErr: ErrArgs},
		{name: "events negative", line: "__events__ -1", wantErr: ErrArgs, msg: `__events__ takes a non-negative integer sequence number, got -1`},
		{name: "events plus", line: "__events__ +1", wantErr: ErrArgs},
		{name: "events word", line: "__events__ abc", wantErr: ErrArgs},
		{name: "events two", line: "__events__ 1 2", wantErr: ErrArgs},
		{name: "claim none", line: "__claim__", wantErr: ErrArgs, msg: "__claim__ takes 2 to 6 arguments (<sandbox_id> <hostname> [node_id=ID] [boot_id=ID] [plan_digest=HEX] [token=T]), got 0"},
		{name: "claim one", line: "__claim__ id", wantErr: ErrArgs},
		{name: "claim seven", line: "__claim__ id host a=1 b=2 c=3 d=4 e=5", wantErr: ErrArgs},
		{name: "claim forged trailer", line: "__claim__ id host\x1e0", wantErr: ErrFrameByte},
		{name: "claim second line", line: "__claim__ id host\nrm -rf /", wantErr: ErrNewline},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.line)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Parse(%q) error = %v, want %v", tt.line, err, tt.wantErr)
				}
				if tt.msg != "" && err.Error() != tt.msg {
					t.Fatalf("error text = %q, want %q", err.Error(), tt.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.line, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse(%q) = %#v, want %#v", tt.line, got, tt.want)
			}
		})
	}
}

func TestLongLineAtLimit(t *testing.T) {
	line := "echo " + strings.Repeat("a", MaxLine-5)
	if _, err := Parse(line); err != nil {
		t.Fatalf("line of exactly MaxLine bytes rejected: %v", err)
	}
}

func TestUnknownTokenTruncated(t *testing.T) {
	_, err := Parse("__" + strings.Repeat("x", 1000))
	if err == nil || len(err.Error()) > 100 {
		t.Fatalf("error not bounded: %d bytes", len(err.Error()))
	}
}

func TestTableClassification(t *testing.T) {
	tests := []struct {
		name   string
		access Access
		reply  Shape
	}{
		{Shell, PrimaryOnly, Framed},
		{"__info__", AnyClient, Framed},
		{"__stats__", AnyClient, Framed},
		{"__help__", AnyClient, Framed},
		{"__events__", AnyClient, Streamed},
		{"__cmdlog__", AnyClient, Streamed},
		{"__netlog__", AnyClient, Streamed},
		{"__screen__", AnyClient, Streamed},
		{"__screendiff__", PrimaryOnly, Streamed},
		{"__frame__", AnyClient, Streamed},
		{"__framediff__", PrimaryOnly, Streamed},
		{"__shutdown__", PrimaryOnly, Framed},
		{"__put__", PrimaryOnly, Framed},
		{"__get__", PrimaryOnly, Framed},
		{"__snapshot__", PrimaryOnly, Framed},
		{"__park__", PrimaryOnly, Framed},
		{"__claim__", PrimaryOnly, Framed},
	}
	if n := len(Protocol()); n != len(tests) {
		t.Fatalf("the table has %d entries, the test knows %d: classify the new ones here", n, len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp, ok := Lookup(tt.name)
			if !ok {
				t.Fatalf("%q is not in the table", tt.name)
			}
			if sp.Access != tt.access || sp.Reply != tt.reply {
				t.Fatalf("%q: access %v reply %v, want %v %v", tt.name, sp.Access, sp.Reply, tt.access, tt.reply)
			}
		})
	}
}

// The table itself: unique names, a summary each, sane argument ranges,
// and verbs in the reserved namespace (the parser routes on the prefix).
func TestTableWellFormed(t *testing.T) {
	seen := map[string]bool{}
	for _, sp := range Protocol() {
		t.Run("entry "+sp.Usage(), func(t *testing.T) {
			if seen[sp.Name] {
				t.Fatalf("%q listed twice", sp.Name)
			}
			seen[sp.Name] = true
			if sp.Summary == "" {
				t.Error("no summary")
			}
			if sp.Name != Shell && (!strings.HasPrefix(sp.Name, "__") || !strings.HasSuffix(sp.Name, "__") || strings.ContainsFunc(sp.Name, isBlank)) {
				t.Errorf("%q is not a __name__ verb", sp.Name)
			}
			if sp.Args.Min < 0 || sp.Args.Max < sp.Args.Min {
				t.Errorf("argument range %d..%d", sp.Args.Min, sp.Args.Max)
			}
			if (sp.Args.Max > 0) != (sp.Args.Synopsis != "") {
				t.Errorf("synopsis %q does not match at most %d arguments", sp.Args.Synopsis, sp.Args.Max)
			}
			if sp.Name == Shell && (sp.Args.Max != 0 || sp.Args.Check != nil || sp.Reply != Framed) {
				t.Errorf("the shell entry has argument rules or a streamed reply: %+v", sp)
			}
		})
	}
}

func TestSetParse(t *testing.T) {
	served, err := NewSet("__info__", "__put__", "__snapshot__", Shell)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		line    string
		want    Command
		wantErr error
		msg     string
	}{
		{line: "__info__", want: Command{Name: "__info__"}},
		{line: "__put__ a b", want: Command{Name: "__put__", Args: []string{"a", "b"}}},
		{line: "__snapshot__", want: Command{Name: "__snapshot__"}},
		{line: "echo hi", want: Command{Shell: "echo hi"}},
		// A protocol verb the set does not serve is unknown, exactly like
		// a verb no protocol defines: same sentinel, same text.
		{line: "__events__", wantErr: ErrUnknownCommand, msg: "unknown command __events__"},
		{line: "__events__ -1", wantErr: ErrUnknownCommand, msg: "unknown command __events__"},
		{line: "__get__ a b", wantErr: ErrUnknownCommand, msg: "unknown command __get__"},
		{line: "__bogus__", wantErr: ErrUnknownCommand, msg: "unknown command __bogus__"},
		// Argument rules still apply to what is served.
		{line: "__put__ a", wantErr: ErrArgs},
		{line: "__snapshot__ a b", wantErr: ErrArgs},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			got, err := served.Parse(tt.line)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || (tt.msg != "" && err.Error() != tt.msg) {
					t.Fatalf("error %v, want %v %q", err, tt.wantErr, tt.msg)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %#v, %v; want %#v", got, err, tt.want)
			}
		})
	}

	t.Run("no shell served", func(t *testing.T) {
		s, err := NewSet("__info__")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Parse("ls"); !errors.Is(err, ErrUnknownCommand) {
			t.Fatalf("a shell line on a shell-less set: %v", err)
		}
	})
}

func TestNewSetRejects(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string
	}{
		{"verb outside the protocol", []string{"__info__", "__bogus__"}},
		{"name twice", []string{"__info__", "__info__"}},
		{"shell twice", []string{Shell, Shell}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := NewSet(tc.names...); err == nil {
				t.Fatalf("NewSet(%q) = %v, want an error", tc.names, s.Specs())
			}
		})
	}
}

// Help lists exactly what a set serves, in table order, and tags the
// access and shape from the table.
func TestSetHelp(t *testing.T) {
	s, err := NewSet(Shell, "__put__", "__help__", "__screendiff__")
	if err != nil {
		t.Fatal(err)
	}
	help := s.Help()
	lines := strings.Split(strings.TrimSuffix(help, "\n"), "\n")
	want := []struct{ prefix, tags string }{
		{"__help__ ", ""},
		{"__screendiff__ ", " [primary only, streamed]"},
		{"__put__ <hostpath> <guestpath> ", " [primary only]"},
		{"<anything else> ", " [primary only]"},
	}
	if len(lines) != len(want) {
		t.Fatalf("help has %d lines, want %d:\n%s", len(lines), len(want), help)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w.prefix) {
			t.Errorf("line %d = %q, want prefix %q", i, lines[i], w.prefix)
		}
		if w.tags == "" && strings.Contains(lines[i], "[") || w.tags != "" && !strings.HasSuffix(lines[i], w.tags) {
			t.Errorf("line %d = %q, want tags %q", i, lines[i], w.tags)
		}
	}
	for _, absent := range []string{"__info__", "__events__", "__get__"} {
		if strings.Contains(help, absent) {
			t.Errorf("help lists %s, which the set does not serve", absent)
		}
	}
}

// TestIsControlLine: the forwarder's check decides as the parser does.
func TestIsControlLine(t *testing.T) {
	tests := []struct {
		line string
		want bool
	}{
		{"__info__", true},
		{" \t\r\v\f__park__ x", true},
		{"__unknown__ a b", true},
		{"__", true},
		{"\n__shutdown__\n", true},
		{"_x", false},
		{"./__info__", false},
		{"echo __info__", false},
		{"\u00a0__info__", false},
		{"", false},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			if got := IsControlLine(tt.line); got != tt.want {
				t.Fatalf("IsControlLine(%q) = %v, want %v", tt.line, got, tt.want)
			}
			c, err := Parse(tt.line)
			if err == nil && (c.Name != "") != tt.want {
				t.Fatalf("Parse(%q) = %#v, disagreeing", tt.line, c)
			}
		})
	}
}
