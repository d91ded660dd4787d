// Package screen keeps what the guest's serial console would show on a
// real terminal: console output goes through a terminal emulator
// (github.com/charmbracelet/x/vt), so cursor movement, erases and
// full-screen programs end up as the rows a person would read, and the
// __screen__ and __screendiff__ replies are rendered from it.
//
// Everything the emulator sees is the guest's, so it is treated as
// hostile: a Write never blocks on the emulator's replies, costs bounded
// work per input byte, and keeps memory bounded.
package screen

import (
	"bytes"
	"fmt"
	"io"
	"sync"

	"github.com/charmbracelet/x/vt"

	"github.com/nethersandbox/nether/internal/logtext"
)

// chunkSize is the most a single emulator Write is handed. The emulator
// holds back a grapheme cluster until the end of each Write, so a run of
// combining marks grows one cell without bound; fed in chunks, a cell
// holds at most chunkSize bytes, which keeps a screen and its scrollback
// bounded in memory whatever the guest prints. (The console pump already
// delivers output a few dozen bytes at a time, so splitting a cluster at a
// chunk boundary is no new loss.)
const chunkSize = 256

// crlf is what a line feed is written as; see Terminal.Write.
var crlf = []byte{'\r', '\n'}

// Terminal is a thread-safe terminal fed with console output.
type Terminal struct {
	mu         sync.Mutex
	emu        *vt.Emulator
	replies    io.Closer // the writing end of emu's reply pipe
	scrollback int       // lines of scrollback kept and shown
	closed     bool      // no more input: Write discards
	resets     int       // emulators that panicked (see restart)
	drains     sync.WaitGroup
}

// New returns a terminal of cols x rows that keeps the newest scrollback
// lines that scroll off its top (0 keeps none). Sizes below 1 count as 1.
// Close it to stop its goroutine.
func New(cols, rows, scrollback int) *Terminal {
	t := &Terminal{scrollback: max(scrollback, 0)}
	t.start(max(cols, 1), max(rows, 1))
	return t
}

// start gives t a new emulator and drains its replies.
//
// The emulator answers terminal queries (cursor position, device
// attributes, mode reports ...) by writing into an io.Pipe, and a pipe
// write blocks until someone reads it: a guest printing ESC[6n would stop
// the console pump on its first query. Nobody types into the guest
// through this terminal, so the answers are read and dropped. Closing the
// pipe's writer ends the drain; Emulator.Close would too, but it writes a
// field Emulator.Read reads without a lock. (InputPipe is that
// *io.PipeWriter; TestCloseStopsDrain fails should a new vt change it.)
func (t *Terminal) start(cols, rows int) {
	emu := vt.NewEmulator(cols, rows)
	// The emulator cannot keep no scrollback (0 means its default of
	// 10000), so it keeps one line that Screen never shows.
	emu.SetScrollbackSize(max(t.scrollback, 1))
	clampParams(emu)
	t.emu = emu
	t.replies, _ = emu.InputPipe().(io.Closer)
	t.drains.Add(1)
	go func() {
		defer t.drains.Done()
		buf := make([]byte, 512)
		for {
			if _, err := emu.Read(buf); err != nil {
				return
			}
		}
	}()
}

// Write feeds console output to the terminal. It never fails: output
// after Close is dropped.
//
// A line feed is taken as CR LF. Serial consoles normally send CR LF
// already (the tty's onlcr, and the kernel's own console and early printk
// add the CR themselves), so this changes nothing for them; a bare LF
// comes from a program that turned output processing off and prints text
// anyway, and read literally it draws a staircase that leaves most of
// each line off to the right. A CR before the CR LF is harmless, so no
// state is needed across writes. The cost is that a full-screen program
// using a bare LF as "cursor down, same column" is drawn from column 0;
// the programs a sandbox console runs position the cursor explicitly.
func (t *Terminal) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.closed {
		t.feed(p)
	}
	return len(p), nil
}

func (t *Terminal) feed(p []byte) {
	defer func() {
		if r := recover(); r != nil {
			t.restart(r)
		}
	}()
	for rest := p; len(rest) > 0; {
		chunk := rest[:min(len(rest), chunkSize)]
		if i := bytes.IndexByte(chunk, '\n'); i >= 0 {
			t.emu.Write(chunk[:i])
			t.emu.Write(crlf)
			rest = rest[i+1:]
			continue
		}
		t.emu.Write(chunk)
		rest = rest[len(chunk):]
	}
}

// restart replaces an emulator that panicked on the guest's output with
// a new one of the same size, and says so on its first line. The guards
// in clampParams stop the panics found so far; this is what keeps one not
// found yet from taking nether down with the console pump. The rest of
// the write and the old screen and scrollback are lost.
func (t *Terminal) restart(why any) {
	t.resets++
	cols, rows := t.emu.Width(), t.emu.Height()
	t.replies.Close()
	t.start(cols, rows)
	msg := fmt.Sprintf("[nether: the terminal emulator failed on the guest's output and was reset: %v]", why)
	t.emu.Write(append(logtext.AppendEscaped(nil, msg[:min(len(msg), 200)]), crlf...))
}

// Resize changes the size of the live grid. Text is not reflowed; the
// next Diff of every view returns all rows.
func (t *Terminal) Resize(cols, rows int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.emu.Resize(max(cols, 1), max(rows, 1))
}

// Close stops the goroutine that drains the emulator's replies and waits
// for it. The screen can still be read; further output is dropped.
func (t *Terminal) Close() error {
	t.mu.Lock()
	if !t.closed {
		t.closed = true
		t.replies.Close()
	}
	t.mu.Unlock()
	t.drains.Wait()
	return nil
}
