package consolelog

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// flakyFile is a file that fails its writes while full is set, as a full
// disk does.
type flakyFile struct {
	*os.File
	full bool
}

func (f *flakyFile) WriteAt(p []byte, off int64) (int, error) {
	if f.full {
		return 0, errors.New("no space left on device")
	}
	return f.File.WriteAt(p, off)
}

func open(t *testing.T) *os.File {
	f, err := os.Create(filepath.Join(t.TempDir(), "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func contents(t *testing.T, f *os.File) string {
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBoundKeepsNewest(t *testing.T) {
	cases := []struct {
		name   string
		writes []string
		max    int64
	}{
		{"many small lines", lines(5000), 4096},
		{"one huge write", []string{strings.Repeat("x", 100000) + "TAIL"}, 4096},
		{"unlimited", lines(100), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := open(t)
			w := New(slog.Default(), f, 0, tc.max)
			for _, s := range tc.writes {
				if n, err := w.Write([]byte(s)); err != nil || n != len(s) {
					t.Fatalf("write: %d %v", n, err)
				}
			}
			got := contents(t, f)
			last := tc.writes[len(tc.writes)-1]
			if tc.max > 0 && int64(len(got)) > tc.max {
				t.Fatalf("console.log is %d bytes, limit %d", len(got), tc.max)
			}
			if !strings.HasSuffix(got, last[max(0, len(last)-100):]) {
				t.Fatalf("the newest output is not at the end: ...%q", got[max(0, len(got)-100):])
			}
			if tc.max == 0 && got != strings.Join(tc.writes, "") {
				t.Fatal("an unlimited log lost bytes")
			}
			if tc.max > 0 && !strings.Contains(got, "older bytes dropped") {
				t.Fatal("a trimmed log does not say so")
			}
		})
	}
}

func lines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = strings.Repeat("console line ", 3) + string(rune('a'+i%26)) + "\n"
	}
	return out
}

// TestFullDiskNeverBlocks: writes that fail are dropped and counted, the
// writer keeps accepting, and writing resumes once space is back.
func TestFullDiskNeverBlocks(t *testing.T) {
	var logs bytes.Buffer
	ff := &flakyFile{File: open(t)}
	w := New(slog.New(slog.NewTextHandler(&logs, nil)), ff, 0, 1<<20)
	w.Write([]byte("before\n"))
	ff.full = true
	for range 100 {
		if n, err := w.Write([]byte("lost\n")); err != nil || n != 5 {
			t.Fatalf("a write on a full disk returned %d, %v: the pump would stop", n, err)
		}
	}
	ff.full = false
	w.Write([]byte("after\n"))
	if got := contents(t, ff.File); got != "before\nafter\n" {
		t.Fatalf("console.log = %q", got)
	}
	if dropped, _ := w.Stats(); dropped != 500 {
		t.Fatalf("dropped = %d, want 500", dropped)
	}
	if c := strings.Count(logs.String(), "cannot write"); c != 1 {
		t.Fatalf("the failure was logged %d times, want once:\n%s", c, logs.String())
	}
	if !strings.Contains(logs.String(), "writing again") {
		t.Fatal("the recovery was not logged")
	}
	var _ io.Writer = w
}

// TestTail: Tail is the newest 16 KiB, whatever the write sizes.
func TestTail(t *testing.T) {
	w := New(slog.Default(), open(t), 0, 0)
	var all []byte
	for i := 0; i < 5000; i++ {
		line := []byte(strings.Repeat(string(rune('a'+i%26)), i%50) + "\n")
		all = append(all, line...)
		w.Write(line)
	}
	got := w.Tail()
	if len(got) != tailSize || !bytes.Equal(got, all[len(all)-tailSize:]) {
		t.Fatalf("Tail is %d bytes and not the newest output", len(got))
	}
	small := New(slog.Default(), open(t), 0, 0)
	small.Write([]byte("Kernel panic"))
	if string(small.Tail()) != "Kernel panic" {
		t.Fatalf("Tail of a short log: %q", small.Tail())
	}
}
