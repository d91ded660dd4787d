package frame

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"testing"
)

// FuzzFrameRoundTrip checks escape -> unescape is the identity, both in one
// piece and when the escaped stream is cut into arbitrary chunks, and that
// escaping never emits a raw Delim.
func FuzzFrameRoundTrip(f *testing.F) {
	f.Add([]byte("hello\n"), []byte{3})
	f.Add([]byte("\x1e0\n"), []byte{1, 1})
	f.Add([]byte("\x1f\x1f\x1e\x1e"), []byte{1, 2, 3})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, x, cuts []byte) {
		esc := AppendEscaped(nil, x)
		if bytes.IndexByte(esc, Delim) >= 0 {
			t.Fatalf("escaped %q contains raw Delim", x)
		}
		var u Unescaper
		if got := u.Append(nil, esc); !bytes.Equal(got, x) || u.Pending() {
			t.Fatalf("unescape(escape(%q)) = %q pending=%v", x, got, u.Pending())
		}

		u.Reset()
		var got []byte
		rest := esc
		for _, c := range cuts {
			n := int(c) % (len(rest) + 1)
			got = u.Append(got, rest[:n])
			rest = rest[n:]
		}
		got = u.Append(got, rest)
		if !bytes.Equal(got, x) || u.Pending() {
			t.Fatalf("chunked unescape of %q = %q (cuts %v)", x, got, cuts)
		}
	})
}

// FuzzReadFrame feeds arbitrary bytes to ReadFrame: it must not panic, the
// body must be exactly the un-escaped bytes before the first raw Delim
// (capped at the limit), and a successful exit must match the trailer text.
func FuzzReadFrame(f *testing.F) {
	f.Add([]byte("out\n\x1e0\n"), int64(-1), uint8(16))
	f.Add([]byte("ERR x\n\x1e-1\n"), int64(3), uint8(16))
	f.Add([]byte("a\x1f^\x1e0\nb\x1e1\n"), int64(-1), uint8(20))
	f.Add([]byte("\x1e99999999999999\n"), int64(-1), uint8(16))
	f.Add([]byte("no trailer"), int64(-1), uint8(16))
	f.Add([]byte("x\x1f"), int64(0), uint8(16))
	f.Fuzz(func(t *testing.T, wire []byte, limit int64, bufSize uint8) {
		br := bufio.NewReaderSize(bytes.NewReader(wire), 16+int(bufSize))
		var body bytes.Buffer
		exit, err := ReadFrame(br, &body, limit)

		delim := bytes.IndexByte(wire, Delim)
		prefix := wire
		if delim >= 0 {
			prefix = wire[:delim]
		}
		var u Unescaper
		want := u.Append(nil, prefix)
		if limit >= 0 && int64(len(want)) > limit {
			want = want[:limit]
		}
		if !bytes.Equal(body.Bytes(), want) {
			t.Fatalf("body %q, want %q (wire %q)", body.Bytes(), want, wire)
		}
		if delim < 0 {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("no delimiter but err = %v", err)
			}
			return
		}
		if err != nil {
			return
		}
		nl := bytes.IndexByte(wire[delim+1:], '\n')
		if nl < 0 {
			t.Fatalf("success without a newline in %q", wire)
		}
		v, perr := strconv.Atoi(string(wire[delim+1 : delim+1+nl]))
		if perr != nil || v != exit {
			t.Fatalf("exit %d does not match trailer %q", exit, wire[delim+1:delim+1+nl])
		}
	})
}
