package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Lock is a held disk: its file stays locked (flock, exclusive) until
// Close, or until the process that holds it ends, however it ends.
type Lock struct {
	f *os.File
}

// Close releases the disk.
func (l *Lock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// formatTimeout bounds mke2fs on a new, sparse file: a second for the
// sizes sandboxes use.
const formatTimeout = 2 * time.Minute

// Prepare makes path ready to be a sandbox's /data and locks it: a file
// that does not exist is created sparse, sizeMB large, and formatted ext4
// (its root directory world-writable, as /data is for every user); one
// that exists must be ext4 (or a qcow2 layer) of at least sizeMB and
// writable, and is never written. The lock is taken before anything is
// read or formatted, so a second sandbox on the same file gets a clear
// error at start, not a corrupted file system.
func Prepare(ctx context.Context, path string, sizeMB int) (*Lock, Info, error) {
	f, created, err := openOrCreate(path)
	if err != nil {
		return nil, Info{}, err
	}
	lock := &Lock{f: f}
	fail := func(err error) (*Lock, Info, error) {
		if created {
			os.Remove(path)
		}
		lock.Close()
		return nil, Info{}, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fail(fmt.Errorf("disk %s is in use by another live sandbox (its lock is held); two sandboxes cannot share a disk: give each its own disk = path", path))
		}
		return fail(fmt.Errorf("locking disk %s: %w", path, err))
	}
	if created {
		if err := format(ctx, f, path, sizeMB); err != nil {
			return fail(err)
		}
		return lock, Info{Path: path, Format: Raw, Size: int64(sizeMB) * MiB, Fresh: true}, nil
	}
	info, err := checkExisting(f, path, sizeMB)
	if err != nil {
		return fail(err)
	}
	return lock, info, nil
}

// LockLayer locks a disk layer nether made itself (a fork's copy-on-write
// layer) without checking its contents.
func LockLayer(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("opening disk layer %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("disk layer %s is in use by another live sandbox (its lock is held)", path)
		}
		return nil, fmt.Errorf("locking disk layer %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// openOrCreate opens path read-write, creating it (0600, exclusively)
// when it does not exist. A symlink is followed only for an existing file:
// a platform may point disk = at its own file through one.
func openOrCreate(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, os.ErrExist) {
		return nil, false, fmt.Errorf("creating disk %s: %w", path, err)
	}
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, false, fmt.Errorf("disk %s cannot be opened for writing: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		if err == nil {
			err = errors.New("not a regular file")
		}
		return nil, false, fmt.Errorf("disk %s: %w", path, err)
	}
	return f, false, nil
}

// format makes the new, empty file an ext4 file system: sparse (only
// what mke2fs writes takes space), with every inode table and the journal
// initialised now, so the guest's kernel has no lazy-init thread writing
// the disk behind a snapshot's back; then its root directory is made
// world-writable.
func format(ctx context.Context, f *os.File, path string, sizeMB int) error {
	if err := f.Truncate(int64(sizeMB) * MiB); err != nil {
		return fmt.Errorf("sizing new disk %s: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, formatTimeout)
	defer cancel()
	if err := run(ctx, "mke2fs", "-q", "-F", "-t", "ext4", "-m", "0", "-L", "nether-data",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0", path); err != nil {
		return fmt.Errorf("formatting new disk %s: %w", path, err)
	}
	if err := run(ctx, "debugfs", "-w", "-R", "sif / mode 040777", path); err != nil {
		return fmt.Errorf("making new disk %s world-writable: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing new disk %s: %w", path, err)
	}
	return nil
}

// run runs one of e2fsprogs' tools, which live in sbin (a non-root PATH
// may lack it), and returns its output with any failure.
func run(ctx context.Context, prog string, args ...string) error {
	bin, err := lookSbin(prog)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", prog, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func lookSbin(prog string) (string, error) {
	if p, err := exec.LookPath(prog); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		if st, err := os.Stat(d + "/" + prog); err == nil && st.Mode()&0o111 != 0 {
			return d + "/" + prog, nil
		}
	}
	return "", fmt.Errorf("%s not found: install Debian's e2fsprogs (scripts/setup.sh does)", prog)
}
