package logtext

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestEscape(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"plain", "echo hi", "echo hi"},
		{"utf8 kept", "echo héllo ☃", "echo héllo ☃"},
		{"newline", "a\nb", `a\x0ab`},
		{"frame bytes", "x\x1e0\n\x1f", `x\x1e0\x0a\x1f`},
		{"nul and del", "\x00\x7f", `\x00\x7f`},
		{"backslash", `a\b`, `a\\b`},
		{"literal escape is not an escape", `\x0a`, `\\x0a`},
		{"invalid utf8", "a\xffb\xc3", `a\xffb\xc3`},
		{"utf8 with control", "é\t", `é\x09`},
		{"empty", "", ""},
		{"truncated rune", "cut\xe6\x97", `cut\xe6\x97`},
		{"wide runes kept", "é日🙂", "é日🙂"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Escape(tc.in); got != tc.want {
				t.Errorf("Escape(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		max      int
		want     string
	}{
		{"short", "abc", 5, "abc"},
		{"exact", "abcde", 5, "abcde"},
		{"cut", "abcdefgh", 5, "abcde...[3 more bytes]"},
		{"rune boundary", "ab☃cd", 3, "ab...[5 more bytes]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Truncate(tc.in, tc.max); got != tc.want {
				t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
			}
		})
	}
}

func FuzzEscape(f *testing.F) {
	for _, s := range []string{"echo hi", "a\nb", "\x1e0\n", "é\xff", `\\x`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Escape(s)
		if !utf8.ValidString(got) {
			t.Fatalf("Escape(%q) = %q: not valid UTF-8", s, got)
		}
		if strings.ContainsFunc(got, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("Escape(%q) = %q: a control byte got through", s, got)
		}
		if unescape(got) != s {
			t.Fatalf("Escape(%q) = %q does not unescape back", s, got)
		}
	})
}

// unescape reverses Escape, to prove the escaping loses nothing.
func unescape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if s[i+1] == '\\' {
			b.WriteByte('\\')
			i++
			continue
		}
		var v byte
		for _, c := range []byte(s[i+2 : i+4]) {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= c - '0'
			default:
				v |= c - 'a' + 10
			}
		}
		b.WriteByte(v)
		i += 3
	}
	return b.String()
}
