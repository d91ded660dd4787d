// Package consolelog keeps the guest's serial console in a bounded file
// that never pushes back. The console pump must read QEMU's console for as
// long as the guest lives: a pump that stops reading makes every guest
// write to /dev/console block (a panic dump would take minutes). So a
// write that fails is dropped and counted, never returned, and the file is
// kept under its limit by dropping its older half.
package consolelog

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
)

// File is what the log writes to: an *os.File in production.
type File interface {
	io.WriterAt
	io.ReaderAt
	Truncate(size int64) error
}

// Writer is the bounded, never-failing console log.
type Writer struct {
	log *slog.Logger
	f   File
	max int64 // 0 = unlimited

	mu       sync.Mutex
	size     int64 // bytes in the file
	dropped  int64 // bytes that could not be written, in total
	failing  bool  // the last write failed; logged once per episode
	trimmed  int64 // older bytes dropped to stay under max, in total
	trimNote bool
	tail     []byte // the newest tailSize bytes, whatever the file did
}

// tailSize is how much of the newest console output Tail keeps in memory:
// enough for a kernel panic's first lines.
const tailSize = 16 << 10

// New returns a Writer appending to f, which starts at size bytes.
func New(log *slog.Logger, f File, size, max int64) *Writer {
	if max > 0 && max < 4*noteRoom {
		max = 4 * noteRoom
	}
	return &Writer{log: log, f: f, size: size, max: max}
}

// Write implements io.Writer. It always reports success: the console must
// keep draining whatever happens to the file.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	// Console writes are small (QEMU hands over a few dozen bytes at a
	// time): the tail is compacted only once it has doubled, in place, so
	// keeping it costs a copy per 16 KiB written, not per write.
	w.tail = append(w.tail, p...)
	if len(w.tail) > 2*tailSize {
		w.tail = w.tail[:copy(w.tail, w.tail[len(w.tail)-tailSize:])]
	}
	if w.max > 0 {
		keep := w.max / 2
		if int64(len(p)) > keep {
			// One write bigger than what we keep: only its newest part.
			w.trimmed += int64(len(p)) - keep
			p = p[int64(len(p))-keep+int64(noteRoom):]
			w.trim(0)
		}
		if w.size+int64(len(p)) > w.max {
			w.trim(keep - int64(len(p)))
		}
	}
	k, err := w.f.WriteAt(p, w.size)
	w.size += int64(k)
	if err != nil {
		w.dropped += int64(len(p) - k)
		if !w.failing {
			w.failing = true
			w.log.Warn("console log: cannot write; dropping console output until writes succeed again (the guest is not slowed)",
				"err", err, "dropped_bytes", w.dropped)
		}
		return n, nil
	}
	if w.failing {
		w.failing = false
		w.log.Info("console log: writing again", "dropped_bytes_total", w.dropped)
	}
	return n, nil
}

// noteRoom is room kept for the note a trim leaves at the file's start.
const noteRoom = 96

// trim keeps the newest keep bytes of the file at its start.
func (w *Writer) trim(keep int64) {
	if keep < 0 {
		keep = 0
	}
	if keep > w.size {
		keep = w.size
	}
	buf := make([]byte, keep)
	if _, err := w.f.ReadAt(buf, w.size-keep); err != nil && err != io.EOF {
		// Cannot read back: start afresh rather than grow.
		buf = buf[:0]
	}
	note := []byte(fmt.Sprintf("\n[nether: console.log reached its limit; %d older bytes dropped]\n", w.size-int64(len(buf))))
	w.trimmed += w.size - int64(len(buf))
	if int64(len(note)+len(buf)) > keep && int64(len(buf)) > int64(len(note)) {
		buf = buf[len(note):]
	}
	out := append(note, buf...)
	if _, err := w.f.WriteAt(out, 0); err != nil {
		out = out[:0]
	}
	if err := w.f.Truncate(int64(len(out))); err != nil {
		w.log.Warn("console log: cannot truncate", "err", err)
	}
	w.size = int64(len(out))
	if !w.trimNote {
		w.trimNote = true
		w.log.Info("console log reached its limit; keeping the newest output", "max_bytes", w.max)
	}
}

// Tail returns the newest console output (up to 16 KiB), kept in memory
// so it is there even when the file could not be written.
func (w *Writer) Tail() []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]byte(nil), w.tail[max(0, len(w.tail)-tailSize):]...)
}

// Stats reports bytes dropped because writes failed and because of the
// size limit.
func (w *Writer) Stats() (dropped, trimmed int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped, w.trimmed
}
