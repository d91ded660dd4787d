package rootimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Tools runs the programs that make an image. ExecTools runs the real ones;
// tests substitute their own.
type Tools interface {
	// Check fails, saying what to install, when a program the recipe
	// needs is missing. Build calls it only when it has to build.
	Check(r Recipe) error
	// Bootstrap installs the recipe's userland into tree, which does not
	// exist yet.
	Bootstrap(ctx context.Context, r Recipe, tree string) error
	// MakeFS writes the image of tree, in the recipe's format, to image.
	MakeFS(ctx context.Context, r Recipe, tree, image string) error
}

// Options are the inputs of Build.
type Options struct {
	Recipe Recipe
	Cache  string // cache directory; entries are subdirectories named by key
	Out    string // output directory: ImageFile and ManifestFile go there
	Log    *slog.Logger
	Tools  Tools // nil: ExecTools with its output discarded
}

// State says what Build had to do.
type State string

// The states of Result.
const (
	StateBuilt    State = "built"      // built into the cache, then installed into Out
	StateCached   State = "cached"     // found in the cache and installed into Out
	StateUpToDate State = "up to date" // Out already held the cached image
)

// Result reports a Build.
type Result struct {
	Manifest  *Manifest
	Entry     string // the cache entry's directory
	State     State
	Bootstrap time.Duration // mmdebstrap's time, when built
	MakeFS    time.Duration // mkfs's time, when built
}

// tmpPrefix starts the names of entries under construction. A cache
// directory name with it is never an entry: Build removes such leftovers of
// an interrupted build once it holds the cache's lock.
const tmpPrefix = ".tmp-"

// Build makes sure the cache holds a valid image of o.Recipe, building it if
// needed, and that o.Out holds the same image and its manifest.
//
// An entry is valid when its manifest names the recipe's key and its image
// has the manifest's length and digest; anything else is rebuilt. An entry
// is built in a temporary directory and renamed into place complete, so a
// build that is killed or runs out of disk leaves nothing that looks valid.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Tools == nil {
		o.Tools = ExecTools{}
	}
	if _, err := ParseFormat(string(o.Recipe.Format)); err != nil {
		return nil, err
	}
	key := o.Recipe.Key()
	if err := os.MkdirAll(o.Cache, 0o755); err != nil {
		return nil, fmt.Errorf("creating the cache directory: %w", err)
	}
	unlock, err := lockDir(ctx, o.Cache)
	if err != nil {
		return nil, err
	}
	defer unlock()
	removeLeftovers(o.Cache, o.Log)

	res := &Result{Entry: filepath.Join(o.Cache, key), State: StateCached}
	res.Manifest, err = verifyEntry(res.Entry, key)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			o.Log.Warn("cache entry is not valid; rebuilding it", "entry", res.Entry, "err", err)
		}
		if res.Manifest, err = buildEntry(ctx, o, key, res); err != nil {
			return nil, err
		}
		res.State = StateBuilt
	}
	installed, err := install(res.Entry, res.Manifest, o.Out)
	if err != nil {
		return nil, fmt.Errorf("installing the image into %s: %w", o.Out, err)
	}
	if !installed && res.State == StateCached {
		res.State = StateUpToDate
	}
	return res, nil
}

// verifyEntry returns the manifest of the entry if it is valid; an error
// wrapping fs.ErrNotExist if there is no entry.
func verifyEntry(entry, key string) (*Manifest, error) {
	if _, err := os.Stat(entry); err != nil {
		return nil, err
	}
	m, err := ReadManifest(filepath.Join(entry, ManifestFile))
	if err != nil {
		// A directory without its manifest is not "no entry": say so.
		return nil, fmt.Errorf("reading its manifest: %s", err)
	}
	if m.Key != key {
		return nil, fmt.Errorf("its manifest is for key %s", m.Key)
	}
	sum, n, err := hashFile(filepath.Join(entry, ImageFile))
	if err != nil {
		return nil, fmt.Errorf("hashing its image: %s", err)
	}
	if n != m.Bytes || sum != m.SHA256 {
		return nil, fmt.Errorf("its image has %d bytes and sha256 %s; the manifest says %d and %s", n, sum, m.Bytes, m.SHA256)
	}
	return m, nil
}

// buildEntry builds the recipe into a temporary directory of the cache and
// renames it to the entry, replacing an invalid one.
func buildEntry(ctx context.Context, o Options, key string, res *Result) (m *Manifest, err error) {
	if err := o.Tools.Check(o.Recipe); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(o.Cache, tmpPrefix+key[:12]+"-")
	if err != nil {
		return nil, fmt.Errorf("creating a build directory: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				o.Log.Warn("leaving the failed build's directory", "dir", tmp, "err", rerr)
			}
		}
	}()
	tree := filepath.Join(tmp, "tree")
	o.Log.Info("bootstrapping the root userland", "suite", o.Recipe.Suite, "mirror", o.Recipe.Mirror, "packages", strings.Join(o.Recipe.Packages, ","))
	t := time.Now()
	if err := o.Tools.Bootstrap(ctx, o.Recipe, tree); err != nil {
		return nil, err
	}
	res.Bootstrap = time.Since(t)
	if err := finishTree(tree); err != nil {
		return nil, fmt.Errorf("finishing the root tree: %w", err)
	}
	img := filepath.Join(tmp, ImageFile)
	o.Log.Info("making the file system", "format", o.Recipe.Format, "bootstrap", res.Bootstrap.Round(time.Millisecond))
	t = time.Now()
	if err := o.Tools.MakeFS(ctx, o.Recipe, tree, img); err != nil {
		return nil, err
	}
	res.MakeFS = time.Since(t)
	if err := removeTree(tree); err != nil {
		return nil, fmt.Errorf("removing the root tree: %w", err)
	}
	// Read-only, as a reminder: out's copy may be a hard link to it.
	if err := os.Chmod(img, 0o444); err != nil {
		return nil, err
	}
	if err := syncFile(img); err != nil {
		return nil, err
	}
	sum, n, err := hashFile(img)
	if err != nil {
		return nil, err
	}
	m = &Manifest{Format: o.Recipe.Format, SHA256: sum, Bytes: n, Suite: o.Recipe.Suite, Packages: o.Recipe.Packages, Key: key}
	if err := WriteManifest(filepath.Join(tmp, ManifestFile), m); err != nil {
		return nil, fmt.Errorf("writing the manifest: %w", err)
	}
	// A cancellation that arrived during the last steps still wins: the
	// caller is going away and expects nothing new in the cache.
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := removeTree(res.Entry); err != nil {
		return nil, fmt.Errorf("removing the invalid cache entry: %w", err)
	}
	if err := os.Rename(tmp, res.Entry); err != nil {
		return nil, fmt.Errorf("committing the cache entry: %w", err)
	}
	if err := syncFile(o.Cache); err != nil {
		return nil, err
	}
	return m, nil
}

// install puts the entry's image and manifest into out unless out already
// has them, and reports whether it did anything.
func install(entry string, m *Manifest, out string) (bool, error) {
	src := filepath.Join(entry, ImageFile)
	dst := filepath.Join(out, ImageFile)
	dstManifest := filepath.Join(out, ManifestFile)
	if have, err := ReadManifest(dstManifest); err == nil && have.Equal(m) && sameImage(src, dst, m) {
		return false, nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return false, err
	}
	tmp := filepath.Join(out, fmt.Sprintf(".%s.tmp-%d", ImageFile, os.Getpid()))
	os.Remove(tmp)
	// A hard link costs nothing and no space; the cache is elsewhere on
	// some machines, so copy when linking is refused.
	if err := os.Link(src, tmp); err != nil {
		if err := copyFile(src, tmp); err != nil {
			os.Remove(tmp)
			return false, err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return false, err
	}
	if err := WriteManifest(dstManifest, m); err != nil {
		return false, err
	}
	return true, nil
}

// sameImage reports whether dst is the image m describes. src was just
// verified, so a dst that is src (a hard link) needs no second hash.
func sameImage(src, dst string, m *Manifest) bool {
	si, err1 := os.Stat(src)
	di, err2 := os.Stat(dst)
	if err1 != nil || err2 != nil {
		return false
	}
	if os.SameFile(si, di) {
		return true
	}
	sum, n, err := hashFile(dst)
	return err == nil && n == m.Bytes && sum == m.SHA256
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// removeLeftovers removes what interrupted builds left in the cache. The
// caller holds the cache's lock, so no build is using them.
func removeLeftovers(cache string, log *slog.Logger) {
	ents, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		p := filepath.Join(cache, e.Name())
		if err := removeTree(p); err != nil {
			log.Warn("cannot remove an interrupted build's directory", "dir", p, "err", err)
			continue
		}
		log.Info("removed an interrupted build's directory", "dir", p)
	}
}

// removeTree removes dir, first detaching anything mounted below it: a
// killed mmdebstrap can leave /proc, /sys or device nodes mounted in its
// tree, and RemoveAll must not walk into the host's.
func removeTree(dir string) error {
	if err := unmountBelow(dir); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
