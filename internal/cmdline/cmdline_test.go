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

func TestCommandClassification(t *testing.T) {
	tests := []struct {
		line              string
		primary, streamed bool
	}{
		{"ls", true, false},
		{"__info__", false, false},
		{"__stats__", false, false},
		{"__help__", false, false},
		{"__events__ 3", false, true},
		{"__screen__", false, true},
		{"__screendiff__", true, true},
		{"__frame__", false, true},
		{"__framediff__", true, true},
		{"__shutdown__", true, false},
		{"__put__ a b", true, false},
		{"__get__ a b", true, false},
		{"__snapshot__", true, false},
		{"__park__", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			c, err := Parse(tt.line)
			if err != nil {
				t.Fatal(err)
			}
			if c.Primary() != tt.primary || c.Streamed() != tt.streamed {
				t.Fatalf("primary=%v streamed=%v, want %v %v", c.Primary(), c.Streamed(), tt.primary, tt.streamed)
			}
		})
	}
}

func TestKnownComplete(t *testing.T) {
	want := strings.Fields("__info__ __stats__ __help__ __shutdown__ __put__ __get__ __snapshot__ __park__ __events__ __cmdlog__ __netlog__ __screen__ __screendiff__ __frame__ __framediff__")
	if len(Known) != len(want) {
		t.Fatalf("Known has %d entries, want %d", len(Known), len(want))
	}
	help := HelpText()
	for _, name := range want {
		in, ok := Lookup(name)
		if !ok || in.Summary == "" {
			t.Errorf("%s missing or without summary", name)
		}
		if !strings.Contains(help, name) {
			t.Errorf("HelpText lacks %s", name)
		}
	}
}
