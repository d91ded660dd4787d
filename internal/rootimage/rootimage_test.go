package rootimage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

func mustRecipe(t *testing.T, suite, mirror string, f Format, extra ...string) Recipe {
	t.Helper()
	r, err := NewRecipe(suite, mirror, f, extra)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRecipeKey(t *testing.T) {
	base := mustRecipe(t, "", "", FormatErofs)
	baseKey := base.Key()
	if len(baseKey) != 64 {
		t.Fatalf("key %q is not a hex SHA-256", baseKey)
	}
	differ := []struct {
		name string
		r    Recipe
	}{
		{"suite", mustRecipe(t, "trixie", "", FormatErofs)},
		{"mirror", mustRecipe(t, "", "http://ftp.de.debian.org/debian", FormatErofs)},
		{"format squashfs", mustRecipe(t, "", "", FormatSquashfs)},
		{"format ext4", mustRecipe(t, "", "", FormatExt4)},
		{"extra package", mustRecipe(t, "", "", FormatErofs, "jq")},
		{"another extra package", mustRecipe(t, "", "", FormatErofs, "git")},
	}
	seen := map[string]string{baseKey: "base"}
	for _, tc := range differ {
		t.Run("differs/"+tc.name, func(t *testing.T) {
			k := tc.r.Key()
			if prev, ok := seen[k]; ok {
				t.Fatalf("key of %s equals that of %s", tc.name, prev)
			}
			seen[k] = tc.name
		})
	}
	t.Run("differs/mkfs options", func(t *testing.T) {
		saved := mkfsOptions[FormatErofs]
		t.Cleanup(func() { mkfsOptions[FormatErofs] = saved })
		mkfsOptions[FormatErofs] = append(slices.Clone(saved), "-zlz4hc")
		if base.Key() == baseKey {
			t.Fatal("changing mkfs.erofs's options kept the key")
		}
	})

	same := []struct {
		name string
		r    Recipe
	}{
		{"explicit defaults", mustRecipe(t, DefaultSuite, DefaultMirror, FormatErofs)},
		{"default packages repeated", mustRecipe(t, "", "", FormatErofs, "python3", " bash", "", "curl")},
	}
	for _, tc := range same {
		t.Run("same/"+tc.name, func(t *testing.T) {
			if k := tc.r.Key(); k != baseKey {
				t.Fatalf("key %s, want the base's %s", k, baseKey)
			}
		})
	}
	t.Run("same/extras in any order", func(t *testing.T) {
		a := mustRecipe(t, "", "", FormatErofs, "jq", "git", "jq")
		b := mustRecipe(t, "", "", FormatErofs, "git", "jq")
		if a.Key() != b.Key() {
			t.Fatal("the order or repetition of extra packages changed the key")
		}
	})
}

func TestNewRecipeRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, suite, mirror string
		format              Format
		extra               []string
		want                string
	}{
		{"unknown format", "", "", "zfs", nil, `unknown root image format "zfs"`},
		{"empty format", "", "", "", nil, "unknown root image format"},
		{"option as package", "", "", FormatErofs, []string{"--allow-downgrades"}, "not a Debian package name"},
		{"two packages in one", "", "", FormatErofs, []string{"a b"}, "not a Debian package name"},
		{"capitals", "", "", FormatErofs, []string{"Python3"}, "not a Debian package name"},
		{"bad suite", "../x", "", FormatErofs, nil, "not a Debian suite name"},
		{"bad mirror", "", "ftp://deb.debian.org/debian", FormatErofs, nil, "not an http(s) URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewRecipe(tc.suite, tc.mirror, tc.format, tc.extra)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseFormat(t *testing.T) {
	for _, f := range Formats {
		if got, err := ParseFormat(string(f)); err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
	}
	if _, err := ParseFormat("btrfs"); err == nil || !strings.Contains(err.Error(), "erofs, squashfs, ext4") {
		t.Errorf("ParseFormat(btrfs): err = %v, want the list of formats", err)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	m := &Manifest{Format: FormatSquashfs, SHA256: strings.Repeat("ab", 32), Bytes: 123456789,
		Suite: "bookworm", Packages: []string{"bash", "python3"}, Key: strings.Repeat("cd", 32)}
	p := filepath.Join(t.TempDir(), ManifestFile)
	if err := WriteManifest(p, m); err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(p)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(m) {
		t.Fatalf("read %+v, wrote %+v", got, m)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"format": "squashfs"`, `"sha256": "abab`, `"bytes": 123456789`, `"suite": "bookworm"`, `"packages": [`, `"key": "cdcd`} {
		if !bytes.Contains(b, []byte(field)) {
			t.Errorf("manifest lacks %s:\n%s", field, b)
		}
	}
	if err := os.WriteFile(p, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadManifest(p); err == nil {
		t.Error("a truncated manifest was read without error")
	}
}

// fakeTools stands in for mmdebstrap and mkfs. Each build's image differs
// (it carries the build's number), so a test sees whether one happened.
type fakeTools struct {
	builds       int
	checkErr     error
	bootstrapErr error
	makeFSErr    error
	// during runs inside Bootstrap, after the tree exists (to cancel).
	during func()
}

func (f *fakeTools) Check(Recipe) error { return f.checkErr }

func (f *fakeTools) Bootstrap(ctx context.Context, r Recipe, tree string) error {
	f.builds++
	files := map[string]string{
		"etc/passwd":                    "root:x:0:0:root:/root:/bin/bash\nnether:x:1000:1000::/home/nether:/bin/bash\n",
		"etc/hostname":                  "buildhost\n",
		"var/cache/apt/pkgcache.bin":    "cache",
		"var/lib/apt/lists/deb_Release": "list",
		"usr/share/doc/bash/copyright":  "GPL",
		"usr/share/doc/bash/README":     "docs",
		"usr/share/man/man1/bash.1.gz":  "man",
		"dev/null":                      "not a device",
		"run/lock/x":                    "",
		"usr/bin/python3":               fmt.Sprintf("build %d", f.builds),
	}
	for name, data := range files {
		p := filepath.Join(tree, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return err
		}
	}
	for _, d := range []string{"tmp", "home/nether", "usr/share/doc/libc6"} {
		if err := os.MkdirAll(filepath.Join(tree, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Symlink("/proc/sys/kernel/hostname", filepath.Join(tree, "etc/hosts")); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(filepath.Join(tree, "home/nether"), UserID, GroupID); err != nil {
			return err
		}
	}
	if f.during != nil {
		f.during()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return f.bootstrapErr
}

func (f *fakeTools) MakeFS(ctx context.Context, r Recipe, tree, image string) error {
	if f.makeFSErr != nil {
		// Like a full disk: part of an image, then the failure.
		os.WriteFile(image, []byte("partial"), 0o644)
		return f.makeFSErr
	}
	py, err := os.ReadFile(filepath.Join(tree, "usr/bin/python3"))
	if err != nil {
		return err
	}
	return os.WriteFile(image, []byte(fmt.Sprintf("%s image of %s", r.Format, py)), 0o644)
}

// asUser lets finishTree's ownership check pass when the test cannot chown.
func asUser(t *testing.T) {
	if os.Geteuid() == 0 {
		return
	}
	saved := homeOwner
	homeOwner = [2]int{os.Getuid(), os.Getgid()}
	t.Cleanup(func() { homeOwner = saved })
}

type env struct {
	cache, out string
	tools      *fakeTools
	recipe     Recipe
}

func newEnv(t *testing.T) *env {
	asUser(t)
	dir := t.TempDir()
	return &env{cache: filepath.Join(dir, "cache"), out: filepath.Join(dir, "out"), tools: &fakeTools{},
		recipe: mustRecipe(t, "", "", FormatErofs)}
}

func (e *env) build(t *testing.T, ctx context.Context, out string) (*Result, error) {
	t.Helper()
	return Build(ctx, Options{Recipe: e.recipe, Cache: e.cache, Out: out, Tools: e.tools})
}

// checkOut fails unless out holds an image and manifest that agree.
func checkOut(t *testing.T, out string, want *Manifest) {
	t.Helper()
	m, err := ReadManifest(filepath.Join(out, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Equal(want) {
		t.Fatalf("out's manifest %+v, want %+v", m, want)
	}
	sum, n, err := hashFile(filepath.Join(out, ImageFile))
	if err != nil {
		t.Fatal(err)
	}
	if sum != m.SHA256 || n != m.Bytes {
		t.Fatalf("out's image has %d bytes, sha256 %s; its manifest says %d, %s", n, sum, m.Bytes, m.SHA256)
	}
}

// cacheNames lists the cache directory, without its lock.
func cacheNames(t *testing.T, cache string) []string {
	t.Helper()
	ents, err := os.ReadDir(cache)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if e.Name() != ".lock" {
			names = append(names, e.Name())
		}
	}
	return names
}

func TestBuildReusesValidEntry(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first, err := e.build(t, ctx, e.out)
	if err != nil {
		t.Fatal(err)
	}
	if first.State != StateBuilt || e.tools.builds != 1 {
		t.Fatalf("first build: state %q after %d builds, want built after 1", first.State, e.tools.builds)
	}
	if first.Manifest.Key != e.recipe.Key() || first.Entry != filepath.Join(e.cache, e.recipe.Key()) {
		t.Fatalf("entry %s with key %s, want the recipe's key %s", first.Entry, first.Manifest.Key, e.recipe.Key())
	}
	if !slices.Equal(first.Manifest.Packages, e.recipe.Packages) || first.Manifest.Suite != "bookworm" || first.Manifest.Format != FormatErofs {
		t.Fatalf("manifest %+v does not describe the recipe", first.Manifest)
	}
	checkOut(t, e.out, first.Manifest)
	checkOut(t, first.Entry, first.Manifest)

	for _, tc := range []struct {
		name  string
		out   string
		state State
	}{
		{"same out", e.out, StateUpToDate},
		{"new out", filepath.Join(t.TempDir(), "other"), StateCached},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := e.build(t, ctx, tc.out)
			if err != nil {
				t.Fatal(err)
			}
			if res.State != tc.state || e.tools.builds != 1 {
				t.Fatalf("state %q after %d builds, want %q without a build", res.State, e.tools.builds, tc.state)
			}
			checkOut(t, tc.out, first.Manifest)
		})
	}

	t.Run("out's image replaced", func(t *testing.T) {
		img := filepath.Join(e.out, ImageFile)
		if err := os.Remove(img); err != nil { // it may be a hard link to the entry's
			t.Fatal(err)
		}
		if err := os.WriteFile(img, []byte("stale"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, err := e.build(t, ctx, e.out)
		if err != nil {
			t.Fatal(err)
		}
		if res.State != StateCached || e.tools.builds != 1 {
			t.Fatalf("state %q after %d builds, want cached without a build", res.State, e.tools.builds)
		}
		checkOut(t, e.out, first.Manifest)
	})
}

func TestBuildRebuildsInvalidEntry(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, entry string)
	}{
		{"image byte changed", func(t *testing.T, entry string) {
			img := filepath.Join(entry, ImageFile)
			b, err := os.ReadFile(img)
			if err != nil {
				t.Fatal(err)
			}
			b[0] ^= 1
			os.Chmod(img, 0o644)
			if err := os.WriteFile(img, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
		{"image truncated", func(t *testing.T, entry string) {
			os.Chmod(filepath.Join(entry, ImageFile), 0o644)
			if err := os.Truncate(filepath.Join(entry, ImageFile), 3); err != nil {
				t.Fatal(err)
			}
		}},
		{"image missing", func(t *testing.T, entry string) {
			if err := os.Remove(filepath.Join(entry, ImageFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"manifest missing", func(t *testing.T, entry string) {
			if err := os.Remove(filepath.Join(entry, ManifestFile)); err != nil {
				t.Fatal(err)
			}
		}},
		{"manifest of another key", func(t *testing.T, entry string) {
			p := filepath.Join(entry, ManifestFile)
			m, err := ReadManifest(p)
			if err != nil {
				t.Fatal(err)
			}
			m.Key = strings.Repeat("0", 64)
			if err := WriteManifest(p, m); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			first, err := e.build(t, ctx, e.out)
			if err != nil {
				t.Fatal(err)
			}
			tc.corrupt(t, first.Entry)
			res, err := e.build(t, ctx, e.out)
			if err != nil {
				t.Fatal(err)
			}
			if res.State != StateBuilt || e.tools.builds != 2 {
				t.Fatalf("state %q after %d builds, want a second build", res.State, e.tools.builds)
			}
			if res.Manifest.SHA256 == first.Manifest.SHA256 {
				t.Fatal("the rebuilt image has the first one's digest: the fake's builds should differ")
			}
			checkOut(t, e.out, res.Manifest)
			checkOut(t, res.Entry, res.Manifest)
		})
	}
}

func TestBuildFailureLeavesNoEntry(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, tc := range []struct {
		name  string
		tools *fakeTools
		ctx   context.Context
		want  string
	}{
		{"mkfs fails (full disk)", &fakeTools{makeFSErr: syscall.ENOSPC}, context.Background(), "no space left"},
		{"download fails", &fakeTools{bootstrapErr: errors.New("mmdebstrap of bookworm failed")}, context.Background(), "mmdebstrap of bookworm failed"},
		{"tool missing", &fakeTools{checkErr: errors.New("mmdebstrap not found")}, context.Background(), "mmdebstrap not found"},
		{"interrupted", &fakeTools{during: cancel}, ctx, "context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.tools = tc.tools
			_, err := e.build(t, tc.ctx, e.out)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if names := cacheNames(t, e.cache); len(names) != 0 {
				t.Fatalf("the failed build left %q in the cache", names)
			}
			if _, err := os.Stat(filepath.Join(e.out, ImageFile)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the failed build wrote an image into out: %v", err)
			}
			e.tools = &fakeTools{}
			res, err := e.build(t, context.Background(), e.out)
			if err != nil {
				t.Fatal(err)
			}
			if res.State != StateBuilt {
				t.Fatalf("the build after the failure: state %q", res.State)
			}
		})
	}
}

func TestBuildRemovesLeftovers(t *testing.T) {
	e := newEnv(t)
	left := filepath.Join(e.cache, tmpPrefix+"0123456789ab-42")
	if err := os.MkdirAll(filepath.Join(left, "tree", "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := e.build(t, context.Background(), e.out); err != nil {
		t.Fatal(err)
	}
	if names := cacheNames(t, e.cache); !slices.Equal(names, []string{e.recipe.Key()}) {
		t.Fatalf("cache holds %q, want only the entry", names)
	}
}

func TestBuildRefusesBadFormat(t *testing.T) {
	e := newEnv(t)
	e.recipe.Format = "zfs"
	_, err := e.build(t, context.Background(), e.out)
	if err == nil || !strings.Contains(err.Error(), "unknown root image format") {
		t.Fatalf("err = %v", err)
	}
	if e.tools.builds != 0 {
		t.Fatal("a build ran for an unknown format")
	}
}

func TestFinishTree(t *testing.T) {
	asUser(t)
	tree := filepath.Join(t.TempDir(), "tree")
	if err := (&fakeTools{}).Bootstrap(context.Background(), Recipe{}, tree); err != nil {
		t.Fatal(err)
	}
	if err := finishTree(tree); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		mode os.FileMode // 0: must not exist
		data string
	}{
		{"tmp", os.ModeDir | os.ModeSticky | 0o777, ""},
		{"data", os.ModeDir | 0o777, ""},
		{"dev", os.ModeDir | 0o755, ""},
		{"dev/null", 0, ""},
		{"proc", os.ModeDir | 0o555, ""},
		{"sys", os.ModeDir | 0o555, ""},
		{"run", os.ModeDir | 0o755, ""},
		{"run/lock", 0, ""},
		{"etc/nether", os.ModeDir | 0o755, ""},
		{"etc/hostname", 0o644, "sandbox\n"},
		{"etc/hosts", 0o644, hostsFile},
		{"var/cache/apt/pkgcache.bin", 0, ""},
		{"var/lib/apt/lists/deb_Release", 0, ""},
		{"var/lib/apt/lists", os.ModeDir | 0o755, ""},
		{"usr/share/man/man1", 0, ""},
		{"usr/share/doc/bash/README", 0, ""},
		{"usr/share/doc/bash/copyright", 0o644, "GPL"},
		{"usr/bin/python3", 0o644, "build 1"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			p := filepath.Join(tree, tc.path)
			fi, err := os.Lstat(p)
			if tc.mode == 0 {
				if !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("still there (%v)", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode() != tc.mode {
				t.Fatalf("mode %v, want %v", fi.Mode(), tc.mode)
			}
			if fi.Mode().IsRegular() {
				b, err := os.ReadFile(p)
				if err != nil {
					t.Fatal(err)
				}
				if string(b) != tc.data {
					t.Fatalf("holds %q, want %q", b, tc.data)
				}
			}
		})
	}
}

func TestFinishTreeRefusesMissingUser(t *testing.T) {
	asUser(t)
	for _, tc := range []struct {
		name   string
		passwd string
		want   string
	}{
		{"no user", "root:x:0:0:root:/root:/bin/bash\n", "etc/passwd has no nether"},
		{"wrong uid", "nether:x:1001:1000::/home/nether:/bin/bash\n", "etc/passwd has no nether"},
		{"wrong shell", "nether:x:1000:1000::/home/nether:/bin/sh\n", "etc/passwd has no nether"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tree := filepath.Join(t.TempDir(), "tree")
			if err := (&fakeTools{}).Bootstrap(context.Background(), Recipe{}, tree); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(tree, "etc/passwd"), []byte(tc.passwd), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := finishTree(tree); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 16}
	for i := range 10 {
		fmt.Fprintf(tb, "line %d\n", i)
	}
	if got := tb.String(); got != "line 8\nline 9" {
		t.Fatalf("tail %q, want the whole last lines that fit", got)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a\040b`: "/tmp/a b",
		`/plain`:      "/plain",
		`/end\04`:     `/end\04`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}
