package rootimage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// extractor writes archive entries into a tree without ever following a
// link: every directory on the way to an entry is opened with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS from the tree's root, and the entry
// itself is created with the *at calls relative to its directory (O_EXCL,
// O_NOFOLLOW), so a symlink the archive placed earlier can neither be
// written through nor have a file created under it: either is refused,
// naming the link.
type extractor struct {
	ctx     context.Context
	dir     string // the tree, for messages and RemoveAll
	root    int    // O_PATH fd of the tree
	chown   bool   // keep the archive's owners (root only)
	maxSize int64  // the bytes the files may take, summed: ImportOptions.MaxSize

	// layer holds the paths the current layer wrote: an OCI whiteout
	// hides only what the layers below put there.
	layer map[string]bool
	// dirs holds the metadata of every directory entry, applied when
	// everything is written (a read-only directory would refuse its
	// files, and every file written into one changes its mtime).
	dirs map[string]*tar.Header

	// cached is the directory fd of the last entry's parent: archives
	// list a directory's files together.
	cachedDir string
	cachedFd  int

	Stats ExtractStats
}

// ExtractStats counts what an extraction wrote and left out.
type ExtractStats struct {
	Entries   int // written: files, directories, links, FIFOs
	Bytes     int64
	Devices   int // device nodes skipped: the guest's /dev is a devtmpfs
	Other     int // entries of other types skipped
	Whiteouts int // OCI whiteouts applied
}

func newExtractor(ctx context.Context, dir string, maxSize int64) (*extractor, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the tree %s: %w", dir, err)
	}
	return &extractor{
		ctx: ctx, dir: dir, root: fd, chown: os.Geteuid() == 0, maxSize: maxSize,
		layer: map[string]bool{}, dirs: map[string]*tar.Header{}, cachedFd: -1,
	}, nil
}

func (x *extractor) Close() error {
	x.forget()
	return unix.Close(x.root)
}

// forget drops the cached directory fd: after a removal it may name a
// directory that is no longer in the tree.
func (x *extractor) forget() {
	if x.cachedFd >= 0 {
		unix.Close(x.cachedFd)
	}
	x.cachedDir, x.cachedFd = "", -1
}

// startLayer begins the next OCI layer.
func (x *extractor) startLayer() { clear(x.layer) }

// errLinkInPath is wrapped when an entry's directory is, or passes
// through, a symlink or a non-directory.
var errLinkInPath = errors.New("not a directory")

// openDir returns an O_PATH fd of the directory rel (clean, relative)
// beneath the root, creating missing directories (0755, root's) when
// create is set. The fd belongs to the extractor's cache when cached is
// returned true; otherwise the caller closes it.
func (x *extractor) openDir(rel string, create bool) (int, error) {
	if rel == "." {
		return x.root, nil
	}
	if rel == x.cachedDir && x.cachedFd >= 0 {
		return x.cachedFd, nil
	}
	fd, err := unix.Openat2(x.root, rel, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		// Walk it a component at a time, to create what is missing or
		// to name what is in the way.
		if fd, err = x.walkDir(rel, create); err != nil {
			return -1, err
		}
	}
	x.forget()
	x.cachedDir, x.cachedFd = rel, fd
	return fd, nil
}

func (x *extractor) walkDir(rel string, create bool) (int, error) {
	fd := x.root
	closeFd := func() {
		if fd != x.root {
			unix.Close(fd)
		}
	}
	parts := strings.Split(rel, "/")
	for i, c := range parts {
		at := strings.Join(parts[:i+1], "/")
		next, err := unix.Openat2(fd, c, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		if errors.Is(err, unix.ENOENT) && create {
			if err = unix.Mkdirat(fd, c, 0o755); err == nil || errors.Is(err, unix.EEXIST) {
				next, err = unix.Openat2(fd, c, &unix.OpenHow{
					Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
					Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
				})
			}
		}
		if err != nil {
			var st unix.Stat_t
			serr := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
			closeFd()
			switch {
			case serr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK:
				target := readlinkAt(x.root, at)
				return -1, unsafef("%q is a symlink (-> %q) the archive placed earlier; nothing is extracted through a link", at, target)
			case serr == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR:
				return -1, fmt.Errorf("%q is not a directory: %w", at, errLinkInPath)
			case errors.Is(err, unix.ENOENT):
				return -1, fmt.Errorf("%q does not exist: %w", at, err)
			}
			return -1, fmt.Errorf("opening %q in the tree: %w", at, err)
		}
		closeFd()
		fd = next
	}
	return fd, nil
}

func readlinkAt(dirfd int, rel string) string {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, rel, buf)
	if err != nil {
		return "?"
	}
	return string(buf[:n])
}

// entry writes one archive entry. With oci set, whiteouts are applied as
// the OCI image spec says instead of being written.
func (x *extractor) entry(hdr *tar.Header, r io.Reader, oci bool) error {
	rel, err := entryPath(hdr.Name)
	if err != nil {
		return err
	}
	if oci {
		dir, hidden, opaque, ok, err := whiteout(rel)
		if err != nil {
			return err
		}
		if ok {
			return x.whiteout(rel, dir, hidden, opaque)
		}
	}
	if rel == "." {
		if hdr.Typeflag == tar.TypeDir {
			x.dirs["."] = hdr
			return nil
		}
		return unsafef("entry %q would replace the root directory with a %s", hdr.Name, typeName(hdr.Typeflag))
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeFifo:
	case tar.TypeCont, tar.TypeGNUSparse: // regular files, to a reader
		hdr.Typeflag = tar.TypeReg
	case tar.TypeChar, tar.TypeBlock:
		x.Stats.Devices++
		return nil
	default:
		// archive/tar has already folded in PAX and GNU long-name
		// headers and sparse files; what is left (GNU volume labels,
		// multi-volume parts) is no file of a root.
		x.Stats.Other++
		return nil
	}
	if hdr.Typeflag == tar.TypeReg {
		if err := x.checkSize(hdr); err != nil {
			return err
		}
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	if hdr.Typeflag == tar.TypeSymlink {
		if err := checkSymlink(rel, hdr.Linkname); err != nil {
			return err
		}
	}
	var linkTo string
	if hdr.Typeflag == tar.TypeLink {
		if linkTo, err = hardlinkTarget(rel, hdr.Linkname); err != nil {
			return err
		}
	}
	dfd, err := x.openDir(dir, true)
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	for p := rel; p != "."; p = path.Dir(p) {
		x.layer[p] = true // and the directories it is in, made or not
	}
	if err := x.clear(dfd, dir, base, hdr.Typeflag == tar.TypeDir); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(dfd, base, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("creating directory %q: %w", rel, err)
		}
		x.dirs[rel] = hdr
		x.Stats.Entries++
		return nil
	case tar.TypeReg:
		err = x.file(dfd, base, rel, hdr, r)
	case tar.TypeSymlink:
		if err = unix.Symlinkat(hdr.Linkname, dfd, base); err != nil {
			err = fmt.Errorf("creating symlink %q: %w", rel, err)
		}
	case tar.TypeLink:
		err = x.hardlink(dfd, base, rel, linkTo)
		if err == nil {
			x.Stats.Entries++
			return nil // the inode's metadata is its first name's
		}
	case tar.TypeFifo:
		if err = unix.Mknodat(dfd, base, unix.S_IFIFO|0o600, 0); err != nil {
			err = fmt.Errorf("creating FIFO %q: %w", rel, err)
		}
	}
	if err != nil {
		return err
	}
	x.Stats.Entries++
	if hdr.Typeflag == tar.TypeReg {
		return nil // file set its own metadata through its fd
	}
	return x.meta(dfd, base, rel, hdr, hdr.Typeflag == tar.TypeSymlink)
}

// clear makes room for a new entry base in dfd: whatever is there goes,
// except a directory that a directory entry only updates.
func (x *extractor) clear(dfd int, dir, base string, isDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if isDir {
			return nil
		}
		return x.remove(path.Join(dir, base))
	}
	return unix.Unlinkat(dfd, base, 0)
}

// remove removes rel and everything below it, and forgets the metadata of
// the directories it held. Its parent was opened without symlinks, and
// RemoveAll follows none. The cached directory fd is dropped only when it
// is rel or below it: callers hold the fd of rel's parent.
func (x *extractor) remove(rel string) error {
	// Every caller's rel is an entry's clean path; this is the last
	// line before RemoveAll, which must never reach the tree itself or
	// beyond it (the work directory, say).
	if p, err := entryPath(rel); err != nil || p != rel || p == "." {
		return unsafef("refusing to remove %q: not a path inside the tree", rel)
	}
	if x.cachedDir == rel || strings.HasPrefix(x.cachedDir, rel+"/") {
		x.forget()
	}
	for d := range x.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			delete(x.dirs, d)
		}
	}
	if err := os.RemoveAll(filepath.Join(x.dir, rel)); err != nil {
		return fmt.Errorf("removing %q: %w", rel, err)
	}
	return nil
}

// checkSize refuses an entry whose declared size (a sparse file's whole
// length) would take the files written past the import's bound, before
// a byte of it is written.
func (x *extractor) checkSize(hdr *tar.Header) error {
	if hdr.Size < 0 || hdr.Size > x.maxSize-x.Stats.Bytes {
		return tooBig("entry %q declares %s: writing it would take the import past its bound of %s written (--max-size), with %s written before it",
			hdr.Name, formatSize(hdr.Size), formatSize(x.maxSize), formatSize(x.Stats.Bytes))
	}
	return nil
}

func (x *extractor) file(dfd int, base, rel string, hdr *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(dfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %q: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(x.dir, rel))
	// The archive's reads and the tree's writes fail for different
	// reasons (a truncated archive; a full disk): say which.
	src := &errReader{r: r}
	n, err := io.Copy(f, src)
	x.Stats.Bytes += n
	if err != nil {
		f.Close()
		if errors.Is(src.err, errTooBig) {
			return fmt.Errorf("entry %q: %w", hdr.Name, src.err)
		}
		if src.err != nil {
			return &readError{entry: hdr.Name, err: src.err}
		}
		return fmt.Errorf("writing %q into the tree %s (after %s of it): %w", rel, x.dir, formatSize(n), err)
	}
	if x.chown {
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			f.Close()
			return fmt.Errorf("chown %q: %w", rel, err)
		}
	}
	// After chown, which clears the set-id bits.
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		f.Close()
		return fmt.Errorf("chmod %q: %w", rel, err)
	}
	setXattrs(fd, hdr)
	ts := times(hdr)
	if err := unix.UtimesNanoAt(dfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		f.Close()
		return fmt.Errorf("setting the times of %q: %w", rel, err)
	}
	return f.Close()
}

func (x *extractor) hardlink(dfd int, base, rel, target string) error {
	tdir, tbase := path.Split(target)
	tdir = strings.TrimSuffix(tdir, "/")
	if tdir == "" {
		tdir = "."
	}
	// Not the cache: dfd may be the cached fd.
	tfd := x.root
	if tdir != "." {
		var err error
		tfd, err = x.walkDir(tdir, false)
		if err != nil {
			return fmt.Errorf("hard link %q -> %q: %w", rel, target, err)
		}
		defer unix.Close(tfd)
	}
	// Flags 0: a link to a symlink links the symlink, never its target.
	if err := unix.Linkat(tfd, tbase, dfd, base, 0); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("hard link %q -> %q: the archive has no such file before it", rel, target)
		}
		return fmt.Errorf("hard link %q -> %q: %w", rel, target, err)
	}
	return nil
}

// meta sets the owner, mode and times of base in dfd. A symlink has no
// mode of its own.
func (x *extractor) meta(dfd int, base, rel string, hdr *tar.Header, symlink bool) error {
	flags := unix.AT_SYMLINK_NOFOLLOW
	if x.chown {
		if err := unix.Fchownat(dfd, base, hdr.Uid, hdr.Gid, flags); err != nil {
			return fmt.Errorf("chown %q: %w", rel, err)
		}
	}
	if !symlink {
		// fchmodat has no AT_SYMLINK_NOFOLLOW before Linux 6.6; the entry
		// is no symlink, and dfd was reached without one.
		if err := unix.Fchmodat(dfd, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod %q: %w", rel, err)
		}
	}
	if err := unix.UtimesNanoAt(dfd, base, times(hdr), flags); err != nil {
		return fmt.Errorf("setting the times of %q: %w", rel, err)
	}
	return nil
}

func times(hdr *tar.Header) []unix.Timespec {
	m := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	a := m
	if !hdr.AccessTime.IsZero() {
		a = unix.NsecToTimespec(hdr.AccessTime.UnixNano())
	}
	return []unix.Timespec{a, m}
}

// keptXattrs are the extended attributes worth keeping from an archive:
// file capabilities (ping's cap_net_raw) and the user namespace. Trusted
// ones (overlayfs's own) and security labels are not.
func keptXattr(name string) bool {
	return name == "security.capability" || strings.HasPrefix(name, "user.")
}

func setXattrs(fd int, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if ok && keptXattr(name) {
			// Best effort: a file system without them loses nothing the
			// guest needs to run.
			_ = unix.Fsetxattr(fd, name, []byte(v), 0)
		}
	}
}

// whiteout applies an OCI whiteout found at rel; whiteout (tarpath.go)
// has refused one that names no file of dir, or names one outside it.
func (x *extractor) whiteout(rel, dir, hidden string, opaque bool) error {
	x.Stats.Whiteouts++
	if !opaque && strings.HasPrefix(hidden, whiteoutPrefix) {
		return nil // AUFS's own metadata (.wh..wh.plnk and the like)
	}
	dfd, err := x.openDir(dir, opaque)
	if err != nil {
		if !opaque && errors.Is(err, unix.ENOENT) {
			return nil // nothing below to hide
		}
		return fmt.Errorf("whiteout %q: %w", rel, err)
	}
	if !opaque {
		if x.layer[path.Join(dir, hidden)] {
			return nil // this layer's own file: the whiteout is for those below
		}
		var st unix.Stat_t
		if err := unix.Fstatat(dfd, hidden, &st, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
			return nil
		}
		return x.remove(path.Join(dir, hidden))
	}
	x.layer[dir] = true
	return x.removeLower(dir)
}

// removeLower removes what is in dir that the current layer did not
// write, descending into the directories it did.
func (x *extractor) removeLower(dir string) error {
	ents, err := os.ReadDir(filepath.Join(x.dir, dir))
	if err != nil {
		return fmt.Errorf("opaque whiteout in %q: %w", dir, err)
	}
	for _, e := range ents {
		if err := x.ctx.Err(); err != nil {
			return err
		}
		p := path.Join(dir, e.Name())
		switch {
		case !x.layer[p]:
			if err := x.remove(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := x.removeLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// finish applies the directories' metadata, deepest first, once every
// entry is written.
func (x *extractor) finish() error {
	x.forget()
	dirs := make([]string, 0, len(x.dirs))
	for d := range x.dirs {
		dirs = append(dirs, d)
	}
	slices.SortFunc(dirs, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	for _, d := range dirs {
		hdr := x.dirs[d]
		if d == "." {
			continue // below, last
		}
		parent, base := path.Split(d)
		parent = strings.TrimSuffix(parent, "/")
		if parent == "" {
			parent = "."
		}
		pfd := x.root
		if parent != "." {
			var err error
			if pfd, err = x.walkDir(parent, false); err != nil {
				return fmt.Errorf("directory %q: %w", d, err)
			}
		}
		err := x.meta(pfd, base, d, hdr, false)
		if pfd != x.root {
			unix.Close(pfd)
		}
		if err != nil {
			return err
		}
	}
	if hdr := x.dirs["."]; hdr != nil {
		// The root keeps a sane mode whatever the archive says: the
		// guest's / must be searchable by every user.
		if x.chown {
			if err := unix.Fchownat(x.root, "", hdr.Uid, hdr.Gid, unix.AT_EMPTY_PATH); err != nil {
				return fmt.Errorf("chown the root: %w", err)
			}
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, x.dir, times(hdr), 0); err != nil {
			return fmt.Errorf("setting the root's times: %w", err)
		}
	}
	if err := os.Chmod(x.dir, 0o755); err != nil {
		return fmt.Errorf("chmod the root: %w", err)
	}
	return nil
}

// errReader remembers its reader's error.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// readError is a failure to read an archive's bytes (not to write them).
type readError struct {
	entry string
	err   error
}

func (e *readError) Error() string {
	return fmt.Sprintf("reading entry %q: %v", e.entry, e.err)
}

func (e *readError) Unwrap() error { return e.err }

// extractTar writes every entry of the tar stream r into x.
func (x *extractor) extractTar(r io.Reader, oci bool) error {
	tr := tar.NewReader(r)
	last := ""
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if errors.Is(err, errTooBig) || (err != nil && x.ctx.Err() != nil) {
			return err
		}
		if err != nil {
			return &readError{entry: last, err: err}
		}
		last = hdr.Name
		if err := x.entry(hdr, tr, oci); err != nil {
			return err
		}
	}
}

func typeName(t byte) string {
	switch t {
	case tar.TypeReg:
		return "file"
	case tar.TypeDir:
		return "directory"
	case tar.TypeSymlink:
		return "symlink"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("entry of type %q", t)
}

// maxTrailer bounds what a layer's tar stream may hold after the
// archive's end: its end blocks and the padding to a record (GNU tar's
// are 10 KiB), not a gigabyte of zeros to decompress.
const maxTrailer = 1 << 20

// streamBound counts the uncompressed bytes of the layers' tar streams
// and fails the read that takes them past max.
type streamBound struct {
	r      io.Reader
	n, max *int64
}

func (b streamBound) Read(p []byte) (int, error) {
	if *b.n >= *b.max {
		return 0, tooBig("the layers' uncompressed tar streams are over %s, twice the import's bound on what it writes (--max-size): a decompression bomb, or an image too big for the bound",
			formatSize(*b.max))
	}
	if rest := *b.max - *b.n; int64(len(p)) > rest {
		p = p[:rest]
	}
	n, err := b.r.Read(p)
	*b.n += int64(n)
	return n, err
}

// extractLayers writes the layers into tree, bottom first, and then the
// directories' metadata. The files' sizes are bounded by maxSize, the
// tar streams by twice it.
func extractLayers(ctx context.Context, tree string, layers []layerSource, maxSize int64) (ExtractStats, error) {
	x, err := newExtractor(ctx, tree, maxSize)
	if err != nil {
		return ExtractStats{}, err
	}
	defer x.Close()
	var streamed int64
	streamMax := 2 * maxSize
	if streamMax < maxSize { // overflow
		streamMax = maxSize
	}
	for _, l := range layers {
		if err := ctx.Err(); err != nil {
			return x.Stats, err
		}
		x.startLayer()
		rc, err := l.open(ctx)
		if err != nil {
			return x.Stats, withName(l.name, "opening "+l.name, truncated(err, l.name))
		}
		r := ctxReader{ctx, streamBound{r: rc, n: &streamed, max: &streamMax}}
		err = x.extractTar(r, l.oci)
		if err == nil {
			// The rest of the stream: tar's end blocks, the padding, and
			// the compressor's trailer, whose checksum and length tell a
			// truncated or altered stream from a whole one.
			n, cerr := io.Copy(io.Discard, io.LimitReader(r, maxTrailer+1))
			switch {
			case errors.Is(cerr, errCorrupt) || errors.Is(cerr, errTruncated) || errors.Is(cerr, errTooBig):
				err = cerr // a verifying reader's verdict on the whole layer
			case cerr != nil:
				err = &readError{entry: "(after the last entry)", err: cerr}
			case n > maxTrailer:
				err = tooBig("more than %s follows the end of its tar archive: a layer ends with its end blocks and padding", formatSize(maxTrailer))
			}
		}
		if cerr := rc.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing %s: %w", l.name, cerr)
		}
		if err != nil {
			var re *readError
			if errors.As(err, &re) && !errors.Is(err, errTooBig) {
				return x.Stats, truncated(err, l.name)
			}
			if ctx.Err() != nil {
				return x.Stats, ctx.Err()
			}
			return x.Stats, withName(l.name, l.name, err)
		}
	}
	if err := x.finish(); err != nil {
		return x.Stats, fmt.Errorf("setting the directories' owners, modes and times: %w", err)
	}
	return x.Stats, nil
}
