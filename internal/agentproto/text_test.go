package agentproto

import (
	"testing"
)

// TestTextByteExact: command lines and paths cross the wire byte for byte,
// including bytes that are not UTF-8 (plain JSON strings would turn them
// into U+FFFD).
func TestTextByteExact(t *testing.T) {
	cases := []struct{ name, s string }{
		{"ascii", "printf '%s' hello"},
		{"latin-1 byte", "printf '%s' \xe9t\xe9"},
		{"lone continuation", "\x80\xbf"},
		{"valid utf-8", "échelle ✓"},
		{"empty", ""},
		{"replacement char itself", "\uFFFD"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := Request{Op: OpExec, Command: Text(tc.s), Path: Text(tc.s + "/p")}
			out, err := Decode(in.Encode())
			if err != nil {
				t.Fatal(err)
			}
			if string(out.Command) != tc.s || string(out.Path) != tc.s+"/p" {
				t.Fatalf("got command %q path %q, want %q", out.Command, out.Path, tc.s)
			}
		})
	}
}
