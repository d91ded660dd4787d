//go:build linux

package jail

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// resolveFlags forbids leaving the jail and following any symlink, magic
// (/proc/self/fd/N) or not. NO_SYMLINKS also covers the final component,
// so O_NOFOLLOW is belt and braces.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openat2 is a variable so tests can force the ENOSYS fallback.
var openat2 = unix.Openat2

// Jail is a pinned transfer-jail directory. Its methods are safe for
// concurrent use.
type Jail struct {
	mu        sync.RWMutex
	fd        int // O_PATH|O_DIRECTORY; -1 once closed
	path      string
	protected map[string]bool // names in the jail root that Create and OpenRead refuse
	files     map[fileID]bool // files refused wherever they are linked (ProtectFD)
}

// fileID is a file's identity, whatever names it has.
type fileID struct{ dev, ino uint64 }

// Protect makes Create and OpenRead refuse the given names in the jail's
// top directory: nether's own files (its configuration, the console log,
// its sockets), which a transfer must never replace, nor carry into the
// guest. Snapshot artifacts are always protected from writes.
func (j *Jail) Protect(names ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.protected == nil {
		j.protected = map[string]bool{}
	}
	for _, n := range names {
		j.protected[n] = true
	}
}

// ProtectFD makes Create and OpenRead refuse the file open on fd, under
// whatever name and wherever in the jail it is linked, when it is a
// regular file; other files (a pipe, /dev/null, a terminal) are not
// reachable through the jail anyway and are ignored. nether protects its
// own stdout and stderr this way: an orchestrator points them at files in
// the launch directory (nexus's nether.out, which holds the final usage
// record it bills from, and nether.log), names nether cannot know.
func (j *Jail) ProtectFD(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("transfer jail: protecting descriptor %d: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.files == nil {
		j.files = map[fileID]bool{}
	}
	j.files[fileID{uint64(st.Dev), st.Ino}] = true
	return nil
}

// protectedFile reports whether st is a file ProtectFD named.
func (j *Jail) protectedFile(st *unix.Stat_t) bool {
	j.mu.RLock()
	defer j.mu.RUnlock()
	return j.files[fileID{uint64(st.Dev), st.Ino}]
}

// Open pins dir as the transfer jail. The directory itself may be reached
// through symlinks (it is the operator's choice); everything below it may
// not.
func Open(dir string) (*Jail, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("transfer jail: pinning directory %q: %w", dir, err)
	}
	return &Jail{fd: fd, path: dir}, nil
}

// Dir returns the path the jail was opened with (for messages only: the
// jail is the pinned directory, wherever it has moved since).
func (j *Jail) Dir() string { return j.path }

// Close releases the pinned directory. Files already opened stay usable.
func (j *Jail) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fd < 0 {
		return nil
	}
	err := unix.Close(j.fd)
	j.fd = -1
	if err != nil {
		return fmt.Errorf("transfer jail: closing %q: %w", j.path, err)
	}
	return nil
}

// rootFD returns the pinned fd under a read lock; the caller must call the
// returned unlock when done with it.
func (j *Jail) rootFD() (int, func(), error) {
	j.mu.RLock()
	if j.fd < 0 {
		j.mu.RUnlock()
		return -1, nil, errors.New("jail is closed")
	}
	return j.fd, j.mu.RUnlock, nil
}

// OpenRead opens the regular file rel (relative to the jail) for reading.
func (j *Jail) OpenRead(rel string) (*os.File, error) {
	f, err := j.openRead(rel)
	if err != nil {
		return nil, fmt.Errorf("transfer jail: opening %q for reading: %w", rel, err)
	}
	return f, nil
}

func (j *Jail) openRead(rel string) (*os.File, error) {
	dirs, base, err := split(rel)
	if err != nil {
		return nil, err
	}
	if err := j.checkProtectedName(dirs, base); err != nil {
		return nil, err
	}
	root, unlock, err := j.rootFD()
	if err != nil {
		return nil, err
	}
	defer unlock()
	// O_NONBLOCK so a FIFO planted at the path cannot hang the open; it is
	// rejected by the type check below and cleared for regular files.
	fd, err := resolve(root, rel, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	if err := j.requireUnprotected(fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("clearing O_NONBLOCK: %w", err)
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// requireUnprotected refuses what fd is open on unless it is a regular
// file that is not one of nether's own (ProtectFD): the check is on the
// open file, so no name or link can stand in for it.
func (j *Jail) requireUnprotected(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if err := regular(&st); err != nil {
		return err
	}
	if j.protectedFile(&st) {
		return fmt.Errorf("%w: it is nether's own output", ErrProtected)
	}
	return nil
}

func regular(st *unix.Stat_t) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return ErrIsDir
	default:
		return ErrNotRegular
	}
}

// resolve opens rel beneath root with flags (O_CLOEXEC is always added),
// refusing symlinks at every component including the last. mode is used
// only with O_CREAT.
func resolve(root int, rel string, flags int, mode uint32) (int, error) {
	flags |= unix.O_CLOEXEC
	// No O_NOFOLLOW here: RESOLVE_NO_SYMLINKS already refuses a final
	// symlink, with ELOOP, whereas O_NOFOLLOW|O_DIRECTORY would report the
	// less helpful ENOTDIR.
	how := &unix.OpenHow{Flags: uint64(flags), Resolve: resolveFlags}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode)
	}
	fd, err := openat2(root, rel, how)
	if errors.Is(err, unix.ENOSYS) {
		fd, err = walk(root, rel, flags, mode)
	}
	if err != nil {
		return -1, classify(err)
	}
	return fd, nil
}

// walk is the pre-5.6-kernel fallback: open one component at a time with
// O_NOFOLLOW, so no symlink is ever traversed. ".." was already refused
// lexically by every caller, and is refused here again so that the walk
// can never climb out on its own.
func walk(root int, rel string, flags int, mode uint32) (int, error) {
	var parts []string
	for _, c := range strings.Split(rel, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return -1, unix.EXDEV
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return unix.Openat(root, ".", flags, mode)
	}
	cur := root
	closeCur := func() {
		if cur != root {
			unix.Close(cur)
		}
	}
	defer closeCur()
	for _, d := range parts[:len(parts)-1] {
		next, err := openNoFollow(cur, d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		closeCur()
		cur = next
	}
	return openNoFollow(cur, parts[len(parts)-1], flags, mode)
}

// openNoFollow opens one component with O_NOFOLLOW. A symlink opened with
// O_DIRECTORY fails with ENOTDIR rather than ELOOP; report it as ELOOP so
// both resolvers refuse symlinks the same way.
func openNoFollow(dirfd int, name string, flags int, mode uint32) (int, error) {
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW, mode)
	if errors.Is(err, unix.ENOTDIR) && isSymlinkAt(dirfd, name) {
		return -1, unix.ELOOP
	}
	return fd, err
}

func isSymlinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// classify maps the kernel's resolution errors onto the package's refusal
// reasons while keeping the errno reachable with errors.Is.
func classify(err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%w (%w)", ErrSymlink, err)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w (%w)", ErrEscape, err)
	case errors.Is(err, unix.EISDIR):
		return fmt.Errorf("%w (%w)", ErrIsDir, err)
	}
	return err
}

// AtomicFile is a file being written into the jail. Bytes go to a hidden
// temporary file beside the target; Commit makes them appear under the
// target name all at once, Abort makes them disappear. A reader of the
// target therefore sees either the old file or the complete new one, and
// a failed transfer (say, a half-written snapshot holding guest memory)
// never lingers under the real name.
type AtomicFile struct {
	j       *Jail
	f       *os.File
	dirfd   int // parent directory, O_RDONLY so it can be fsynced
	tmp     string
	base    string
	rel     string
	mu      sync.Mutex
	settled bool
}

// Create starts writing rel (relative to the jail) with permission bits
// perm (subject to the umask). An existing regular file at rel is replaced
// on Commit; a directory, symlink or other non-regular file there is
// refused.
func (j *Jail) Create(rel string, perm os.FileMode) (*AtomicFile, error) {
	af, err := j.create(rel, perm)
	if err != nil {
		return nil, fmt.Errorf("transfer jail: creating %q: %w", rel, err)
	}
	return af, nil
}

func (j *Jail) create(rel string, perm os.FileMode) (*AtomicFile, error) {
	dirs, base, err := split(rel)
	if err != nil {
		return nil, err
	}
	if err := j.checkProtected(dirs, base); err != nil {
		return nil, err
	}
	dirfd, _, err := j.parentFD(dirs)
	if err != nil {
		return nil, fmt.Errorf("opening parent directory: %w", err)
	}
	var mst unix.Stat_t
	if err := unix.Fstatat(dirfd, artifactMarker, &mst, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		unix.Close(dirfd)
		return nil, fmt.Errorf("%w: the directory is a snapshot artifact", ErrProtected)
	}
	if err := j.checkTarget(dirfd, base); err != nil {
		unix.Close(dirfd)
		return nil, err
	}

	var (
		fd  int
		tmp string
	)
	for attempt := 0; ; attempt++ {
		tmp = tempName(base)
		// The kernel applies the umask to perm, as os.OpenFile does.
		fd, err = resolve(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, uint32(perm.Perm()))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt == 10 {
			unix.Close(dirfd)
			return nil, fmt.Errorf("creating temporary file: %w", err)
		}
	}
	return &AtomicFile{j: j, f: os.NewFile(uintptr(fd), rel), dirfd: dirfd, tmp: tmp, base: base, rel: rel}, nil
}

// checkProtectedName refuses nether's own files by name.
func (j *Jail) checkProtectedName(dirs []string, base string) error {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if len(dirs) == 0 && j.protected[base] {
		return ErrProtected
	}
	return nil
}

// checkProtected refuses a write to nether's own files by name and into
// a snapshot being written.
func (j *Jail) checkProtected(dirs []string, base string) error {
	if err := j.checkProtectedName(dirs, base); err != nil {
		return err
	}
	for _, d := range append(dirs, base) {
		if protectedDir(d) {
			return fmt.Errorf("%w: %q is a snapshot being written", ErrProtected, d)
		}
	}
	return nil
}

// checkTarget refuses targets that rename would mishandle or that signal
// an attack: a symlink (rename would replace the link, which is harmless,
// but a planted link is a sign of tampering), a directory or a special
// file. A missing target is fine.
// nether's own output (ProtectFD) is refused under any name.
func (j *Jail) checkTarget(dirfd int, base string) error {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("checking existing target: %w", err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if j.protectedFile(&st) {
			return fmt.Errorf("%w: it is nether's own output", ErrProtected)
		}
		return nil
	case unix.S_IFLNK:
		return ErrSymlink
	case unix.S_IFDIR:
		return ErrIsDir
	default:
		return ErrNotRegular
	}
}

func tempName(base string) string {
	var b [8]byte
	if _, err := io.ReadFull(rand.Reader, b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	// Bounded so a long target name cannot push the temp name past
	// NAME_MAX (255).
	if len(base) > 200 {
		base = base[:200]
	}
	return "." + base + ".nether-tmp-" + hex.EncodeToString(b[:])
}

// Name returns the jail-relative target path.
func (a *AtomicFile) Name() string { return a.rel }

// File returns the underlying temporary file, e.g. to hand to io.Copy
// (which then uses copy_file_range/splice). Do not Close it; use Commit or
// Abort.
func (a *AtomicFile) File() *os.File { return a.f }

// Write writes to the temporary file.
func (a *AtomicFile) Write(p []byte) (int, error) { return a.f.Write(p) }

// ReadFrom lets io.Copy use the kernel fast paths of *os.File.
func (a *AtomicFile) ReadFrom(r io.Reader) (int64, error) { return a.f.ReadFrom(r) }

// Commit flushes the data to disk and renames it over the target, then
// syncs the directory so the rename itself survives a crash. On failure
// the temporary file is removed and the target is left as it was.
func (a *AtomicFile) Commit() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.settled {
		return fmt.Errorf("transfer jail: committing %q: %w", a.rel, ErrFinished)
	}
	a.settled = true
	defer unix.Close(a.dirfd)

	err := a.f.Sync()
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Re-check: a directory or special file planted since Create must
		// not be clobbered (rename over an empty directory fails anyway, but
		// say why).
		err = a.j.checkTarget(a.dirfd, a.base)
	}
	if err == nil {
		err = unix.Renameat(a.dirfd, a.tmp, a.dirfd, a.base)
	}
	if err != nil {
		unix.Unlinkat(a.dirfd, a.tmp, 0)
		return fmt.Errorf("transfer jail: committing %q: %w", a.rel, err)
	}
	if err := unix.Fsync(a.dirfd); err != nil {
		return fmt.Errorf("transfer jail: committing %q: syncing directory: %w", a.rel, err)
	}
	return nil
}

// Abort discards everything written and removes the temporary file. It is
// a no-op after Commit, so `defer af.Abort()` is the intended pattern.
func (a *AtomicFile) Abort() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.settled {
		return nil
	}
	a.settled = true
	defer unix.Close(a.dirfd)
	a.f.Close()
	if err := unix.Unlinkat(a.dirfd, a.tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("transfer jail: aborting %q: removing temporary file: %w", a.rel, err)
	}
	return nil
}

// OpenParent resolves the directory that would hold rel, with the same
// rules as every other jail path, and returns it open with rel's last
// component. Callers that build a directory tree in the jail (a snapshot
// artifact) work relative to that descriptor, so nothing can be swapped
// under them by path.
func (j *Jail) OpenParent(rel string) (*os.File, string, error) {
	dirs, base, err := split(rel)
	if err != nil {
		return nil, "", fmt.Errorf("transfer jail: %q: %w", rel, err)
	}
	dirfd, parent, err := j.parentFD(dirs)
	if err != nil {
		return nil, "", fmt.Errorf("transfer jail: opening the directory of %q: %w", rel, err)
	}
	return os.NewFile(uintptr(dirfd), filepath.Join(j.path, parent)), base, nil
}

// parentFD opens the directory made of dirs (the jail root when empty)
// beneath the pinned root, for reading and fsync.
func (j *Jail) parentFD(dirs []string) (int, string, error) {
	root, unlock, err := j.rootFD()
	if err != nil {
		return -1, "", err
	}
	defer unlock()
	parent := "."
	if len(dirs) > 0 {
		parent = strings.Join(dirs, "/")
	}
	fd, err := resolve(root, parent, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	return fd, parent, err
}
