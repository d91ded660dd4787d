package rootimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
)

// fakeELF is the smallest file debug/elf reads as a program for machine:
// a 64-bit header with no program or section headers (a static program,
// as far as checkShell can tell).
func fakeELF(machine elf.Machine, interp string) []byte {
	var b bytes.Buffer
	h := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Ehsize: 64, Phentsize: 56,
	}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	h.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	h.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	if interp != "" {
		h.Phoff, h.Phnum = 64, 1
	}
	binary.Write(&b, binary.LittleEndian, h)
	if interp != "" {
		s := []byte(interp + "\x00")
		binary.Write(&b, binary.LittleEndian, elf.Prog64{
			Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: 64 + 56,
			Filesz: uint64(len(s)), Memsz: uint64(len(s)), Align: 1,
		})
		b.Write(s)
	}
	return b.Bytes()
}

// ent is one entry of a test archive.
type ent struct {
	name string
	typ  byte // tar.TypeReg when 0
	body string
	link string
	mode int64 // 0644 (0755 for a directory) when 0
	uid  int
}

func file(name, body string) ent       { return ent{name: name, body: body} }
func dir(name string) ent              { return ent{name: name, typ: tar.TypeDir} }
func symlink(name, target string) ent  { return ent{name: name, typ: tar.TypeSymlink, link: target} }
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// shell is a /bin/sh the import accepts: busybox's layout.
func shell() []ent {
	return []ent{
		dir("bin/"),
		{name: "bin/busybox", body: string(fakeELF(elf.EM_X86_64, "")), mode: 0o755},
		symlink("bin/sh", "busybox"),
	}
}

var testTime = time.Unix(1600000000, 0)

func tarOf(t *testing.T, ents ...ent) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: testTime, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func gzipOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	zw := gzip.NewWriter(&out)
	zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func writeFile(t *testing.T, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// treeTools stands in for mkfs: it runs check on the finished tree, then
// writes an "image" naming the tree's files.
type treeTools struct {
	check func(tree string) error
	calls int
}

func (f *treeTools) MakeFS(ctx context.Context, r Recipe, tree, image string) error {
	f.calls++
	if f.check != nil {
		if err := f.check(tree); err != nil {
			return err
		}
	}
	var names []string
	filepath.WalkDir(tree, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(tree, p)
		names = append(names, rel)
		return nil
	})
	return os.WriteFile(image, []byte(string(r.Format)+" image of "+strings.Join(names, " ")), 0o644)
}

// importInto runs Import of src into dir/out with treeTools.
func importInto(t *testing.T, dir string, src Source, tools *treeTools) (*ImportResult, error) {
	t.Helper()
	if tools == nil {
		tools = &treeTools{}
	}
	return Import(context.Background(), ImportOptions{Source: src, Out: filepath.Join(dir, "out"), Tools: tools})
}

// checkNothingWritten fails unless dir holds only what the test put there
// (inputs): no out, no work directory.
func checkNothingWritten(t *testing.T, dir string, inputs ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !slices.Contains(inputs, e.Name()) {
			t.Errorf("%s was left in the output's directory", e.Name())
		}
	}
}

// TestImportRefusesBadTarballs: every hostile or broken root tarball is
// refused with an error naming the cause, before mkfs, and leaves nothing
// beside or in --out; nothing is written outside the tree.
func TestImportRefusesBadTarballs(t *testing.T) {
	outside := t.TempDir() // a link out of the root points here
	for _, tc := range []struct {
		name  string
		ents  []ent
		raw   func(t *testing.T) []byte // instead of ents
		want  string
		is    error
		mkfsd bool // the refusal comes after the tree is made
	}{
		{name: "absolute path", ents: append(shell(), file("/etc/passwd", "root::0:0::/:/bin/sh\n")),
			want: `entry "/etc/passwd" is an absolute path`, is: errUnsafeEntry},
		{name: "dotdot at the start", ents: append(shell(), file("../evil", "x")),
			want: `entry "../evil" has a .. component`, is: errUnsafeEntry},
		{name: "dotdot inside", ents: append(shell(), file("bin/../../evil", "x")),
			want: `entry "bin/../../evil" has a .. component`, is: errUnsafeEntry},
		{name: "dotdot that stays inside", ents: append(shell(), file("bin/../etc/x", "x")),
			want: `has a .. component`, is: errUnsafeEntry},
		{name: "symlink escaping", ents: append(shell(), symlink("bin/evil", "../../etc/shadow")),
			want: `symlink "bin/evil" -> "../../etc/shadow" points outside the root`, is: errUnsafeEntry},
		{name: "hard link escaping", ents: append(shell(), hardlink("bin/evil", "../etc/shadow")),
			want: `hard link "bin/evil" -> "../etc/shadow" points outside the root`, is: errUnsafeEntry},
		{name: "hard link absolute", ents: append(shell(), hardlink("bin/evil", "/etc/shadow")),
			want: `hard link "bin/evil" -> "/etc/shadow" points outside the root`, is: errUnsafeEntry},
		{name: "file through an absolute symlink", ents: append(shell(), symlink("evil", outside), file("evil/pwned", "x")),
			want: `"evil" is a symlink (-> "` + outside + `") the archive placed earlier`, is: errUnsafeEntry},
		{name: "file through a relative symlink", ents: append(shell(), dir("etc/"), symlink("cfg", "etc"), file("cfg/passwd", "x")),
			want: `"cfg" is a symlink (-> "etc") the archive placed earlier`, is: errUnsafeEntry},
		{name: "directory through a symlink", ents: append(shell(), symlink("evil", outside), dir("evil/sub/")),
			want: `"evil" is a symlink`, is: errUnsafeEntry},
		{name: "hard link through a symlink", ents: append(shell(), symlink("evil", "/etc"), hardlink("passwd", "evil/passwd")),
			want: `hard link "passwd" -> "evil/passwd": "evil" is a symlink (-> "/etc")`, is: errUnsafeEntry},
		{name: "hard link to nothing", ents: append(shell(), hardlink("bin/x", "bin/missing")),
			want: `hard link "bin/x" -> "bin/missing": the archive has no such file before it`},
		{name: "no shell", ents: []ent{dir("etc/"), file("etc/os-release", "ID=distroless\n")},
			want: "the image has no /bin/sh: commands need /bin/sh", is: errNoShell, mkfsd: true},
		{name: "dangling sh", ents: []ent{dir("bin/"), symlink("bin/sh", "dash")},
			want: `the image's /bin/sh is a symlink to "dash", which is not in the image: commands need /bin/sh`, is: errNoShell, mkfsd: true},
		{name: "sh through an absolute symlink out of the tree", ents: []ent{dir("bin/"), symlink("bin/sh", "/bin/bash")},
			want: `symlink to "/bin/bash", which is not in the image`, is: errNoShell, mkfsd: true},
		{name: "sh is a directory", ents: []ent{dir("bin/"), dir("bin/sh/")},
			want: "the image's /bin/sh is a directory, not a program", is: errNoShell, mkfsd: true},
		{name: "sh not executable", ents: []ent{dir("bin/"), {name: "bin/sh", body: string(fakeELF(elf.EM_X86_64, "")), mode: 0o644}},
			want: "is not executable", is: errNoShell, mkfsd: true},
		{name: "sh is text", ents: []ent{dir("bin/"), {name: "bin/sh", body: "hello", mode: 0o755}},
			want: "neither an ELF program nor a script", is: errNoShell, mkfsd: true},
		{name: "sh for arm64", ents: []ent{dir("usr/bin/"), symlink("bin", "usr/bin"), {name: "usr/bin/dash", body: string(fakeELF(elf.EM_AARCH64, "")), mode: 0o755}, symlink("usr/bin/sh", "dash")},
			want: "the image is for arm64 (its /bin/sh is a ELFCLASS64 EM_AARCH64 program): the guest runs linux/amd64", is: errWrongArch, mkfsd: true},
		{name: "sh without its interpreter", ents: []ent{dir("bin/"), {name: "bin/sh", body: string(fakeELF(elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2")), mode: 0o755}},
			want: "needs its program interpreter /lib64/ld-linux-x86-64.so.2, which is not in the image", is: errNoShell, mkfsd: true},
		{name: "docker save given as a tarball", ents: []ent{file("manifest.json", "[]"), file("repositories", "{}"), dir("abc/"), file("abc/layer.tar", "")},
			want: "this looks like a docker save archive: import it with --docker-archive", is: errNoShell, mkfsd: true},
		{name: "truncated tar", raw: func(t *testing.T) []byte {
			b := tarOf(t, append(shell(), file("big", strings.Repeat("x", 10000)))...)
			return b[:len(b)-1024-5000]
		}, want: "is truncated: reading entry \"big\": unexpected EOF", is: errTruncated},
		{name: "truncated gzip", raw: func(t *testing.T) []byte {
			b := gzipOf(t, tarOf(t, append(shell(), file("big", strings.Repeat("xy", 20000)))...))
			return b[:len(b)-10]
		}, want: "is truncated", is: errTruncated},
		{name: "gzip without its trailer", raw: func(t *testing.T) []byte {
			b := gzipOf(t, tarOf(t, shell()...))
			return b[:len(b)-4]
		}, want: "is truncated", is: errTruncated},
		{name: "truncated zstd", raw: func(t *testing.T) []byte {
			var out bytes.Buffer
			zw, _ := zstd.NewWriter(&out)
			zw.Write(tarOf(t, append(shell(), file("big", strings.Repeat("xyz", 20000)))...))
			zw.Close()
			return out.Bytes()[:out.Len()/2]
		}, want: "is truncated", is: errTruncated},
		{name: "not a tar", raw: func(t *testing.T) []byte { return bytes.Repeat([]byte("not a tar archive\n"), 100) },
			want: "is not a tar archive, or is corrupt"},
		{name: "empty", raw: func(t *testing.T) []byte { return tarOf(t) }, want: "holds no files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			b := tc.raw
			if b == nil {
				b = func(t *testing.T) []byte { return tarOf(t, tc.ents...) }
			}
			src := writeFile(t, dir, "root.tar", b(t))
			tools := &treeTools{}
			_, err := importInto(t, dir, Source{Kind: SourceTar, Path: src}, tools)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("err = %v, does not wrap %v", err, tc.is)
			}
			if tools.calls != 0 {
				t.Errorf("mkfs ran %d times", tools.calls)
			}
			checkNothingWritten(t, dir, "root.tar")
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside the tree: %v", ents)
			}
		})
	}
}

// TestImportTruncatedXz: an xz archive that ends early is named truncated.
func TestImportTruncatedXz(t *testing.T) {
	if _, err := exec.LookPath("xz"); err != nil {
		t.Skip("xz is not installed")
	}
	dir := t.TempDir()
	plain := writeFile(t, dir, "root.tar", tarOf(t, append(shell(), file("big", strings.Repeat("abc", 30000)))...))
	if out, err := exec.Command("xz", "-k", plain).CombinedOutput(); err != nil {
		t.Fatalf("xz: %v %s", err, out)
	}
	os.Remove(plain)
	b, err := os.ReadFile(plain + ".xz")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("whole", func(t *testing.T) {
		if _, err := importInto(t, dir, Source{Kind: SourceTar, Path: plain + ".xz"}, nil); err != nil {
			t.Fatal(err)
		}
		os.RemoveAll(filepath.Join(dir, "out"))
	})
	t.Run("truncated", func(t *testing.T) {
		cut := writeFile(t, dir, "cut.tar.xz", b[:len(b)/2])
		_, err := importInto(t, dir, Source{Kind: SourceTar, Path: cut}, nil)
		if !errors.Is(err, errTruncated) {
			t.Fatalf("err = %v, want truncated", err)
		}
		checkNothingWritten(t, dir, "root.tar.xz", "cut.tar.xz")
	})
}

// TestImportTarball: a root tarball's files keep their owners, modes
// (set-id bits included), times and hard links; device nodes are left
// out; the tree is finished for the guest; the image and manifest land in
// out, and only there.
func TestImportTarball(t *testing.T) {
	ents := append(shell(),
		dir("etc/"),
		file("etc/os-release", "ID=test\n"),
		symlink("etc/hosts", "/proc/self/hosts"), // replaced by a regular file
		symlink("etc/mtab", "/proc/self/mounts"), // an absolute link stays as it is
		ent{name: "usr/bin/passwd", body: "suid", mode: 0o4755, uid: 0},
		ent{name: "home/u/notes", body: "mine", mode: 0o600, uid: 1234},
		hardlink("usr/bin/passwd2", "usr/bin/passwd"),
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		file("dev/stale", "gone"),
		ent{name: "var/empty/", typ: tar.TypeDir, mode: 0o555}, // read-only, and a file goes in it
		file("var/empty/x", "x"),
		file("./tmp/left", "kept"),
	)
	for _, comp := range []string{"plain", "gzip", "zstd"} {
		t.Run(comp, func(t *testing.T) {
			dir := t.TempDir()
			b := tarOf(t, ents...)
			switch comp {
			case "gzip":
				b = gzipOf(t, b)
			case "zstd":
				var out bytes.Buffer
				zw, _ := zstd.NewWriter(&out)
				zw.Write(b)
				zw.Close()
				b = out.Bytes()
			}
			src := writeFile(t, dir, "root.tar", b)
			tools := &treeTools{check: func(tree string) error {
				checkTree(t, tree)
				return nil
			}}
			res, err := importInto(t, dir, Source{Kind: SourceTar, Path: src}, tools)
			if err != nil {
				t.Fatal(err)
			}
			if res.Stats.Devices != 1 {
				t.Errorf("devices skipped = %d, want 1", res.Stats.Devices)
			}
			checkImported(t, filepath.Join(dir, "out"), res, "root", "tar:"+src)
			checkNothingWritten(t, dir, "root.tar", "out")
		})
	}
}

func checkTree(t *testing.T, tree string) {
	t.Helper()
	for _, tc := range []struct {
		path string
		mode os.FileMode // 0: must not exist
		uid  int
		link string
	}{
		{"bin/busybox", 0o755, 0, ""},
		{"bin/sh", os.ModeSymlink | 0o777, 0, "busybox"},
		{"etc/os-release", 0o644, 0, ""},
		{"etc/hosts", 0o644, 0, ""},
		{"etc/hostname", 0o644, 0, ""},
		{"etc/mtab", os.ModeSymlink | 0o777, 0, "/proc/self/mounts"},
		{"etc/nether", os.ModeDir | 0o755, 0, ""},
		{"usr/bin/passwd", os.ModeSetuid | 0o755, 0, ""},
		{"home/u/notes", 0o600, 1234, ""},
		{"dev", os.ModeDir | 0o755, 0, ""},
		{"dev/null", 0, 0, ""},
		{"dev/stale", 0, 0, ""},
		{"var/empty", os.ModeDir | 0o555, 0, ""},
		{"var/empty/x", 0o644, 0, ""},
		{"tmp", os.ModeDir | os.ModeSticky | 0o777, 0, ""},
		{"tmp/left", 0o644, 0, ""},
		{"root", os.ModeDir | 0o700, 0, ""},
		{"data", os.ModeDir | 0o777, 0, ""},
		{"proc", os.ModeDir | 0o555, 0, ""},
		{"sys", os.ModeDir | 0o555, 0, ""},
		{"run", os.ModeDir | 0o755, 0, ""},
	} {
		fi, err := os.Lstat(filepath.Join(tree, tc.path))
		if tc.mode == 0 {
			if !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: still there (%v)", tc.path, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.path, err)
			continue
		}
		if fi.Mode() != tc.mode {
			t.Errorf("%s: mode %v, want %v", tc.path, fi.Mode(), tc.mode)
		}
		if os.Geteuid() == 0 {
			if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != tc.uid {
				t.Errorf("%s: owner %d, want %d", tc.path, uid, tc.uid)
			}
		}
		if tc.link != "" {
			if got, _ := os.Readlink(filepath.Join(tree, tc.path)); got != tc.link {
				t.Errorf("%s -> %q, want %q", tc.path, got, tc.link)
			}
		}
	}
	a, _ := os.Stat(filepath.Join(tree, "usr/bin/passwd"))
	b, _ := os.Stat(filepath.Join(tree, "usr/bin/passwd2"))
	if a == nil || b == nil || !os.SameFile(a, b) {
		t.Errorf("usr/bin/passwd2 is not a hard link of usr/bin/passwd")
	}
	if fi, err := os.Stat(filepath.Join(tree, "etc/os-release")); err != nil || !fi.ModTime().Equal(testTime) {
		t.Errorf("etc/os-release's mtime is not the archive's (%v)", err)
	}
	if fi, err := os.Stat(filepath.Join(tree, "var/empty")); err != nil || !fi.ModTime().Equal(testTime) {
		t.Errorf("var/empty's mtime is not the archive's (%v)", err)
	}
}

// checkImported fails unless out holds exactly the image and a manifest
// that describes it.
func checkImported(t *testing.T, out string, res *ImportResult, wantName, wantSource string) {
	t.Helper()
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{ImageFile, ManifestFile}) {
		t.Fatalf("out holds %v", names)
	}
	m, err := ReadManifest(filepath.Join(out, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Equal(res.Manifest) {
		t.Fatalf("manifest %+v, result %+v", m, res.Manifest)
	}
	sum, n, err := hashFile(filepath.Join(out, ImageFile))
	if err != nil || sum != m.SHA256 || n != m.Bytes {
		t.Fatalf("image has %d bytes, sha256 %s (%v); manifest says %d, %s", n, sum, err, m.Bytes, m.SHA256)
	}
	if m.Name != wantName || m.Source != wantSource || m.Platform != "linux/amd64" || m.Format != FormatErofs {
		t.Fatalf("manifest %+v, want name %q, source %q, linux/amd64, erofs", m, wantName, wantSource)
	}
	if res.Image != filepath.Join(out, ImageFile) {
		t.Fatalf("result names image %s", res.Image)
	}
}

// TestImportReplacesOutAtomically: into an out that exists, an import
// replaces the image and manifest and leaves the rest; a failed one
// leaves out as it was.
func TestImportReplacesOutAtomically(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, out, ImageFile, []byte("old image"))
	writeFile(t, out, ManifestFile, []byte("{}"))
	writeFile(t, out, "other", []byte("kept"))
	bad := writeFile(t, dir, "bad.tar", tarOf(t, file("etc/x", "no shell")))
	if _, err := importInto(t, dir, Source{Kind: SourceTar, Path: bad}, nil); !errors.Is(err, errNoShell) {
		t.Fatalf("err = %v, want no shell", err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, ImageFile)); string(b) != "old image" {
		t.Fatalf("a failed import changed the image: %q", b)
	}
	checkNothingWritten(t, dir, "out", "bad.tar")
	good := writeFile(t, dir, "good.tar", tarOf(t, shell()...))
	res, err := importInto(t, dir, Source{Kind: SourceTar, Path: good}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(out, ImageFile)); !strings.HasPrefix(string(b), "erofs image of") {
		t.Fatalf("image not replaced: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "other")); string(b) != "kept" {
		t.Fatal("out's other file was touched")
	}
	if res.Manifest.Name != "good" {
		t.Fatalf("name %q", res.Manifest.Name)
	}
	checkNothingWritten(t, dir, "out", "bad.tar", "good.tar")
}

// TestImportMissingParent: an out whose parent does not exist is made,
// and on failure the directories made for it are gone again.
func TestImportMissingParent(t *testing.T) {
	dir := t.TempDir()
	bad := writeFile(t, dir, "bad.tar", tarOf(t, file("x", "no shell")))
	_, err := Import(context.Background(), ImportOptions{Source: Source{Kind: SourceTar, Path: bad}, Out: filepath.Join(dir, "a/b/out"), Tools: &treeTools{}})
	if !errors.Is(err, errNoShell) {
		t.Fatalf("err = %v", err)
	}
	checkNothingWritten(t, dir, "bad.tar")
	good := writeFile(t, dir, "good.tar", tarOf(t, shell()...))
	if _, err := Import(context.Background(), ImportOptions{Source: Source{Kind: SourceTar, Path: good}, Out: filepath.Join(dir, "a/b/out"), Tools: &treeTools{}}); err != nil {
		t.Fatal(err)
	}
}

// flip inverts the byte at offset off from the end of the file.
func flip(t *testing.T, p string, off int) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-off] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func nopLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// layerOf is an OCI layer (gzip) of the entries.
func layerOf(t *testing.T, ents ...ent) v1.Layer {
	t.Helper()
	b := tarOf(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf is an image of the layers for platform os/arch.
func imageOf(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// flattenLayers are three layers whose whiteouts hide files, a directory
// and an opaque directory's lower contents.
func flattenLayers(t *testing.T) []v1.Layer {
	return []v1.Layer{
		layerOf(t, append(shell(),
			dir("etc/"), file("etc/gone.txt", "lower"), file("etc/kept.txt", "kept"),
			dir("opt/old/"), file("opt/old/a", "lower a"), dir("opt/old/sub/"), file("opt/old/sub/x", "lower x"),
			dir("var/cache/"), file("var/cache/big", "lower"),
			file("lib/gone-then-back", "first"),
			dir("srv/data/"), file("srv/data/f", "lower"), file("srv/zz", "z"),
		)...),
		layerOf(t,
			file("etc/.wh.gone.txt", ""),
			// This layer's own file comes before the opaque marker: it
			// stays; what the layers below had in opt/old goes.
			file("opt/old/b", "upper b"),
			dir("opt/old/sub/"), file("opt/old/sub/y", "upper y"),
			file("opt/old/.wh..wh..opq", ""),
			file("var/.wh.cache", ""),
			file("lib/.wh.gone-then-back", ""),
			file(".wh.never-there", ""),
			// A directory replaced by a file, then more in its parent.
			file("srv/data", "now a file"),
			file("srv/after", "after"),
		),
		layerOf(t, file("lib/gone-then-back", "third")),
	}
}

func checkFlattened(t *testing.T, tree string) {
	t.Helper()
	for p, want := range map[string]string{
		"etc/gone.txt":       "",
		"etc/kept.txt":       "kept",
		"opt/old/a":          "",
		"opt/old/sub/x":      "",
		"opt/old/b":          "upper b",
		"opt/old/sub/y":      "upper y",
		"var/cache":          "",
		"lib/gone-then-back": "third",
		"srv/data":           "now a file",
		"srv/after":          "after",
		"srv/zz":             "z",
	} {
		b, err := os.ReadFile(filepath.Join(tree, p))
		if want == "" {
			if _, err := os.Lstat(filepath.Join(tree, p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s survived its whiteout (%v)", p, err)
			}
			continue
		}
		if err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", p, b, err, want)
		}
	}
	filepath.WalkDir(tree, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), whiteoutPrefix) {
			t.Errorf("whiteout %s written into the tree", p)
		}
		return nil
	})
}

// TestImportFlattensLayers: an OCI image's layers are applied in order,
// with .wh. whiteouts and .wh..wh..opq opaque directories hiding only
// what the layers below put there; from an OCI layout, a docker save
// archive and a registry alike.
func TestImportFlattensLayers(t *testing.T) {
	img := imageOf(t, "amd64", flattenLayers(t)...)
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(nopLogger())))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/flat:latest"
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, dir string) Source
	}{
		{"oci layout", func(t *testing.T, dir string) Source {
			p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.AppendImage(img); err != nil {
				t.Fatal(err)
			}
			return Source{Kind: SourceOCILayout, Path: filepath.Join(dir, "layout")}
		}},
		{"docker archive", func(t *testing.T, dir string) Source {
			tag, _ := name.NewTag("test/flat:latest")
			p := filepath.Join(dir, "image.tar")
			if err := tarball.WriteToFile(p, tag, img); err != nil {
				t.Fatal(err)
			}
			return Source{Kind: SourceDockerArchive, Path: p}
		}},
		{"registry", func(t *testing.T, dir string) Source {
			r, err := name.ParseReference(ref)
			if err != nil {
				t.Fatal(err)
			}
			if err := remote.Write(r, img); err != nil {
				t.Fatal(err)
			}
			return Source{Kind: SourceImage, Ref: ref}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			src := tc.write(t, dir)
			tools := &treeTools{check: func(tree string) error {
				checkFlattened(t, tree)
				return nil
			}}
			res, err := importInto(t, dir, src, tools)
			if err != nil {
				t.Fatal(err)
			}
			if res.Layers != 3 || res.Manifest.Digest != digest.String() {
				t.Fatalf("layers %d, digest %s; want 3, %s", res.Layers, res.Manifest.Digest, digest)
			}
			if tools.calls != 1 {
				t.Fatalf("mkfs ran %d times", tools.calls)
			}
			checkImported(t, filepath.Join(dir, "out"), res, defaultName(src), src.String())
		})
	}
}

// TestImportPicksPlatform: from an index the linux/amd64 image is taken
// whatever its position; an image or index without one is refused naming
// what it has.
func TestImportPicksPlatform(t *testing.T) {
	marked := func(arch string) v1.Image {
		return imageOf(t, arch, layerOf(t, append(shell(), file("arch", arch))...))
	}
	index := func(archs ...string) v1.ImageIndex {
		var adds []mutate.IndexAddendum
		for _, a := range archs {
			arch, variant, _ := strings.Cut(a, "/")
			adds = append(adds, mutate.IndexAddendum{Add: marked(arch), Descriptor: v1.Descriptor{
				Platform: &v1.Platform{OS: "linux", Architecture: arch, Variant: variant}}})
		}
		return mutate.AppendManifests(empty.Index, adds...)
	}
	for _, tc := range []struct {
		name  string
		write func(p layout.Path) error
		want  string // the arch file's content, or the error
	}{
		{"index with amd64 last", func(p layout.Path) error { return p.AppendIndex(index("arm64", "arm/v7", "amd64")) }, "amd64"},
		{"images in the layout's own index", func(p layout.Path) error {
			if err := p.AppendImage(marked("arm64"), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"})); err != nil {
				return err
			}
			return p.AppendImage(marked("amd64"), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
		}, "amd64"},
		{"image without a platform in its descriptor", func(p layout.Path) error { return p.AppendImage(marked("amd64")) }, "amd64"},
		{"index without amd64", func(p layout.Path) error { return p.AppendIndex(index("arm64", "arm/v7")) },
			"has no linux/amd64 image, only linux/arm/v7, linux/arm64: the guest runs linux/amd64"},
		{"one image for arm64", func(p layout.Path) error { return p.AppendImage(marked("arm64")) },
			"has no linux/amd64 image, only linux/arm64"},
		{"empty layout", func(p layout.Path) error { return nil }, "holds no image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.write(p); err != nil {
				t.Fatal(err)
			}
			var got string
			tools := &treeTools{check: func(tree string) error {
				b, err := os.ReadFile(filepath.Join(tree, "arch"))
				got = string(b)
				return err
			}}
			_, err = importInto(t, dir, Source{Kind: SourceOCILayout, Path: filepath.Join(dir, "layout")}, tools)
			if !strings.Contains(tc.want, " ") { // a success
				if err != nil || got != tc.want {
					t.Fatalf("imported %q (%v), want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			checkNothingWritten(t, dir, "layout")
		})
	}
	t.Run("docker archive for arm64", func(t *testing.T) {
		dir := t.TempDir()
		tag, _ := name.NewTag("test/arm:latest")
		p := filepath.Join(dir, "image.tar")
		if err := tarball.WriteToFile(p, tag, marked("arm64")); err != nil {
			t.Fatal(err)
		}
		_, err := importInto(t, dir, Source{Kind: SourceDockerArchive, Path: p}, nil)
		if !errors.Is(err, errWrongArch) || !strings.Contains(err.Error(), "is an image for linux/arm64") {
			t.Fatalf("err = %v", err)
		}
		checkNothingWritten(t, dir, "image.tar")
	})
}

// TestImportRefusesBadLayers: a layer cut short or altered, and a hostile
// entry in a layer, are refused naming the layer.
func TestImportRefusesBadLayers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers func(t *testing.T) []v1.Layer
		damage func(t *testing.T, blob string)
		want   string
		is     error
	}{
		{"truncated layer", func(t *testing.T) []v1.Layer {
			return []v1.Layer{layerOf(t, append(shell(), file("big", strings.Repeat("ab", 50000)))...)}
		}, func(t *testing.T, blob string) {
			fi, _ := os.Stat(blob)
			os.Truncate(blob, fi.Size()/2)
		}, "layer 1 of 1 (sha256:", errTruncated},
		{"altered gzip layer", func(t *testing.T) []v1.Layer {
			return []v1.Layer{layerOf(t, append(shell(), file("f", "original"))...)}
		}, func(t *testing.T, blob string) {
			flip(t, blob, 8) // the gzip trailer's CRC-32
		}, "layer 1 of 1 (sha256:", errCorrupt},
		{"altered uncompressed layer", func(t *testing.T) []v1.Layer {
			// A flipped byte in a file's data is still a tar archive:
			// only the diff ID tells.
			return []v1.Layer{static.NewLayer(tarOf(t, append(shell(), file("f", "original"))...), types.OCIUncompressedLayer)}
		}, func(t *testing.T, blob string) {
			b, _ := os.ReadFile(blob)
			b[bytes.Index(b, []byte("original"))] = 'O'
			os.WriteFile(blob, b, 0o644)
		}, "not its diff ID's", errCorrupt},
		{"escaping entry in the second layer", func(t *testing.T) []v1.Layer {
			return []v1.Layer{layerOf(t, shell()...), layerOf(t, symlink("x", "../../../etc"))}
		}, nil, `layer 2 of 2 (sha256:`, errUnsafeEntry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			img := imageOf(t, "amd64", tc.layers(t)...)
			p, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.AppendImage(img); err != nil {
				t.Fatal(err)
			}
			if tc.damage != nil {
				ls, _ := img.Layers()
				d, _ := ls[0].Digest()
				tc.damage(t, filepath.Join(dir, "layout", "blobs", d.Algorithm, d.Hex))
			}
			_, err = importInto(t, dir, Source{Kind: SourceOCILayout, Path: filepath.Join(dir, "layout")}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want one containing %q and wrapping %v", err, tc.want, tc.is)
			}
			checkNothingWritten(t, dir, "layout")
		})
	}
}

// TestImportRefusesBadSources: sources that are not what their kind says
// are refused before anything is made.
func TestImportRefusesBadSources(t *testing.T) {
	dir := t.TempDir()
	tarFile := writeFile(t, dir, "root.tar", tarOf(t, shell()...))
	for _, tc := range []struct {
		name string
		src  Source
		want string
	}{
		{"missing tarball", Source{Kind: SourceTar, Path: filepath.Join(dir, "nope.tar")}, "no such file"},
		{"directory as tarball", Source{Kind: SourceTar, Path: dir}, "is a directory"},
		{"tarball as layout", Source{Kind: SourceOCILayout, Path: tarFile}, "is not an OCI image layout"},
		{"directory without index.json", Source{Kind: SourceOCILayout, Path: dir}, "is not an OCI image layout (it has no index.json)"},
		{"root tarball as docker archive", Source{Kind: SourceDockerArchive, Path: tarFile}, "is not a docker save archive of one image"},
		{"bad reference", Source{Kind: SourceImage, Ref: "UPPER/case::"}, `image reference "UPPER/case::"`},
		{"unreachable registry", Source{Kind: SourceImage, Ref: "127.0.0.1:1/x/y:z"}, "is the registry reachable?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Import(context.Background(), ImportOptions{Source: tc.src, Out: filepath.Join(dir, "out"), Tools: &treeTools{}})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			checkNothingWritten(t, dir, "root.tar")
		})
	}
}

// TestImportMakesErofs: with the real mkfs.erofs, an imported tarball
// becomes an erofs image the session recognises.
func TestImportMakesErofs(t *testing.T) {
	if err := checkMakeFS(FormatErofs); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	src := writeFile(t, dir, "root.tar.gz", gzipOf(t, tarOf(t, append(shell(), file("hello", "hi\n"))...)))
	res, err := Import(context.Background(), ImportOptions{Source: Source{Kind: SourceTar, Path: src}, Out: filepath.Join(dir, "out")})
	if err != nil {
		t.Fatal(err)
	}
	checkImported(t, filepath.Join(dir, "out"), res, "root", "tar:"+src)
	f, err := os.Open(res.Image)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sb := make([]byte, 1028)
	if _, err := io.ReadFull(f, sb); err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint32(sb[1024:]) != 0xE0F5E1E2 {
		t.Fatal("no erofs superblock")
	}
}

// TestImportCancelled: a cancelled import stops and leaves nothing.
func TestImportCancelled(t *testing.T) {
	dir := t.TempDir()
	src := writeFile(t, dir, "root.tar", tarOf(t, shell()...))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Import(ctx, ImportOptions{Source: Source{Kind: SourceTar, Path: src}, Out: filepath.Join(dir, "out"), Tools: &treeTools{}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	checkNothingWritten(t, dir, "root.tar")
}

// TestFinishRootFollowsNoSymlink: a tree whose tmp, mount points or /root
// are symlinks out of it is finished without touching what they point at,
// and an /etc that is a symlink is refused.
func TestFinishRootFollowsNoSymlink(t *testing.T) {
	outside := t.TempDir()
	writeFile(t, outside, "keep", []byte("x"))
	if err := os.Chmod(outside, 0o700); err != nil {
		t.Fatal(err)
	}
	tree := t.TempDir()
	for _, l := range []string{"tmp", "dev", "run", "data", "root"} {
		if err := os.Symlink(outside, filepath.Join(tree, l)); err != nil {
			t.Fatal(err)
		}
	}
	if err := finishRoot(tree); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(outside)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("outside's mode changed: %v %v", fi.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep")); err != nil {
		t.Fatalf("outside was emptied: %v", err)
	}
	for _, d := range []string{"tmp", "dev", "run", "data"} {
		if fi, err := os.Lstat(filepath.Join(tree, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s is not a directory now (%v)", d, err)
		}
	}
	if fi, err := os.Lstat(filepath.Join(tree, "root")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("root symlink replaced (%v)", err)
	}

	tree2 := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(tree2, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := finishRoot(tree2); err == nil || !strings.Contains(err.Error(), "the image's /etc is a symlink, not a directory") {
		t.Fatalf("err = %v", err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Fatalf("written outside: %v", ents)
	}
}
