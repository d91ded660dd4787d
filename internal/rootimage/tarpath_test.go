package rootimage

import (
	"errors"
	"path"
	"path/filepath"
	"strings"
	"testing"
)

func TestEntryPath(t *testing.T) {
	for _, tc := range []struct {
		name, want, err string
	}{
		{"etc/passwd", "etc/passwd", ""},
		{"./etc/passwd", "etc/passwd", ""},
		{"usr//bin/", "usr/bin", ""},
		{"./", ".", ""},
		{".", ".", ""},
		{"a/./b", "a/b", ""},
		{"..foo/bar..", "..foo/bar..", ""},
		{"", "", "empty name"},
		{"/etc/passwd", "", "is an absolute path"},
		{"//etc", "", "is an absolute path"},
		{"..", "", "has a .. component"},
		{"../x", "", "has a .. component"},
		{"a/../b", "", "has a .. component"},
		{"a/b/..", "", "has a .. component"},
		{"a/\x00b", "", "NUL byte"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := entryPath(tc.name)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errUnsafeEntry) {
					t.Fatalf("entryPath(%q) = %q, %v; want an error containing %q", tc.name, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("entryPath(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
			}
		})
	}
}

func TestCheckSymlink(t *testing.T) {
	for _, tc := range []struct {
		entry, target string
		ok            bool
	}{
		{"bin/sh", "busybox", true},
		{"bin/sh", "/bin/busybox", true},
		{"usr/lib/x/y", "../../../etc/z", true},
		{"usr/lib/x/y", "../../../../etc/z", false},
		{"lib", "usr/lib", true},
		{"a", "..", false},
		{"a/b", "..", true},
		{"a/b", "../..", false},
		{"a/b", "./.././../x", false},
		{"a/b", "c/../../x", true},
		{"a/b", "", false},
		{"a/b", "x\x00y", false},
	} {
		t.Run(tc.entry+" -> "+tc.target, func(t *testing.T) {
			err := checkSymlink(tc.entry, tc.target)
			if (err == nil) != tc.ok {
				t.Fatalf("checkSymlink(%q, %q) = %v, want ok=%v", tc.entry, tc.target, err, tc.ok)
			}
		})
	}
}

func TestWhiteout(t *testing.T) {
	for _, tc := range []struct {
		p, dir, hidden string
		opaque, ok     bool
	}{
		{"etc/.wh.passwd", "etc", "passwd", false, true},
		{".wh.top", ".", "top", false, true},
		{"opt/x/.wh..wh..opq", "opt/x", "", true, true},
		{"etc/passwd", "", "", false, false},
		{"etc/.whx", "", "", false, false},
	} {
		t.Run(tc.p, func(t *testing.T) {
			dir, hidden, opaque, ok, _ := whiteout(tc.p)
			if dir != tc.dir || hidden != tc.hidden || opaque != tc.opaque || ok != tc.ok {
				t.Fatalf("whiteout(%q) = %q, %q, %v, %v", tc.p, dir, hidden, opaque, ok)
			}
		})
	}
}

// FuzzEntryPath: whatever an archive names, an accepted name is a clean
// relative path that joins under the root, and an accepted symlink's
// relative target resolves, lexically, under the root too.
func FuzzEntryPath(f *testing.F) {
	for _, s := range []string{"etc/passwd", "./a//b/", "/abs", "../x", "a/../../b", ".", "..", ".wh..wh..opq", "a/\x00"} {
		f.Add(s, "../b")
	}
	f.Fuzz(func(t *testing.T, name, target string) {
		p, err := entryPath(name)
		if err != nil {
			if !errors.Is(err, errUnsafeEntry) {
				t.Fatalf("entryPath(%q): %v does not wrap errUnsafeEntry", name, err)
			}
			return
		}
		if p != "." && (path.Clean(p) != p || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../")) {
			t.Fatalf("entryPath(%q) = %q, not a clean relative path", name, p)
		}
		for _, c := range strings.Split(p, "/") {
			if c == ".." || c == "" {
				t.Fatalf("entryPath(%q) = %q has component %q", name, p, c)
			}
		}
		if j := filepath.Join("/root", p); j != "/root" && !strings.HasPrefix(j, "/root/") {
			t.Fatalf("entryPath(%q) = %q joins to %q, outside /root", name, p, j)
		}
		if strings.IndexByte(p, 0) >= 0 {
			t.Fatalf("entryPath(%q) = %q keeps a NUL", name, p)
		}
		if checkSymlink(p, target) == nil && !strings.HasPrefix(target, "/") {
			r := path.Join("/root", path.Dir(p), target)
			if r != "/root" && !strings.HasPrefix(r, "/root/") {
				t.Fatalf("symlink %q -> %q accepted, resolves to %q", p, target, r)
			}
		}
		if _, err := hardlinkTarget(p, target); err == nil {
			if j := path.Join("/root", target); !strings.HasPrefix(j, "/root/") {
				t.Fatalf("hard link %q -> %q accepted", p, target)
			}
		}
	})
}
