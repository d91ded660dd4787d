package rootimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// SourceKind says what an imported image is made from.
type SourceKind string

// The kinds of Source.
const (
	// SourceTar is a root file system tarball: docker export, podman
	// export, tar -C root -c . ; plain or gzip, zstd, xz or bzip2
	// compressed. Its entries are written as they are: no whiteouts.
	SourceTar SourceKind = "tar"
	// SourceOCILayout is an OCI image layout directory (index.json,
	// blobs/): skopeo copy oci:, buildah push oci:, crane pull --format=oci.
	SourceOCILayout SourceKind = "oci-layout"
	// SourceDockerArchive is a docker save / podman save tar archive of
	// one image.
	SourceDockerArchive SourceKind = "docker-archive"
	// SourceImage is a registry reference (debian:12, ghcr.io/o/i@sha256:…),
	// fetched with the credentials docker login stored, if any.
	SourceImage SourceKind = "image"
)

// Source is what Import reads.
type Source struct {
	Kind SourceKind
	Path string // a file or directory, for every kind but SourceImage
	Ref  string // SourceImage's reference
}

func (s Source) String() string {
	if s.Kind == SourceImage {
		return string(s.Kind) + ":" + s.Ref
	}
	return string(s.Kind) + ":" + absPath(s.Path)
}

// FSMaker writes the image of a tree; ExecTools is one.
type FSMaker interface {
	MakeFS(ctx context.Context, r Recipe, tree, image string) error
}

// ImportOptions are the inputs of Import.
type ImportOptions struct {
	Source Source
	Out    string // output directory: ImageFile and ManifestFile go there
	Format Format // "" is DefaultFormat
	Name   string // recorded in the manifest; "" names it after the source
	Log    *slog.Logger
	Tools  FSMaker // nil: ExecTools with its output discarded; ExecTools's mkfs is looked for first
	// MaxSize bounds the bytes the import writes into its tree: the
	// sizes every file entry declares, summed over every layer (a file
	// a later layer replaces or hides still counts), sparse files at
	// their full length. The layers' uncompressed tar streams are
	// bounded at twice it (their headers and padding count there), and
	// what follows a layer's end at maxTrailer. 0 is DefaultMaxSize.
	MaxSize int64
}

// ImportResult reports an Import.
type ImportResult struct {
	Manifest *Manifest
	Image    string // the image's path in Out
	Layers   int
	Stats    ExtractStats
	Extract  time.Duration // reading and writing the tree, finishing it
	MakeFS   time.Duration
}

// layerSource is one tar stream to extract, bottom layer first.
type layerSource struct {
	name string // for messages: "the archive x.tar", "layer 2 of 3 (sha256:…)"
	oci  bool   // apply OCI whiteouts
	open func(ctx context.Context) (io.ReadCloser, error)
}

// Import makes a guest root image from another system's root file system:
// a tarball or an OCI image, its layers flattened in order with their
// whiteouts applied. The tree is extracted without following any link and
// refused when an entry would land outside it; it is finished like the
// default image (mount points, /tmp, /etc/hostname, /etc/hosts) but keeps
// its own users, owners and modes (device nodes are left out: the guest's
// /dev is a devtmpfs); it must have a /bin/sh for the guest's x86-64
// kernel. Every blob of an OCI image is verified against its digest as it
// is read, and each layer's tar stream against its diff ID; metadata is
// read up to MaxMetadata, and what the import writes is bounded by
// MaxSize. The image and its manifest are made beside Out and renamed into
// it once complete: a failure leaves Out as it was, and removes the work
// directory.
func Import(ctx context.Context, o ImportOptions) (res *ImportResult, err error) {
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Format == "" {
		o.Format = DefaultFormat
	}
	if _, err := ParseFormat(string(o.Format)); err != nil {
		return nil, err
	}
	if o.Out == "" {
		return nil, errors.New("no output directory")
	}
	if o.Tools == nil {
		o.Tools = ExecTools{}
	}
	if _, ok := o.Tools.(ExecTools); ok {
		if err := checkMakeFS(o.Format); err != nil {
			return nil, err
		}
	}
	if o.Name == "" {
		o.Name = defaultName(o.Source)
	}
	if o.MaxSize == 0 {
		o.MaxSize = DefaultMaxSize
	}
	if o.MaxSize < 0 {
		return nil, fmt.Errorf("a maximum size of %d bytes", o.MaxSize)
	}
	m := &Manifest{Format: o.Format, Name: o.Name, Source: o.Source.String()}
	var layers []layerSource
	var oci *image
	switch o.Source.Kind {
	case SourceTar:
		if err := notDir(o.Source.Path); err != nil {
			return nil, err
		}
		layers = []layerSource{{name: "the archive " + o.Source.Path, open: openTarball(o.Source.Path)}}
	case SourceOCILayout, SourceDockerArchive, SourceImage:
		where := o.Source.Path
		if o.Source.Kind == SourceImage {
			where = o.Source.Ref
		}
		if oci, err = findImage(ctx, o.Source); err != nil {
			return nil, err
		}
		defer oci.Close()
		if m.Platform, err = checkPlatform(oci.config, where); err != nil {
			return nil, err
		}
		if layers, err = ociLayers(oci); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
	default:
		return nil, fmt.Errorf("unknown source kind %q", o.Source.Kind)
	}
	if os.Geteuid() != 0 {
		o.Log.Warn("not running as root: every file of the image will belong to you, not to the owners the archive names (run as root to keep them)")
	}

	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, err
	}
	outFI, err := os.Stat(out)
	switch {
	case err == nil && !outFI.IsDir():
		return nil, fmt.Errorf("--out %s is not a directory", o.Out)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	outExists := err == nil
	// The work directory is out's sibling, so that the finished files are
	// renamed into out on one file system. Directories made for it are
	// removed again on failure.
	parent := filepath.Dir(out)
	made := firstMissing(parent)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", parent, err)
	}
	work, err := os.MkdirTemp(parent, "."+filepath.Base(out)+".import-")
	if err != nil {
		return nil, fmt.Errorf("creating a work directory beside %s: %w", o.Out, err)
	}
	defer func() {
		if err != nil {
			if rerr := removeAllForce(work); rerr != nil {
				o.Log.Warn("leaving the failed import's directory", "dir", work, "err", rerr)
			}
			if made != "" {
				os.RemoveAll(made)
			}
		}
	}()

	res = &ImportResult{Layers: len(layers)}
	tree := filepath.Join(work, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return nil, err
	}
	t := time.Now()
	o.Log.Info("extracting", "source", o.Source.String(), "layers", len(layers))
	if res.Stats, err = extractLayers(ctx, tree, layers, o.MaxSize); err != nil {
		return nil, err
	}
	if oci != nil {
		// Known only now for a docker save archive: the digests of the
		// layers as read.
		d, err := oci.Digest()
		if err != nil {
			return nil, err
		}
		m.Digest = d.String()
	}
	if res.Stats.Entries == 0 {
		return nil, fmt.Errorf("%s holds no files", o.Source)
	}
	if err := finishRoot(tree); err != nil {
		return nil, fmt.Errorf("finishing the root tree: %w", err)
	}
	if err := checkShell(tree); err != nil {
		if hint := archiveHint(tree, o.Source.Kind); hint != "" {
			err = fmt.Errorf("%w (%s)", err, hint)
		}
		return nil, err
	}
	if m.Platform == "" {
		m.Platform = guestPlatform.String() // /bin/sh's ELF header said so
	}
	res.Extract = time.Since(t)

	img := filepath.Join(work, ImageFile)
	o.Log.Info("making the file system", "format", o.Format, "entries", res.Stats.Entries, "extract", res.Extract.Round(time.Millisecond))
	t = time.Now()
	if err := o.Tools.MakeFS(ctx, Recipe{Format: o.Format}, tree, img); err != nil {
		return nil, err
	}
	res.MakeFS = time.Since(t)
	if err := removeAllForce(tree); err != nil {
		return nil, fmt.Errorf("removing the root tree: %w", err)
	}
	if err := os.Chmod(img, 0o444); err != nil {
		return nil, err
	}
	if err := syncFile(img); err != nil {
		return nil, err
	}
	if m.SHA256, m.Bytes, err = hashFile(img); err != nil {
		return nil, err
	}
	// Written after the image, so its mtime is not older than the
	// image's: the session trusts a manifest only then.
	if err := WriteManifest(filepath.Join(work, ManifestFile), m); err != nil {
		return nil, fmt.Errorf("writing the manifest: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := commitImport(work, out, outExists); err != nil {
		return nil, fmt.Errorf("installing the image into %s: %w", o.Out, err)
	}
	res.Manifest, res.Image = m, filepath.Join(out, ImageFile)
	return res, nil
}

// commitImport moves the finished image and manifest from work into out:
// the whole directory when out does not exist, else one rename each.
func commitImport(work, out string, outExists bool) error {
	if !outExists {
		if err := os.Chmod(work, 0o755); err != nil {
			return err
		}
		if err := os.Rename(work, out); err != nil {
			return err
		}
		return syncFile(filepath.Dir(out))
	}
	for _, f := range []string{ImageFile, ManifestFile} {
		if err := os.Rename(filepath.Join(work, f), filepath.Join(out, f)); err != nil {
			return err
		}
	}
	if err := syncFile(out); err != nil {
		return err
	}
	return os.Remove(work)
}

// firstMissing returns the outermost directory of p that does not exist,
// or "" if p exists.
func firstMissing(p string) string {
	missing := ""
	for d := p; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			return missing
		}
		missing = d
		if filepath.Dir(d) == d {
			return missing
		}
	}
}

// removeAllForce is os.RemoveAll that also empties directories an
// archive made read-only, which an importer that is not root cannot
// otherwise empty.
func removeAllForce(p string) error {
	if err := os.RemoveAll(p); err == nil {
		return nil
	}
	filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(q, 0o700)
		}
		return nil
	})
	return os.RemoveAll(p)
}

func defaultName(s Source) string {
	if s.Kind == SourceImage {
		return s.Ref
	}
	b := filepath.Base(filepath.Clean(s.Path))
	for _, ext := range []string{".gz", ".tgz", ".zst", ".xz", ".bz2", ".tar"} {
		b = strings.TrimSuffix(b, ext)
	}
	return b
}

// archiveHint guesses, for a tree without a shell, that the user gave the
// wrong kind of source: a docker save archive or an OCI layout packed in
// a tar, given as a root tarball.
func archiveHint(tree string, kind SourceKind) string {
	if kind != SourceTar {
		return ""
	}
	has := func(name string) bool {
		_, err := os.Lstat(filepath.Join(tree, name))
		return err == nil
	}
	switch {
	case has("manifest.json") && (has("repositories") || has("blobs")):
		return "this looks like a docker save archive: import it with --docker-archive"
	case has("oci-layout") && has("index.json"):
		return "this looks like an OCI image layout in a tar: unpack it and import the directory with --oci-layout"
	}
	return ""
}

// openTarball opens a root file system archive, decompressing what its
// first bytes say it is.
func openTarball(p string) func(context.Context) (io.ReadCloser, error) {
	return func(ctx context.Context) (io.ReadCloser, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		rc, _, err := decompress(ctx, f, f)
		if err != nil {
			f.Close()
			return nil, err
		}
		return rc, nil
	}
}

// Compression magics.
var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0}
	magicBzip2 = []byte("BZh")
)

// decompress returns the tar stream of r, decompressed as its first
// bytes say, and whether it was compressed; closing it closes f.
func decompress(ctx context.Context, r io.Reader, f io.Closer) (io.ReadCloser, bool, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(6)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, false, err // a verifying reader's refusal, say
	}
	switch {
	case bytes.HasPrefix(magic, magicGzip):
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, false, fmt.Errorf("gzip: %w", err)
		}
		return &closers{Reader: zr, close: []io.Closer{zr, f}}, true, nil
	case bytes.HasPrefix(magic, magicZstd):
		// The window bounds the decoder's memory whatever the frame says.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(128<<20))
		if err != nil {
			return nil, false, fmt.Errorf("zstd: %w", err)
		}
		return &closers{Reader: zr, close: []io.Closer{zr.IOReadCloser(), f}}, true, nil
	case bytes.HasPrefix(magic, magicXz):
		rc, err := xzReader(ctx, br, f)
		return rc, true, err
	case bytes.HasPrefix(magic, magicBzip2):
		return &closers{Reader: bzip2.NewReader(br), close: []io.Closer{f}}, true, nil
	}
	return &closers{Reader: br, close: []io.Closer{f}}, false, nil
}

type closers struct {
	io.Reader
	close []io.Closer
}

func (c *closers) Close() error {
	var errs []error
	for _, cl := range c.close {
		errs = append(errs, cl.Close())
	}
	return errors.Join(errs...)
}

// xzReader decompresses with xz(1): Go's standard library has no xz, and
// xz-utils is on every machine setup prepares.
func xzReader(ctx context.Context, r io.Reader, f io.Closer) (io.ReadCloser, error) {
	if _, err := exec.LookPath("xz"); err != nil {
		return nil, errors.New("the archive is xz-compressed and xz is not installed: install it with apt-get install xz-utils")
	}
	cmd := exec.CommandContext(ctx, "xz", "--decompress", "--stdout")
	cmd.Stdin = r
	stderr := &bytes.Buffer{} // xz says a line or two
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting xz: %w", err)
	}
	return &xzStream{cmd: cmd, out: out, stderr: stderr, f: f}, nil
}

type xzStream struct {
	cmd    *exec.Cmd
	out    io.ReadCloser
	stderr *bytes.Buffer
	f      io.Closer
	done   bool
	err    error
}

func (x *xzStream) Read(p []byte) (int, error) {
	n, err := x.out.Read(p)
	if err == io.EOF && !x.done {
		x.done = true
		if werr := x.cmd.Wait(); werr != nil {
			msg := strings.TrimSpace(x.stderr.String())
			if strings.Contains(msg, "Unexpected end of input") {
				x.err = fmt.Errorf("xz: %s: %w", msg, io.ErrUnexpectedEOF)
			} else {
				x.err = fmt.Errorf("xz: %v: %s", werr, msg)
			}
		}
	}
	if err == io.EOF && x.err != nil {
		return n, x.err
	}
	return n, err
}

func (x *xzStream) Close() error {
	x.out.Close()
	if !x.done {
		x.done = true
		x.cmd.Process.Kill()
		x.cmd.Wait()
	}
	return x.f.Close()
}

// errTruncated is wrapped when an archive or layer ends early.
var errTruncated = errors.New("truncated")

// truncated names what a read error means: an archive that ends in the
// middle of an entry, or bytes that are not a tar archive at all.
func truncated(err error, what string) error {
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("%s is %w: %w", what, errTruncated, err)
	case errors.Is(err, errCorrupt):
		return err
	case errors.Is(err, gzip.ErrChecksum):
		return fmt.Errorf("%s is corrupt: %w (%w)", what, errCorrupt, err)
	case errors.Is(err, tar.ErrHeader), errors.Is(err, gzip.ErrHeader):
		return fmt.Errorf("%s is not a tar archive, or is corrupt: %w", what, err)
	}
	return err
}

// ctxReader fails reads once ctx is done, so a cancelled import stops
// mid-layer.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
