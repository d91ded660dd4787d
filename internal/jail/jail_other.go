//go:build !linux

package jail

import (
	"fmt"
	"io"
	"os"
)

// Jail is unavailable off Linux: the confinement relies on openat2.
type Jail struct{}

// Open always fails off Linux.
func Open(dir string) (*Jail, error) {
	return nil, fmt.Errorf("transfer jail: pinning directory %q: %w", dir, ErrUnsupported)
}

func (j *Jail) Dir() string             { return "" }
func (j *Jail) Protect(names ...string) {}
func (j *Jail) ProtectFD(fd int) error  { return nil }
func (j *Jail) Close() error            { return nil }

func (j *Jail) OpenRead(rel string) (*os.File, error) {
	return nil, fmt.Errorf("transfer jail: opening %q for reading: %w", rel, ErrUnsupported)
}

func (j *Jail) Create(rel string, perm os.FileMode) (*AtomicFile, error) {
	return nil, fmt.Errorf("transfer jail: creating %q: %w", rel, ErrUnsupported)
}

// AtomicFile is unavailable off Linux.
type AtomicFile struct{}

func (a *AtomicFile) Name() string                        { return "" }
func (a *AtomicFile) File() *os.File                      { return nil }
func (a *AtomicFile) Write(p []byte) (int, error)         { return 0, ErrUnsupported }
func (a *AtomicFile) ReadFrom(r io.Reader) (int64, error) { return 0, ErrUnsupported }
func (a *AtomicFile) Commit() error                       { return ErrUnsupported }
func (a *AtomicFile) Abort() error                        { return nil }

func (j *Jail) OpenParent(rel string) (*os.File, string, error) { return nil, "", ErrUnsupported }
