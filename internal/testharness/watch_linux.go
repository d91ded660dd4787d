package testharness

import (
	"errors"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DirWatch records every entry whose name starts with a prefix that
// appears in a directory (created or moved in), however briefly it
// stays: a before-and-after listing misses what came and went.
type DirWatch struct {
	dir, prefix string
	f           *os.File
	initial     map[string]bool

	mu     sync.Mutex
	events []DirEvent
	err    error
}

// DirEvent is one entry that appeared.
type DirEvent struct {
	Name string
	At   time.Time
}

// WatchDir starts watching dir for entries named prefix*.
func WatchDir(dir, prefix string) (*DirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, err
	}
	w := &DirWatch{dir: dir, prefix: prefix, f: os.NewFile(uintptr(fd), "inotify:"+dir), initial: map[string]bool{}}
	names, _ := Entries(dir)
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			w.initial[n] = true
		}
	}
	go w.read()
	return w, nil
}

func (w *DirWatch) read() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
			return
		}
		now := time.Now()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := inotifyEventAt(buf, off)
			name := ""
			if ev.Len > 0 {
				raw := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name = strings.TrimRight(string(raw), "\x00")
			}
			w.mu.Lock()
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				w.err = errors.New("inotify queue overflowed: events were lost")
			} else if strings.HasPrefix(name, w.prefix) {
				w.events = append(w.events, DirEvent{Name: name, At: now})
			}
			w.mu.Unlock()
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
	}
}

// Since returns the entries that appeared at or after t, plus any entry
// present now that was not there when the watch began; err is set when
// the watch itself failed (events may be missing).
func (w *DirWatch) Since(t time.Time) (names []string, err error) {
	seen := map[string]bool{}
	w.mu.Lock()
	for _, e := range w.events {
		if !e.At.Before(t) && !seen[e.Name] {
			seen[e.Name] = true
			names = append(names, e.Name)
		}
	}
	err = w.err
	w.mu.Unlock()
	now, _ := Entries(w.dir)
	for _, n := range now {
		if strings.HasPrefix(n, w.prefix) && !w.initial[n] && !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	return names, err
}

// Close stops the watch.
func (w *DirWatch) Close() error { return w.f.Close() }
