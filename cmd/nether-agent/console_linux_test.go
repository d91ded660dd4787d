package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestLookupAccount(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	os.WriteFile(passwd, []byte(strings.Join([]string{
		"root:x:0:0:root:/root:/bin/sh",
		"nether:x:1000:1000:nether:/home/nether:/bin/sh",
		"broken:x:12:",
		"baduid:x:-1:5::/:/bin/sh",
		"",
	}, "\n")), 0o644)
	tests := []struct {
		name    string
		want    account
		wantErr error
	}{
		{"root", account{name: "root", uid: 0, gid: 0, home: "/root"}, nil},
		{"nether", account{name: "nether", uid: 1000, gid: 1000, home: "/home/nether"}, nil},
		{"nobody", account{}, errNoSuchUser},
		{"", account{}, errNoSuchUser},
		{"broken", account{}, errNoSuchUser},   // not a whole entry: skipped
		{"nether:x", account{}, errNoSuchUser}, // a name never matches part of a line
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lookupAccount(passwd, tt.name)
			if !errors.Is(err, tt.wantErr) || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("lookupAccount(%q) = %+v, %v; want %+v, %v", tt.name, got, err, tt.want, tt.wantErr)
			}
		})
	}
	t.Run("bad uid", func(t *testing.T) {
		if _, err := lookupAccount(passwd, "baduid"); err == nil || errors.Is(err, errNoSuchUser) {
			t.Errorf("err = %v; want one about the entry", err)
		}
	})
	t.Run("no passwd", func(t *testing.T) {
		if _, err := lookupAccount(filepath.Join(t.TempDir(), "none"), "root"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("err = %v; want ErrNotExist", err)
		}
	})
}

func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	b := backoff{min: 500 * ms, max: 4 * time.Second, stable: 10 * time.Second}
	steps := []struct {
		ran, want time.Duration
	}{
		{0, 500 * ms},                      // first exit: the shortest wait
		{10 * ms, 1 * time.Second},         // died at once: doubled
		{10 * ms, 2 * time.Second},         //
		{10 * ms, 4 * time.Second},         //
		{10 * ms, 4 * time.Second},         // capped
		{9 * time.Second, 4 * time.Second}, // short of stable still counts as dying
		{10 * time.Second, 500 * ms},       // ran a while (a user typed exit): back to the shortest
		{10 * ms, 1 * time.Second},
	}
	for i, s := range steps {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if got := b.next(s.ran); got != s.want {
				t.Errorf("after a shell that ran %s: wait %s, want %s", s.ran, got, s.want)
			}
		})
	}
}

func TestConsoleDevice(t *testing.T) {
	for active, want := range map[string]string{
		"ttyS0\n":      "/dev/ttyS0",
		"tty0 ttyS0\n": "/dev/ttyS0",
		"ttyS1":        "/dev/ttyS1",
		"":             "/dev/ttyS0",
	} {
		t.Run(active, func(t *testing.T) {
			if got := consoleDevice(active); got != want {
				t.Errorf("consoleDevice(%q) = %q, want %q", active, got, want)
			}
		})
	}
}

// openPTY returns the master of a new pseudo-terminal and the path of its
// slave, to stand in for the serial console.
func openPTY(t *testing.T) (*os.File, string) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pty: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("naming the pty: %v", err)
	}
	return master, fmt.Sprintf("/dev/pts/%d", n)
}

// screenText collects what a terminal's master side reads.
type screenText struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (s *screenText) read(master *os.File) {
	b := make([]byte, 4096)
	for {
		n, err := master.Read(b)
		s.mu.Lock()
		s.buf.Write(b[:n])
		s.mu.Unlock()
		if errors.Is(err, syscall.EIO) {
			// No slave open between two shells.
			time.Sleep(5 * time.Millisecond)
		} else if err != nil {
			return
		}
	}
}

// waitFor waits until the text read holds any of wants count times in all.
func (s *screenText) waitFor(t *testing.T, count int, wants ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		text := s.buf.String()
		s.mu.Unlock()
		n := 0
		for _, w := range wants {
			n += strings.Count(text, w)
		}
		if n >= count {
			return text
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d× %q on the terminal; it shows %q", count, wants, text)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestConsoleShellRespawns runs the console shell loop on a pty with the
// host's sh: the shell leads its own session with the pty as its
// controlling terminal, its exit reaches the loop through the reaper, and
// a new shell comes up.
func TestConsoleShellRespawns(t *testing.T) {
	master, slave := openPTY(t)
	var seen screenText
	go seen.read(master)

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	sh := &consoleShell{
		tty:   slave,
		shell: "/bin/sh",
		// uid 0 sets no credentials: the shell runs as whoever runs the test.
		user:  account{name: "root", home: t.TempDir()},
		delay: backoff{min: 10 * time.Millisecond, max: 10 * time.Millisecond, stable: time.Hour},
		log:   quietLog(),
	}
	go func() {
		defer close(stopped)
		sh.run(ctx, testReaper())
	}()

	// Field 6 of /proc/<pid>/stat is the session, field 7 the controlling
	// terminal (0 for none).
	probe := `read pid comm state ppid pgrp sid ctty rest < /proc/$$/stat; echo "probe pid=$pid sid=$sid ctty=$ctty term=$TERM"; exit 3` + "\n"
	// The prompt: ours from PS1 with a shell that expands it, or whatever
	// the host's /etc/profile sets.
	prompts := []string{"$ ", "# "}
	for i := 1; i <= 2; i++ {
		seen.waitFor(t, i, prompts...)
		master.Write([]byte(probe))
		text := seen.waitFor(t, 2*i, "probe pid=") // the echo of the line typed, then the output
		line := text[strings.LastIndex(text, "probe pid="):]
		line = line[:strings.IndexAny(line, "\r\n")]
		var pid, sid, ctty int
		var term string
		if _, err := fmt.Sscanf(line, "probe pid=%d sid=%d ctty=%d term=%s", &pid, &sid, &ctty, &term); err != nil {
			t.Fatalf("shell %d printed %q: %v", i, line, err)
		}
		t.Logf("shell %d: %s", i, line)
		if sid != pid || ctty == 0 || term != "linux" {
			t.Errorf("shell %d: %q; want it to lead its session (sid = pid), a controlling terminal, TERM=linux", i, line)
		}
	}
	seen.waitFor(t, 3, prompts...) // the third shell
	cancel()
	master.Write([]byte("exit\n"))
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not stop after its shell exited with the context done")
	}
}
