// Package logtext keeps text that goes into nether's line-based logs
// (__events__, __cmdlog__) to one line of printable UTF-8. Much of that
// text is the guest's or a client's (a command as sent, a path), and a log
// line must never be split, forged or framed by it.
package logtext

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Escape returns s with every byte a log line must not carry written as
// \xNN: control bytes (newline, 0x1e and 0x1f among them), DEL and bytes
// that are not valid UTF-8. A backslash becomes \\, so the escaping is
// reversible and a literal "\x0a" in a command is not mistaken for one
// that was escaped. Text with none of those is returned as is.
func Escape(s string) string {
	if clean(s) {
		return s
	}
	return string(AppendEscaped(make([]byte, 0, len(s)+16), s))
}

// AppendEscaped appends s, escaped as Escape does, to dst.
func AppendEscaped(dst []byte, s string) []byte {
	const digits = "0123456789abcdef"
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1, r < 0x20, r == 0x7f:
			dst = append(dst, '\\', 'x', digits[s[i]>>4], digits[s[i]&0xf])
		case r == '\\':
			dst = append(dst, '\\', '\\')
		default:
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return dst
}

// clean reports whether s needs no escaping.
func clean(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, needsEscape)
}

func needsEscape(r rune) bool { return r < 0x20 || r == 0x7f || r == '\\' }

// Truncate cuts s to at most max bytes on a rune boundary and says how
// much was cut, so a log keeps a bounded prefix of an enormous command.
func Truncate(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...[" + strconv.Itoa(len(s)-cut) + " more bytes]"
}
