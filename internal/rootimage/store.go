package rootimage

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// fileStore is where an image's files are: an OCI layout's directory, or
// a docker save archive (which may hold an OCI layout too).
type fileStore interface {
	// file opens the file at name (a clean relative path) for reading,
	// with its length.
	file(ctx context.Context, name string) (io.ReadCloser, int64, error)
	has(name string) bool
	Close() error
}

// blobPath is where an OCI layout keeps the blob d names.
func blobPath(d v1.Hash) (string, error) {
	if !validHash(d) {
		return "", fmt.Errorf("%q is not a sha256 digest", d)
	}
	return "blobs/" + d.Algorithm + "/" + d.Hex, nil
}

func validHash(d v1.Hash) bool {
	if d.Algorithm != "sha256" || len(d.Hex) != 64 {
		return false
	}
	for _, c := range d.Hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// storeBlob is the blob of store that d names.
func storeBlob(st fileStore, what string, d v1.Descriptor) blob {
	return blob{what: what, desc: d, open: func(ctx context.Context) (io.ReadCloser, int64, error) {
		p, err := blobPath(d.Digest)
		if err != nil {
			return nil, 0, err
		}
		return st.file(ctx, p)
	}}
}

// dirStore is an OCI layout directory, opened with os.Root: no name of
// the layout resolves outside it, whatever its symlinks.
type dirStore struct{ root *os.Root }

func openDirStore(dir string) (*dirStore, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return &dirStore{root: r}, nil
}

func (s *dirStore) file(_ context.Context, name string) (io.ReadCloser, int64, error) {
	f, err := s.root.Open(name)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s is not a regular file", name)
	}
	return f, fi.Size(), nil
}

func (s *dirStore) has(name string) bool {
	_, err := s.root.Lstat(name)
	return err == nil
}

func (s *dirStore) Close() error { return s.root.Close() }

// archiveStore is a tar archive read in place: one pass over its headers
// finds every file's offset, so a file is then a section of the archive,
// and a symlink is followed through that index, not by reading the
// archive again from the start for every link.
type archiveStore struct {
	path  string
	f     *os.File
	files map[string]archiveEntry
}

type archiveEntry struct {
	off, size int64
	link      string // a symlink's or hard link's target, resolved to a clean archive path
	isDir     bool
}

// openArchiveStore indexes the tar archive at p.
func openArchiveStore(ctx context.Context, p string) (*archiveStore, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	s := &archiveStore{path: p, f: f, files: map[string]archiveEntry{}}
	if err := s.index(ctx); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// index reads the archive's headers. archive/tar reads nothing ahead of
// the header it returns and skips a file's data by seeking, so the
// file's offset after Next is where the entry's data starts.
func (s *archiveStore) index(ctx context.Context) error {
	tr := tar.NewReader(s.f)
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return truncated(err, "the archive "+s.path)
		}
		if n >= maxArchiveEntries {
			return tooBig("the archive %s has more than %d entries, the bound on a docker save archive's (a save of one image has a few per layer)", s.path, maxArchiveEntries)
		}
		if len(hdr.Name) > maxArchiveName {
			return fmt.Errorf("the archive %s has an entry name of %d bytes: a docker save archive's are short", s.path, len(hdr.Name))
		}
		name, err := entryPath(hdr.Name)
		if err != nil {
			return fmt.Errorf("the archive %s: %w", s.path, err)
		}
		e := archiveEntry{size: hdr.Size}
		switch hdr.Typeflag {
		case tar.TypeReg:
			if isSparse(hdr) {
				return fmt.Errorf("the archive %s: entry %q is a sparse file: a docker save archive has none", s.path, hdr.Name)
			}
			if e.off, err = s.f.Seek(0, io.SeekCurrent); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if e.link, err = linkPath(name, hdr.Linkname, false); err != nil {
				return fmt.Errorf("the archive %s: %w", s.path, err)
			}
		case tar.TypeLink:
			if e.link, err = linkPath(name, hdr.Linkname, true); err != nil {
				return fmt.Errorf("the archive %s: %w", s.path, err)
			}
		case tar.TypeDir:
			e.isDir = true
		default:
			continue
		}
		s.files[name] = e // a later entry of the same name replaces an earlier one, as tar does
	}
}

// isSparse: archive/tar expands a sparse file's holes as it reads, so
// its data is not one section of the archive.
func isSparse(hdr *tar.Header) bool {
	if hdr.Typeflag == tar.TypeGNUSparse {
		return true
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// linkPath is the archive path a link at name points to: a symlink's
// target relative to its directory, a hard link's relative to the root.
func linkPath(name, target string, hard bool) (string, error) {
	if !hard {
		if err := checkSymlink(name, target); err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			return "", unsafef("symlink %q -> %q is absolute: a docker save archive links within itself", name, target)
		}
		target = path.Join(path.Dir(name), target)
	}
	p, err := entryPath(target)
	if err != nil || p == "." {
		return "", unsafef("link %q -> %q points outside the archive", name, target)
	}
	return p, nil
}

func (s *archiveStore) lookup(ctx context.Context, name string) (archiveEntry, error) {
	p := name
	for hops := 0; ; hops++ {
		if err := ctx.Err(); err != nil {
			return archiveEntry{}, err
		}
		e, ok := s.files[p]
		if !ok {
			return archiveEntry{}, fmt.Errorf("%s is not in the archive %s: %w", p, s.path, fs.ErrNotExist)
		}
		if e.link == "" {
			return e, nil
		}
		if hops >= maxLinkHops {
			return archiveEntry{}, fmt.Errorf("%s in the archive %s: more than %d links to follow", name, s.path, maxLinkHops)
		}
		p = e.link
	}
}

func (s *archiveStore) file(ctx context.Context, name string) (io.ReadCloser, int64, error) {
	p, err := entryPath(name)
	if err != nil {
		return nil, 0, err
	}
	e, err := s.lookup(ctx, p)
	if err != nil {
		return nil, 0, err
	}
	if e.isDir {
		return nil, 0, fmt.Errorf("%s in the archive %s is a directory", name, s.path)
	}
	return io.NopCloser(io.NewSectionReader(s.f, e.off, e.size)), e.size, nil
}

func (s *archiveStore) has(name string) bool {
	_, err := s.lookup(context.Background(), name)
	return err == nil
}

func (s *archiveStore) Close() error { return s.f.Close() }
