//go:build linux

package jail

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// setup builds:
//
//	outside/secret            (must never be reachable)
//	jail/file.txt             "inside"
//	jail/sub/nested.txt       "nested"
//	jail/dir/                 (empty dir)
//	jail/link-dir  -> outside (symlink used as a directory component)
//	jail/link-file -> outside/secret
//	jail/inner-link -> file.txt (symlink that stays inside: still refused)
//	jail/fifo                 (named pipe)
func setup(t *testing.T) (root, jailDir, outside string) {
	t.Helper()
	root = t.TempDir()
	jailDir = filepath.Join(root, "jail")
	outside = filepath.Join(root, "outside")
	for _, d := range []string{jailDir, outside, filepath.Join(jailDir, "sub"), filepath.Join(jailDir, "dir")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(outside, "secret"), "secret")
	write(filepath.Join(jailDir, "file.txt"), "inside")
	write(filepath.Join(jailDir, "sub", "nested.txt"), "nested")
	for link, target := range map[string]string{
		"link-dir":   outside,
		"link-file":  filepath.Join(outside, "secret"),
		"inner-link": "file.txt",
	} {
		if err := os.Symlink(target, filepath.Join(jailDir, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(jailDir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return root, jailDir, outside
}

// bothResolvers runs f with openat2 and with the forced ENOSYS fallback.
func bothResolvers(t *testing.T, f func(t *testing.T)) {
	t.Run("openat2", f)
	t.Run("fallback-walk", func(t *testing.T) {
		saved := openat2
		openat2 = func(int, string, *unix.OpenHow) (int, error) { return -1, unix.ENOSYS }
		t.Cleanup(func() { openat2 = saved })
		f(t)
	})
}

func TestOpenReadRefusals(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		_, jailDir, _ := setup(t)
		j, err := Open(jailDir)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()

		tests := []struct {
			name string
			rel  string
			want error
		}{
			{"empty", "", ErrInvalidPath},
			{"absolute", "/etc/passwd", ErrEscape},
			{"dotdot", "../outside/secret", ErrEscape},
			{"dotdot in middle", "sub/../../outside/secret", ErrEscape},
			{"dotdot that stays inside is still refused", "sub/../file.txt", ErrEscape},
			{"symlink dir component", "link-dir/secret", ErrSymlink},
			{"symlink final component", "link-file", ErrSymlink},
			{"symlink inside jail", "inner-link", ErrSymlink},
			{"directory", "dir", ErrIsDir},
			{"directory trailing slash", "sub/", ErrIsDir},
			{"jail root", ".", ErrIsDir},
			{"fifo", "fifo", ErrNotRegular},
			{"missing", "nope.txt", unix.ENOENT},
			{"nul", "a\x00b", ErrInvalidPath},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				f, err := j.OpenRead(tt.rel)
				if err == nil {
					f.Close()
					t.Fatalf("OpenRead(%q) succeeded", tt.rel)
				}
				if !errors.Is(err, tt.want) {
					t.Fatalf("OpenRead(%q) = %v, want %v", tt.rel, err, tt.want)
				}
				prefix := `transfer jail: opening "` + strings.ReplaceAll(tt.rel, "\x00", `\x00`) + `" for reading: `
				if !strings.HasPrefix(err.Error(), prefix) {
					t.Fatalf("error %q lacks context prefix %q", err, prefix)
				}
			})
		}
	})
}

func TestOpenReadSuccess(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		_, jailDir, _ := setup(t)
		j, err := Open(jailDir)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()
		for rel, want := range map[string]string{
			"file.txt":         "inside",
			"./file.txt":       "inside",
			"sub/nested.txt":   "nested",
			"sub//nested.txt":  "nested",
			"sub/./nested.txt": "nested",
		} {
			t.Run(rel, func(t *testing.T) {
				f, err := j.OpenRead(rel)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				got, err := io.ReadAll(f)
				if err != nil || string(got) != want {
					t.Fatalf("read %q, %v; want %q", got, err, want)
				}
			})
		}
	})
}

// TestSwapAfterOpen replaces path components with symlinks after the jail
// was pinned: the classic check-then-use race the fd pinning exists for.
func TestSwapAfterOpen(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		root, jailDir, outside := setup(t)
		j, err := Open(jailDir)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()

		t.Run("directory component swapped for symlink", func(t *testing.T) {
			sub := filepath.Join(jailDir, "sub")
			if err := os.RemoveAll(sub); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, sub); err != nil {
				t.Fatal(err)
			}
			if _, err := j.OpenRead("sub/secret"); !errors.Is(err, ErrSymlink) {
				t.Fatalf("read through swapped dir: %v", err)
			}
			if _, err := j.Create("sub/planted", 0o644); !errors.Is(err, ErrSymlink) {
				t.Fatalf("create through swapped dir: %v", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "planted")); !os.IsNotExist(err) {
				t.Fatal("file was created outside the jail")
			}
		})

		t.Run("final component swapped for symlink", func(t *testing.T) {
			target := filepath.Join(jailDir, "file.txt")
			os.Remove(target)
			if err := os.Symlink(filepath.Join(outside, "secret"), target); err != nil {
				t.Fatal(err)
			}
			if _, err := j.OpenRead("file.txt"); !errors.Is(err, ErrSymlink) {
				t.Fatalf("read through swapped file: %v", err)
			}
		})

		t.Run("jail directory itself replaced", func(t *testing.T) {
			// Move the real jail away and put a symlink to outside in its
			// place: the pinned fd must still point at the real jail.
			moved := filepath.Join(root, "moved")
			if err := os.Rename(jailDir, moved); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, jailDir); err != nil {
				t.Fatal(err)
			}
			if _, err := j.OpenRead("secret"); !errors.Is(err, unix.ENOENT) {
				t.Fatalf("read of outside/secret via replaced jail path: %v", err)
			}
			af, err := j.Create("new.txt", 0o644)
			if err != nil {
				t.Fatal(err)
			}
			af.Write([]byte("x"))
			if err := af.Commit(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(moved, "new.txt")); err != nil {
				t.Fatalf("file not in the pinned jail: %v", err)
			}
			if _, err := os.Stat(filepath.Join(outside, "new.txt")); !os.IsNotExist(err) {
				t.Fatal("file landed outside the jail")
			}
		})
	})
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestCreate(t *testing.T) {
	bothResolvers(t, func(t *testing.T) {
		_, jailDir, outside := setup(t)
		j, err := Open(jailDir)
		if err != nil {
			t.Fatal(err)
		}
		defer j.Close()

		t.Run("commit new file", func(t *testing.T) {
			af, err := j.Create("sub/out.bin", 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer af.Abort()
			if _, err := io.Copy(af, strings.NewReader("payload")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(jailDir, "sub", "out.bin")); !os.IsNotExist(err) {
				t.Fatal("target visible before Commit")
			}
			if err := af.Commit(); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(jailDir, "sub", "out.bin")
			got, err := os.ReadFile(p)
			if err != nil || string(got) != "payload" {
				t.Fatalf("got %q, %v", got, err)
			}
			st, _ := os.Stat(p)
			if st.Mode().Perm()&0o077 != 0 {
				t.Fatalf("mode %v, want no group/other bits", st.Mode())
			}
			if err := af.Commit(); !errors.Is(err, ErrFinished) {
				t.Fatalf("second Commit: %v", err)
			}
			for _, n := range listDir(t, filepath.Join(jailDir, "sub")) {
				if strings.Contains(n, "nether-tmp") {
					t.Fatalf("temp file %q left behind", n)
				}
			}
		})

		t.Run("abort leaves nothing", func(t *testing.T) {
			before := listDir(t, jailDir)
			af, err := j.Create("aborted.txt", 0o644)
			if err != nil {
				t.Fatal(err)
			}
			af.Write([]byte("half a snapshot"))
			if err := af.Abort(); err != nil {
				t.Fatal(err)
			}
			if err := af.Abort(); err != nil {
				t.Fatalf("second Abort: %v", err)
			}
			if after := listDir(t, jailDir); strings.Join(after, ",") != strings.Join(before, ",") {
				t.Fatalf("directory changed: %v -> %v", before, after)
			}
		})

		t.Run("replace existing atomically", func(t *testing.T) {
			p := filepath.Join(jailDir, "file.txt")
			old, err := os.Open(p) // a reader holding the old version
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			af, err := j.Create("file.txt", 0o644)
			if err != nil {
				t.Fatal(err)
			}
			af.Write([]byte("replaced"))
			if got, _ := os.ReadFile(p); string(got) != "inside" {
				t.Fatalf("target changed before Commit: %q", got)
			}
			if err := af.Commit(); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); string(got) != "replaced" {
				t.Fatalf("after Commit: %q", got)
			}
			if got, _ := io.ReadAll(old); string(got) != "inside" {
				t.Fatalf("old reader saw %q: replacement was not a rename", got)
			}
		})

		refusals := []struct {
			name string
			rel  string
			want error
		}{
			{"empty", "", ErrInvalidPath},
			{"absolute", "/tmp/x", ErrEscape},
			{"dotdot", "../escape.txt", ErrEscape},
			{"symlink dir component", "link-dir/planted", ErrSymlink},
			{"symlink final component", "link-file", ErrSymlink},
			{"existing directory", "dir", ErrIsDir},
			{"trailing slash", "newdir/", ErrIsDir},
			{"fifo", "fifo", ErrNotRegular},
			{"missing parent", "nope/x", unix.ENOENT},
		}
		for _, tt := range refusals {
			t.Run("refuse "+tt.name, func(t *testing.T) {
				af, err := j.Create(tt.rel, 0o644)
				if err == nil {
					af.Abort()
					t.Fatalf("Create(%q) succeeded", tt.rel)
				}
				if !errors.Is(err, tt.want) {
					t.Fatalf("Create(%q) = %v, want %v", tt.rel, err, tt.want)
				}
				if !strings.HasPrefix(err.Error(), `transfer jail: creating "`) {
					t.Fatalf("error lacks context: %q", err)
				}
			})
		}
		if _, err := os.Stat(filepath.Join(outside, "planted")); !os.IsNotExist(err) {
			t.Fatal("a refused create still wrote outside the jail")
		}
		if got, _ := os.ReadFile(filepath.Join(outside, "secret")); string(got) != "secret" {
			t.Fatalf("outside file modified: %q", got)
		}
	})
}

func TestClosedJail(t *testing.T) {
	_, jailDir, _ := setup(t)
	j, err := Open(jailDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := j.OpenRead("file.txt"); err == nil {
		t.Fatal("OpenRead on a closed jail succeeded")
	}
}

func TestOpenNotDir(t *testing.T) {
	_, jailDir, _ := setup(t)
	if _, err := Open(filepath.Join(jailDir, "file.txt")); !errors.Is(err, unix.ENOTDIR) {
		t.Fatalf("Open(file) = %v", err)
	}
}

func TestOpenParent(t *testing.T) {
	dir := t.TempDir()
	outside := t.TempDir()
	os.Mkdir(filepath.Join(dir, "sub"), 0o700)
	os.Symlink(outside, filepath.Join(dir, "link"))
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for _, tc := range []struct {
		rel, base string
		ok        bool
	}{
		{"snap", "snap", true},
		{"sub/snap", "snap", true},
		{"../snap", "", false},
		{"/abs/snap", "", false},
		{"link/snap", "", false},
		{"missing/snap", "", false},
	} {
		t.Run(tc.rel, func(t *testing.T) {
			f, base, err := j.OpenParent(tc.rel)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if err == nil {
				f.Close()
				if base != tc.base {
					t.Fatalf("base %q", base)
				}
			}
		})
	}
}

// TestProtectedNames: transfers may not write nether's own files, nor into
// a snapshot artifact, committed or being written.
func TestProtectedNames(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("x = 1\n"), 0o600)
	os.MkdirAll(filepath.Join(dir, "base"), 0o700)
	os.WriteFile(filepath.Join(dir, "base", "COMMITTED"), []byte("nether-snapshot v2\n"), 0o600)
	os.MkdirAll(filepath.Join(dir, ".snap.partial-1234"), 0o700)
	os.MkdirAll(filepath.Join(dir, "sub"), 0o700)
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Protect("nether.conf", "console.log", "ctl.sock")
	cases := []struct {
		rel     string
		refused bool
	}{
		{"nether.conf", true},
		{"console.log", true},
		{"ctl.sock", true},
		{"base/ram", true},
		{"base/new", true},
		{".snap.partial-1234/state", true},
		{"sub/nether.conf", false}, // only the launch directory's own files
		{"output.txt", false},
	}
	for _, tc := range cases {
		t.Run(tc.rel, func(t *testing.T) {
			af, err := j.Create(tc.rel, 0o600)
			if tc.refused {
				if !errors.Is(err, ErrProtected) {
					t.Fatalf("Create(%q) = %v, want ErrProtected", tc.rel, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Create(%q): %v", tc.rel, err)
			}
			af.Abort()
		})
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "nether.conf")); string(b) != "x = 1\n" {
		t.Fatal("nether.conf changed")
	}
}

// TestProtectedReads: nether's own files by name are not carried into the
// guest either; other files and the same names below the top are.
func TestProtectedReads(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"nether.conf", "console.log", "data.txt"} {
		os.WriteFile(filepath.Join(dir, n), []byte(n), 0o600)
	}
	os.MkdirAll(filepath.Join(dir, "sub"), 0o700)
	os.WriteFile(filepath.Join(dir, "sub", "nether.conf"), []byte("mine"), 0o600)
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	j.Protect("nether.conf", "console.log")
	for _, tc := range []struct {
		rel     string
		refused bool
	}{
		{"nether.conf", true},
		{"console.log", true},
		{"data.txt", false},
		{"sub/nether.conf", false},
	} {
		t.Run(tc.rel, func(t *testing.T) {
			f, err := j.OpenRead(tc.rel)
			if tc.refused {
				if !errors.Is(err, ErrProtected) {
					t.Fatalf("OpenRead(%q) = %v, want ErrProtected", tc.rel, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenRead(%q): %v", tc.rel, err)
			}
			f.Close()
		})
	}
}

// TestProtectFD: a file nether writes through a descriptor (its stdout,
// its stderr) is refused to reads and writes under its own name, under a
// hard link to it, and when it is planted at the target after Create;
// a descriptor that is not a regular file protects nothing.
func TestProtectFD(t *testing.T) {
	dir := t.TempDir()
	out, err := os.OpenFile(filepath.Join(dir, "nether.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	out.WriteString("[nether] final usage (reason=shutdown): uptime_ms=5\n")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "nether.out"), filepath.Join(dir, "sub", "alias")); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600)
	j, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.ProtectFD(int(out.Fd())); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := j.ProtectFD(int(w.Fd())); err != nil {
		t.Fatalf("a pipe: %v", err)
	}

	for _, rel := range []string{"nether.out", "sub/alias"} {
		t.Run(rel, func(t *testing.T) {
			if f, err := j.OpenRead(rel); !errors.Is(err, ErrProtected) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("OpenRead(%q) = %v, want ErrProtected", rel, err)
			}
			if af, err := j.Create(rel, 0o600); !errors.Is(err, ErrProtected) {
				if af != nil {
					af.Abort()
				}
				t.Fatalf("Create(%q) = %v, want ErrProtected", rel, err)
			}
		})
	}
	// Planted after Create: the commit refuses to rename over it.
	af, err := j.Create("later", 0o600)
	if err != nil {
		t.Fatal(err)
	}
	af.Write([]byte("forged"))
	if err := os.Link(filepath.Join(dir, "nether.out"), filepath.Join(dir, "later")); err != nil {
		t.Fatal(err)
	}
	if err := af.Commit(); !errors.Is(err, ErrProtected) {
		t.Fatalf("Commit over a planted link = %v, want ErrProtected", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "nether.out")); !strings.Contains(string(b), "uptime_ms=5") {
		t.Fatalf("nether.out is now %q", b)
	}
	if f, err := j.OpenRead("other"); err != nil {
		t.Fatalf("an unprotected file: %v", err)
	} else {
		f.Close()
	}
}
