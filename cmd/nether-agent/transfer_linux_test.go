package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// wantReset checks r is the agent's reset with exactly msg.
func wantReset(t *testing.T, what string, r result, msg string) {
	t.Helper()
	if !errors.Is(r.err, channel.ErrReset) || r.err.Error() != channel.ErrReset.Error()+": "+msg {
		t.Fatalf("%s: out %q, status %q, err %v; want the reset %q", what, r.out, r.status, r.err, msg)
	}
}

// noTemporaries checks a put left no temporary file in dir.
func noTemporaries(t *testing.T, dir string) {
	t.Helper()
	if tmp, _ := filepath.Glob(filepath.Join(dir, ".nether-put-*")); len(tmp) > 0 {
		t.Fatalf("temporary files left behind: %v", tmp)
	}
}

// specials makes one of each kind of file that is not a regular file in
// dir, and symlinks to some, and returns them by name. A character device
// is among them when this process may make one; it is a node in dir, so
// nothing outside dir is ever a target.
func specials(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	mk := func(name string, f func(p string) error) {
		p := filepath.Join(dir, name)
		if err := f(p); err != nil {
			t.Fatalf("making %s: %v", name, err)
		}
		m[name] = p
	}
	mk("fifo", func(p string) error { return unix.Mkfifo(p, 0o600) })
	mk("dir", func(p string) error { return os.Mkdir(p, 0o700) })
	mk("socket", func(p string) error {
		l, err := net.Listen("unix", p)
		if err != nil {
			return err
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		return l.Close() // the socket file stays
	})
	mk("link-to-fifo", func(p string) error { return os.Symlink("fifo", p) })
	mk("link-to-dir", func(p string) error { return os.Symlink("dir", p) })
	mk("link-to-devnull", func(p string) error { return os.Symlink("/dev/null", p) })
	if err := unix.Mknod(filepath.Join(dir, "chardev"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err == nil {
		m["chardev"] = filepath.Join(dir, "chardev")
	} else {
		t.Logf("no character device in the test (mknod: %v)", err)
	}
	return m
}

func TestGetRefusesWhatIsNotARegularFile(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	targets := specials(t, dir)
	targets["/dev/null"] = "/dev/null" // read-only here, so safe to name
	for name, p := range targets {
		t.Run(name, func(t *testing.T) {
			// A FIFO without a writer would block an open without
			// O_NONBLOCK for ever; do gives up after 10s.
			start := time.Now()
			r := ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(p)}, "")
			wantReset(t, "get "+name, r, p+": not a regular file")
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("refusing took %v", d)
			}
		})
	}
	ta.waitServed(t)
}

func TestGetLimit(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "ten")
	writeFile(t, f, "0123456789")
	proc, err := os.ReadFile("/proc/version") // stat says 0 bytes
	if err != nil || len(proc) < 10 {
		t.Fatalf("/proc/version: %q, %v", proc, err)
	}
	for _, tc := range []struct {
		name      string
		path      string
		max       int64
		want      string // the bytes, when the get succeeds
		wantReset string
	}{
		{"no limit", f, 0, "0123456789", ""},
		{"at the limit", f, 10, "0123456789", ""},
		{"over the limit", f, 9, "", f + ": 10 bytes, over the transfer limit of 9"},
		{"negative limit", f, -1, "", "invalid transfer limit -1"},
		{"proc file", "/proc/version", 0, string(proc), ""},
		{"proc file at its length", "/proc/version", int64(len(proc)), string(proc), ""},
		{"proc file past the limit", "/proc/version", 5, "", "/proc/version: more than 5 bytes, over the transfer limit of 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(tc.path), Max: tc.max}, "")
			if tc.wantReset != "" {
				wantReset(t, "get", r, tc.wantReset)
				return
			}
			if r.err != nil || r.out != tc.want || r.status != fmt.Sprintf("ok %d", len(tc.want)) {
				t.Fatalf("get: out %q, status %q, err %v; want %q", r.out, r.status, r.err, tc.want)
			}
		})
	}
	ta.waitServed(t)
}

// TestGetEndsWhenTheHostLeaves serves a get from a source that has nothing
// more to give and never ends, as /proc/kmsg (which the test cannot read
// without taking the host's kernel messages): a pipe whose writer the test
// holds. The get must end, and close the source, when the host resets the
// stream or the channel closes.
func TestGetEndsWhenTheHostLeaves(t *testing.T) {
	for _, how := range []string{"host resets", "channel closes"} {
		t.Run(how, func(t *testing.T) {
			ta := startAgent(t)
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			rfd, wfd := p[0], p[1]
			defer unix.Close(wfd)
			ta.a.openSource = func(string) (int, int64, error) { return rfd, 0, nil }

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpGet, Path: "/proc/kmsg"}.Encode())
			if err != nil {
				t.Fatal(err)
			}
			s.CloseWrite(nil)
			if _, err := unix.Write(wfd, []byte("hello")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 5)
			if n, err := s.ReadContext(ctx, buf); err != nil || string(buf[:n]) != "hello" {
				t.Fatalf("host read %q, %v", buf[:n], err)
			}
			// Long enough for the agent to be waiting on the empty source.
			time.Sleep(3 * pollInterval)
			if ta.a.serving.Load() != 1 {
				t.Fatal("the get ended on its own")
			}
			if how == "host resets" {
				s.Reset("host gave up")
			} else {
				ta.a.mux.Close()
			}
			ta.waitServed(t)
			// The read end is closed: the pipe is broken.
			if _, err := unix.Write(wfd, []byte("x")); err != unix.EPIPE {
				t.Fatalf("writing to the source after the get ended: %v, want EPIPE (the agent still holds it)", err)
			}
		})
	}
}

// TestGetEndsWhileTheHostDoesNotRead: a get blocked on sending (the host
// stopped reading, the credit window is full) ends when the host resets.
func TestGetEndsWhileTheHostDoesNotRead(t *testing.T) {
	ta := startAgent(t)
	f := filepath.Join(t.TempDir(), "big")
	writeFile(t, f, strings.Repeat("x", 4*channel.Window))
	s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(f)}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	s.CloseWrite(nil)
	time.Sleep(100 * time.Millisecond)
	s.Reset("host gave up")
	ta.waitServed(t)
}

func TestPutRefusesToReplaceWhatIsNotARegularFile(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	targets := specials(t, dir)
	for name, p := range targets {
		t.Run(name, func(t *testing.T) {
			before, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(p)}, "clobber")
			wantReset(t, "put onto "+name, r, p+": not a regular file; refusing to replace it")
			after, err := os.Lstat(p)
			if err != nil || after.Mode() != before.Mode() {
				t.Fatalf("%s was replaced: mode %v -> %v (%v)", name, before.Mode(), after.Mode(), err)
			}
			noTemporaries(t, dir)
		})
	}
	t.Run("a name ending in a slash", func(t *testing.T) {
		for _, p := range []string{dir + "/new/", dir + "/.", dir + "/dir/.."} {
			r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(p)}, "clobber")
			wantReset(t, "put onto "+p, r, p+": names a directory, not a file")
		}
	})
	t.Run("a regular file and a symlink to one are replaced", func(t *testing.T) {
		reg := filepath.Join(dir, "regular")
		writeFile(t, reg, "old")
		if r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(reg)}, "new"); r.err != nil {
			t.Fatal(r.err)
		}
		wantFile(t, reg, "new")
		link := filepath.Join(dir, "link-to-regular")
		if err := os.Symlink("regular", link); err != nil {
			t.Fatal(err)
		}
		if r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(link)}, "newer"); r.err != nil {
			t.Fatal(r.err)
		}
		// As before: the link itself becomes the file.
		if fi, err := os.Lstat(link); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s after the put: %v, %v", link, fi.Mode(), err)
		}
		wantFile(t, link, "newer")
		wantFile(t, reg, "new")
	})
	ta.waitServed(t)
	noTemporaries(t, dir)
}

func TestPutLimit(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "f")
	r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target), Max: 10}, "0123456789")
	if r.err != nil || r.status != "ok 10" {
		t.Fatalf("put at the limit: status %q, err %v", r.status, r.err)
	}
	wantFile(t, target, "0123456789")

	r = ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target), Max: 10}, "0123456789A")
	wantReset(t, "put over the limit", r, target+": more than 10 bytes, over the transfer limit of 10")
	wantFile(t, target, "0123456789")

	// A host that keeps sending is cut off too, well before it is done.
	s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target), Max: 1000}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = s.WriteContext(ctx, bytes.Repeat([]byte("y"), channel.Window))
	}
	if !errors.Is(werr, channel.ErrReset) || !strings.Contains(werr.Error(), "over the transfer limit of 1000") {
		t.Fatalf("endless put: %v, want the agent's reset", werr)
	}

	r = ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target), Max: -5}, "x")
	wantReset(t, "negative limit", r, "invalid transfer limit -5")
	ta.waitServed(t)
	wantFile(t, target, "0123456789")
	noTemporaries(t, dir)
}

// TestPutEndsWhenTheHostLeaves: a put the host abandons halfway removes
// its temporary file and leaves the target alone.
func TestPutEndsWhenTheHostLeaves(t *testing.T) {
	for _, how := range []string{"host resets", "channel closes"} {
		t.Run(how, func(t *testing.T) {
			ta := startAgent(t)
			dir := t.TempDir()
			target := filepath.Join(dir, "f")
			writeFile(t, target, "old")
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s := startPut(ctx, t, ta, target, "half of it")
			if how == "host resets" {
				s.Reset("host gave up")
			} else {
				ta.a.mux.Close()
			}
			ta.waitServed(t)
			noTemporaries(t, dir)
			wantFile(t, target, "old")
		})
	}
}

// openFDs lists this process's open descriptors.
func openFDs(t *testing.T) map[string]string {
	t.Helper()
	des, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, de := range des {
		m[de.Name()], _ = os.Readlink("/proc/self/fd/" + de.Name())
	}
	return m
}

// TestTransfersReleaseDescriptors runs transfers that end every way there
// is, and commands, and checks the agent (this process) holds no more
// descriptors afterwards than before.
func TestTransfersReleaseDescriptors(t *testing.T) {
	// Without a collection nothing is closed behind the agent's back (an
	// unreachable os.Process closes its pidfd when collected).
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Warm up: the runtime opens its poller on first use.
	{
		ta := startAgent(t)
		f := filepath.Join(t.TempDir(), "warm")
		ta.do(t, agentproto.Request{Op: agentproto.OpExec, Command: "true"}, "")
		ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(f)}, "w")
		ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(f)}, "")
		ta.waitServed(t)
	}
	before := openFDs(t)

	for range 3 {
		TestGetRefusesWhatIsNotARegularFile(t)
		TestGetLimit(t)
		TestGetEndsWhenTheHostLeaves(t)
		TestGetEndsWhileTheHostDoesNotRead(t)
		TestPutRefusesToReplaceWhatIsNotARegularFile(t)
		TestPutLimit(t)
		TestPutEndsWhenTheHostLeaves(t)
		TestTransferPathsByteExact(t)
		ta := startAgent(t)
		for range 5 {
			if r := ta.do(t, agentproto.Request{Op: agentproto.OpExec, Command: "echo hi"}, ""); r.out != "hi\n" {
				t.Fatalf("exec: %q %v", r.out, r.err)
			}
		}
		ta.waitServed(t)
	}

	var after map[string]string
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		after = openFDs(t)
		if len(after) <= len(before) || time.Now().After(deadline) {
			break
		}
	}
	if len(after) > len(before) {
		var extra []string
		for fd, target := range after {
			if before[fd] != target {
				extra = append(extra, fd+" -> "+target)
			}
		}
		t.Fatalf("%d descriptors open before, %d after; new: %v", len(before), len(after), extra)
	}
}

func TestGuestPath(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "/etc/hostname", want: "/etc/hostname"},
		{in: "notes.txt", want: "/root/notes.txt"},
		{in: "a//b/../c/./", want: "/root/a//b/../c/./"},
		{in: "/a//b/../c", want: "/a//b/../c"},
		{in: "caf\xe9", want: "/root/caf\xe9"},
		{in: "", err: "empty guest path"},
		{in: "a\x00b", err: `"a\x00b": guest path holds a NUL byte`},
	} {
		got, err := guestPath(tc.in)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("guestPath(%q) = %q, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("guestPath(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

// TestTransferPathsByteExact puts and gets files whose names are not
// UTF-8 or hold control bytes, and a path whose meaning lexical cleaning
// would change.
func TestTransferPathsByteExact(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	for _, name := range []string{"caf\xe9", "\xff\xfe", "\x80", "new\nline", "tab\there", "été", "\uFFFD"} {
		t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
			p := dir + "/" + name
			body := "content of " + name
			if r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(p)}, body); r.err != nil {
				t.Fatalf("put: %v", r.err)
			}
			wantFile(t, p, body)
			r := ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(p)}, "")
			if r.err != nil || r.out != body {
				t.Fatalf("get: %q, %v", r.out, r.err)
			}
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		})
	}
	if des, _ := os.ReadDir(dir); len(des) != 0 {
		t.Fatalf("files under other names: %v", des)
	}

	t.Run("dot-dot after a symlink", func(t *testing.T) {
		// link/.. is real, not dir: the kernel resolves it through the
		// link, where filepath.Clean would have dropped both.
		if err := os.MkdirAll(filepath.Join(dir, "real", "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("real/sub", filepath.Join(dir, "link")); err != nil {
			t.Fatal(err)
		}
		p := dir + "//link/../x"
		if r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(p)}, "x"); r.err != nil {
			t.Fatalf("put: %v", r.err)
		}
		wantFile(t, filepath.Join(dir, "real", "x"), "x")
		if _, err := os.Lstat(filepath.Join(dir, "x")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("the put went to the cleaned path: %v", err)
		}
		if r := ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(p)}, ""); r.err != nil || r.out != "x" {
			t.Fatalf("get: %q, %v", r.out, r.err)
		}
	})

	t.Run("NUL", func(t *testing.T) {
		p := dir + "/a\x00b"
		want := fmt.Sprintf("%q: guest path holds a NUL byte", p)
		wantReset(t, "put", ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(p)}, "x"), want)
		wantReset(t, "get", ta.do(t, agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(p)}, ""), want)
		if _, err := os.Lstat(dir + "/a"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("a put to a path with a NUL created its prefix: %v", err)
		}
	})
	ta.waitServed(t)
	noTemporaries(t, dir)
}
