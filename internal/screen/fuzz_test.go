package screen

import (
	"testing"
)

// FuzzWrite feeds arbitrary bytes (split in two writes, so sequences
// straddle a write as they do from the console pump) and checks the
// replies stay well formed: header counts match the lines, no row holds a
// raw control byte or invalid UTF-8, the cursor is inside the grid, a
// second Diff with nothing written in between reports nothing, and the
// emulator never panicked (restart would hide it).
func FuzzWrite(f *testing.F) {
	for _, seed := range []string{
		"hello\r\nworld\n",
		"\x1b[2J\x1b[H\x1b[31mred\x1b[0m\x1b[6n\x1b[c",
		"\x1b[?1049h\x1b[5;5Hvi\x1b[?1049l",
		"\x1b]0;title\x07\x1bP1$r\x1b\\\x1b_apc\x1b\\",
		"a\u0301\u0301\u0301日本\U0001F600\xff\xfe\x9b6n",
		"\x1b[2147483647b\x1b[99999X\x1b[3;2r\x1b[10S",
		"\x1b(0lqqk\x1b(B\x0e\x0f\x1b#8",
	} {
		f.Add([]byte(seed), uint16(len(seed)/2))
	}
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		term := New(20, 5, 10)
		defer term.Close()
		var v View
		cut := int(split) % (len(data) + 1)
		for _, part := range [][]byte{data[:cut], data[cut:]} {
			if n, err := term.Write(part); n != len(part) || err != nil {
				t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(part))
			}
			s := parseReply(t, term.Screen())
			if s.kind != "SCREEN" || s.cols != 20 || s.rows != 5 || s.count < 5 || s.count > 15 {
				t.Fatalf("screen header %+v: want SCREEN, 20x5, 5 to 15 lines", s)
			}
			d := parseReply(t, term.Diff(&v))
			if d.kind != "SCREENDIFF" || d.count > 5 {
				t.Fatalf("diff header %+v: want SCREENDIFF, at most 5 rows", d)
			}
			if again := parseReply(t, term.Diff(&v)); again.count != 0 {
				t.Fatalf("second diff with nothing written: %d rows", again.count)
			}
		}
		term.mu.Lock()
		resets := term.resets
		term.mu.Unlock()
		if resets != 0 {
			t.Fatalf("the emulator panicked (%d resets); the screen: %s", resets, term.Screen())
		}
		term.Resize(7, 3)
		if d := parseReply(t, term.Diff(&v)); d.count != 3 || d.cols != 7 {
			t.Fatalf("diff after resize %+v: want all 3 rows of 7 columns", d)
		}
	})
}
