package rootimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// The bounds on what an import reads and writes. An image is untrusted
// input: without them a small archive (a sparse file, a gzip of zeros)
// fills the disk or the memory of the machine importing it.
const (
	// DefaultMaxSize is the default of ImportOptions.MaxSize: the bytes
	// an import may write into its tree.
	DefaultMaxSize int64 = 8 << 30
	// MaxMetadata bounds every metadata file an import reads into
	// memory: an OCI layout's index.json, an index, a manifest, an image
	// config, a docker save archive's manifest.json. Real ones are a few
	// KiB; the largest configs (long histories) some hundred KiB.
	MaxMetadata int64 = 4 << 20
	// maxArchiveEntries bounds the entries of a docker save archive,
	// whose names are held in memory: a save of one image has a few per
	// layer.
	maxArchiveEntries = 10000
	// maxArchiveName bounds an archive entry's name held in memory.
	maxArchiveName = 1024
	// maxLinkHops bounds the symlinks followed to find one file of a
	// docker save archive, as the kernel bounds a path's (40).
	maxLinkHops = 40
)

// errTooBig is wrapped by every refusal of an input over one of the
// import's bounds.
var errTooBig = errors.New("over the import's size bound")

// sizeError is such a refusal; its message names what was too big and
// which bound it met.
type sizeError struct{ msg string }

func (e *sizeError) Error() string { return e.msg }
func (e *sizeError) Unwrap() error { return errTooBig }

func tooBig(format string, args ...any) error {
	return &sizeError{fmt.Sprintf(format, args...)}
}

// metadataTooBig refuses a metadata file of size bytes ("more than"
// where it was not read to its end).
func metadataTooBig(what, size string) error {
	return tooBig("%s is %s: over the %s bound on an image's metadata files (index.json, indexes, manifests, configs, manifest.json)",
		what, size, formatSize(MaxMetadata))
}

// formatSize writes n bytes for a message: 8.0 GiB, 4.0 MiB, 512 B.
func formatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// blob is one blob of an image as stored: the descriptor that names it
// and how to open it. A docker save archive's manifest.json names its
// files by path alone: their descriptors have no size (unsized) and a
// digest only where the path is one (blobs/sha256/HEX).
type blob struct {
	what    string // for messages: "the manifest sha256:…", "layer 2 of 3 (sha256:…)"
	desc    v1.Descriptor
	unsized bool  // desc.Size is not known
	corrupt error // wrapped by a digest or size mismatch: errDigest, or errCorrupt for a layer
	// open returns the stored bytes and their length as the store sees
	// it (-1 if unknown), which is checked against the descriptor before
	// a byte is read.
	open func(ctx context.Context) (io.ReadCloser, int64, error)
}

// errDigest is wrapped when a blob's bytes are not those its descriptor
// names (or, for a layer, its config's diff ID names): altered, swapped
// or cut short.
var errDigest = errors.New("its bytes do not have the digest that names them")

// digestReader hashes a blob as it is read and, at its end, refuses one
// whose length or digest is not its descriptor's. Reads past the
// descriptor's size fail at once: a blob longer than it says is not read
// to its end. With deferred set the end reads as io.EOF and the caller
// asks for the verdict.
type digestReader struct {
	r        io.Reader
	b        blob
	size     int64 // -1: not known
	h        hash.Hash
	n        int64
	deferred bool
	err      error // the verdict, once the end is reached
	done     bool
}

func newDigestReader(r io.Reader, b blob) (*digestReader, error) {
	if b.desc.Digest.Hex != "" && b.desc.Digest.Algorithm != "sha256" {
		return nil, fmt.Errorf("%s is named by a %s digest (%s): only sha256 is supported", b.what, b.desc.Digest.Algorithm, b.desc.Digest)
	}
	if b.corrupt == nil {
		b.corrupt = errDigest
	}
	size := b.size()
	if size >= 0 {
		r = io.LimitReader(r, size+1)
	}
	return &digestReader{r: r, b: b, size: size, h: sha256.New()}, nil
}

func (d *digestReader) Read(p []byte) (int, error) {
	if d.done {
		if d.err != nil && !d.deferred {
			return 0, d.err
		}
		return 0, io.EOF
	}
	n, err := d.r.Read(p)
	d.h.Write(p[:n])
	d.n += int64(n)
	if d.size >= 0 && d.n > d.size {
		// Not deferred: the rest is not worth reading.
		d.done, d.deferred = true, false
		d.err = fmt.Errorf("%s is longer than the %d bytes its descriptor says: %w", d.b.what, d.size, d.b.corrupt)
		return 0, d.err
	}
	if err == io.EOF {
		d.done, d.err = true, d.check()
		if d.err != nil && !d.deferred {
			return n, d.err
		}
	}
	return n, err
}

// verdict is nil once the whole blob was read and is what its descriptor
// names.
func (d *digestReader) verdict() error {
	if !d.done {
		return fmt.Errorf("%s was not read to its end", d.b.what)
	}
	return d.err
}

func (d *digestReader) check() error {
	if d.size >= 0 && d.n < d.size {
		return fmt.Errorf("%s is %w: %d bytes, not the %d its descriptor says", d.b.what, errTruncated, d.n, d.size)
	}
	if want := d.b.desc.Digest; want.Hex != "" && d.sum().Hex != want.Hex {
		return fmt.Errorf("%s has digest %s, not %s: %w", d.b.what, shortDigest(d.sum().String()), shortDigest(want.String()), d.b.corrupt)
	}
	return nil
}

// sum is the sha256 of what was read.
func (d *digestReader) sum() v1.Hash {
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(d.h.Sum(nil))}
}

// size is the blob's length its descriptor says, or -1.
func (b blob) size() int64 {
	if b.unsized {
		return -1
	}
	return b.desc.Size
}

// checkStoredSize refuses a blob whose stored length is not its
// descriptor's, or is over bound (0: none), before reading it.
func checkStoredSize(b blob, stored, bound int64) error {
	if b.corrupt == nil {
		b.corrupt = errDigest
	}
	size := b.size()
	switch {
	case size < -1 || (!b.unsized && b.desc.Digest.Hex == ""):
		return fmt.Errorf("%s has no valid descriptor (size %d, digest %q): %w", b.what, size, b.desc.Digest, b.corrupt)
	case bound > 0 && size > bound:
		return metadataTooBig(b.what, formatSize(size)+" (its descriptor says)")
	case bound > 0 && stored > bound:
		return metadataTooBig(b.what, formatSize(stored))
	case size >= 0 && stored >= 0 && stored < size:
		return fmt.Errorf("%s is %w: %d bytes, not the %d its descriptor says", b.what, errTruncated, stored, size)
	case size >= 0 && stored > size:
		return fmt.Errorf("%s is %d bytes, not the %d its descriptor says: %w", b.what, stored, size, b.corrupt)
	}
	return nil
}

// openBlob opens b as a verifying reader: its reads fail at the end of a
// blob that is not what its descriptor names.
func openBlob(ctx context.Context, b blob, bound int64) (*digestReader, io.Closer, error) {
	rc, stored, err := b.open(ctx)
	if err != nil {
		return nil, nil, withName(b.what, "opening "+b.what, err)
	}
	if err := checkStoredSize(b, stored, bound); err != nil {
		rc.Close()
		return nil, nil, err
	}
	dr, err := newDigestReader(ctxReader{ctx, rc}, b)
	if err != nil {
		rc.Close()
		return nil, nil, err
	}
	return dr, rc, nil
}

// readMetadata reads a metadata blob whole, never more than MaxMetadata
// bytes of it, and verifies it. It returns the bytes' digest too, for a
// blob whose descriptor names none.
func readMetadata(ctx context.Context, b blob) ([]byte, v1.Hash, error) {
	dr, c, err := openBlob(ctx, b, MaxMetadata)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	defer c.Close()
	data, err := io.ReadAll(io.LimitReader(dr, MaxMetadata+1))
	if err != nil {
		return nil, v1.Hash{}, withName(b.what, "reading "+b.what, err)
	}
	if int64(len(data)) > MaxMetadata {
		return nil, v1.Hash{}, metadataTooBig(b.what, "more than "+formatSize(MaxMetadata))
	}
	return data, dr.sum(), nil
}

// withName prefixes err with prefix unless its message names what
// already: the verifying readers' refusals name the blob they refuse.
func withName(what, prefix string, err error) error {
	if strings.Contains(err.Error(), what) {
		return err
	}
	return fmt.Errorf("%s: %w", prefix, err)
}
