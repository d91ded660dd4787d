package runner

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Mark is a place in a launch directory's outputs: the offsets where its
// Stdout and Stderr ended. The files keep every earlier session's output
// too; what a launch prints comes after the mark taken before it.
type Mark struct{ Out, Log int64 }

// MarkOf is where dir's outputs end now.
func MarkOf(dir string) Mark {
	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	return Mark{Out: size(Stdout), Log: size(Stderr)}
}

// FinalSince is the last final usage record in dir's Stdout from from on
// ("" if none).
func FinalSince(dir string, from Mark) string {
	lines := strings.Split(strings.TrimSpace(readFrom(filepath.Join(dir, Stdout), from.Out)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "[nether] ") {
			return lines[i]
		}
	}
	return ""
}

// WhySince is the last error the nether in dir logged from from on (its
// err= when the line has one), or where to look.
func WhySince(dir string, from Mark) string {
	path := filepath.Join(dir, Stderr)
	lines := strings.Split(strings.TrimSpace(readFrom(path, from.Log)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], "level=ERROR") {
			if e, ok := logErr(lines[i]); ok {
				return e
			}
			return lines[i]
		}
		if strings.HasPrefix(lines[i], "nether:") {
			return lines[i]
		}
	}
	return "see " + path
}

// FinalReason is reason=<r> of a final record ("" when it has none).
func FinalReason(final string) string {
	_, rest, ok := strings.Cut(final, "(reason=")
	if !ok {
		return ""
	}
	r, _, _ := strings.Cut(rest, ")")
	return r
}

// FailedReason reports whether a final record's reason is a failure
// (nether's exit status 1): the engine or the sandbox failed, or its
// guest crashed.
func FailedReason(reason string) bool {
	switch reason {
	case "error", "guest_panic", "guest_crash":
		return true
	}
	return false
}

// logErr is the err= value of a log line of slog's text handler, which
// quotes a value as strconv.Quote does when it must.
func logErr(line string) (string, bool) {
	_, v, ok := strings.Cut(line, " err=")
	if !ok || v == "" {
		return "", false
	}
	if v[0] != '"' {
		v, _, _ = strings.Cut(v, " ")
		return v, true
	}
	q, err := strconv.QuotedPrefix(v)
	if err != nil {
		return "", false
	}
	e, err := strconv.Unquote(q)
	return e, err == nil
}

// readFrom is the file at path from byte from on ("" if it cannot be
// read).
func readFrom(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
