package cmdline

import (
	"strings"
	"testing"
)

// FuzzParse: Parse never panics, and whatever it accepts is safe to relay:
// no frame byte, NUL or newline in the shell text or arguments, and no
// whitespace inside an argument; and IsControlLine agrees with it, so a
// line a forwarder lets through as a shell command is one nether runs as
// a shell command.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"ls -la", "__info__", "__put__ a b", "__get__ a b c", "__events__ 7",
		"__snapshot__ x y", "echo \x1e0", " \t\r\n", "__", "__park__\t\tp ",
		"true\nreboot", "__events__ -0", "\x00", "__put__ a\u00a0b c",
		"__claim__ id host", "__claim__\tid\v host ", "__claim__ id", "__claim__ a b c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		c, err := Parse(line)
		if IsControlLine(line) && err == nil && c.Name == "" {
			t.Fatalf("IsControlLine(%q) but Parse made it a shell command", line)
		}
		if !IsControlLine(line) && err == nil && c.Name != "" {
			t.Fatalf("Parse(%q) made verb %q that IsControlLine missed", line, c.Name)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error text")
			}
			return
		}
		bad := func(s string) bool { return strings.ContainsAny(s, "\x1e\x1f\x00\n") }
		if c.Name == "" {
			if c.Shell == "" || bad(c.Shell) || c.Args != nil {
				t.Fatalf("bad shell command %#v from %q", c, line)
			}
			if c.Shell != strings.TrimFunc(c.Shell, isBlank) {
				t.Fatalf("untrimmed shell %q", c.Shell)
			}
			return
		}
		if c.Shell != "" {
			t.Fatalf("control command with shell text: %#v", c)
		}
		if _, ok := Lookup(c.Name); !ok {
			t.Fatalf("unknown name accepted: %q", c.Name)
		}
		for _, a := range c.Args {
			if a == "" || bad(a) || strings.ContainsAny(a, " \t\r\v\f") {
				t.Fatalf("bad argument %q from %q", a, line)
			}
		}
	})
}
