//go:build !linux

package snapshot

import (
	"context"
	"fmt"
	"os"
)

// Writer is unavailable off Linux: the format relies on openat,
// SEEK_DATA/SEEK_HOLE and renameat2.
type Writer struct{}

// Create always fails off Linux.
func Create(parent *os.File, name string) (*Writer, error) {
	return nil, fmt.Errorf("creating snapshot %q: %w", name, ErrUnsupported)
}

func (w *Writer) Dir() string { return "" }

func (w *Writer) CreateFile(name string) (*os.File, error) {
	return nil, fmt.Errorf("creating %s: %w", name, ErrUnsupported)
}

func (w *Writer) Commit(m *Meta) error { return fmt.Errorf("committing snapshot: %w", ErrUnsupported) }
func (w *Writer) Abort() error         { return nil }

// Open always fails off Linux.
func Open(path string) (*Artifact, error) { return nil, pathErr(path, ErrUnsupported) }

func (a *Artifact) Verify(ctx context.Context) error { return pathErr(a.Dir, ErrUnsupported) }

// StatStamp is not supported off Linux.
func StatStamp(path string) (FileStamp, error) { return FileStamp{}, ErrUnsupported }

// VerifiedCache is Linux's; off Linux there is nothing to verify.
type VerifiedCache struct{ Dir string }

// VerifyCached always fails off Linux.
func (a *Artifact) VerifyCached(ctx context.Context, cache *VerifiedCache) (bool, error) {
	return false, pathErr(a.Dir, ErrUnsupported)
}

// Claim is unavailable off Linux.
type Claim struct{}

func (a *Artifact) Claim() (*Claim, error) { return nil, pathErr(a.Dir, ErrUnsupported) }
func (c *Claim) Consume() error            { return ErrUnsupported }
func (c *Claim) Release() error            { return ErrUnsupported }

// ChunkSums is Linux only.
func ChunkSums(ctx context.Context, f *os.File, size int64) ([]uint32, error) {
	return nil, ErrUnsupported
}
