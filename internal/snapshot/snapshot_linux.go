//go:build linux

package snapshot

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Writer builds one artifact in a hidden partial directory. Its methods
// are safe for concurrent use, though a capture normally has one driver.
type Writer struct {
	mu         sync.Mutex
	parentfd   int // O_RDONLY directory fd of the parent (fsync needs a real fd, not O_PATH)
	parentPath string
	name       string
	partial    string // entry name under parentfd that cleanup removes
	dirfd      int    // the partial directory
	done       bool   // committed or aborted: fds closed
}

// Create starts an artifact named name inside the directory parent, which
// the caller resolved safely (it may be an O_PATH fd). It refuses an
// existing name rather than replacing it: overwriting a base that forks
// are restoring from would pull their RAM out from under them.
func Create(parent *os.File, name string) (*Writer, error) {
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("creating snapshot: %w", err)
	}
	// Reopening "." gives a private fd that outlives the caller closing
	// parent and, unlike an O_PATH fd, can be fsynced.
	parentfd, err := unix.Openat(int(parent.Fd()), ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("creating snapshot %q: opening parent directory %s: %w", name, parent.Name(), err)
	}
	w := &Writer{parentfd: parentfd, parentPath: parent.Name(), name: name, dirfd: -1}
	if err := w.checkFree(); err != nil {
		unix.Close(parentfd)
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		partial := "." + name + partialInfix + randomHex(8)
		err = unix.Mkdirat(parentfd, partial, 0o700)
		if err == nil {
			w.partial = partial
			break
		}
		if !errors.Is(err, unix.EEXIST) || attempt >= 4 {
			unix.Close(parentfd)
			return nil, fmt.Errorf("creating snapshot %q: making partial directory in %s: %w", name, w.parentPath, err)
		}
	}
	w.dirfd, err = unix.Openat(parentfd, w.partial, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		// mkdir's mode is filtered by the umask; the artifact holds
		// tenant memory, so it is exactly 0700 whatever the umask.
		err = unix.Fchmod(w.dirfd, 0o700)
	}
	if err != nil {
		err = fmt.Errorf("creating snapshot %q: opening partial directory %s: %w", name, w.Dir(), err)
		w.cleanupLocked()
		return nil, err
	}
	return w, nil
}

// checkFree fails with ErrExists if name is taken (by anything, including
// a dangling symlink).
func (w *Writer) checkFree() error {
	var st unix.Stat_t
	err := unix.Fstatat(w.parentfd, w.name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil:
		return w.existsErr()
	case errors.Is(err, unix.ENOENT):
		return nil
	default:
		return fmt.Errorf("creating snapshot %q: checking %s: %w", w.name, filepath.Join(w.parentPath, w.name), err)
	}
}

func (w *Writer) existsErr() error {
	return errc(ErrExists, nil, "snapshot %q already exists; remove it or choose another path", w.name)
}

// Dir is the path of the partial directory, for tools that need a path
// (an engine writing its state by name). Only "ram" and "state" may be
// created in it.
func (w *Writer) Dir() string { return filepath.Join(w.parentPath, w.partial) }

// CreateFile creates "ram", "state" or "disk" (0600, exclusive, read-write so the
// caller may mmap or pwrite it) in the partial directory.
func (w *Writer) CreateFile(name string) (*os.File, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil, fmt.Errorf("snapshot %q: creating %s: writer already committed or aborted", w.name, name)
	}
	if !dataFileName(name) {
		return nil, fmt.Errorf("snapshot %q: creating %q: %w", w.name, name,
			errc(ErrInvalid, nil, "an artifact holds only %q, %q and %q", fileRAM, fileState, FileDisk))
	}
	fd, err := unix.Openat(w.dirfd, name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err == nil {
		if err = unix.Fchmod(fd, 0o600); err != nil {
			unix.Close(fd)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot %q: creating %s in %s: %w", w.name, name, w.Dir(), err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(w.Dir(), name)), nil
}

// Commit checksums the data files into m.Files, writes meta.json, makes
// everything durable, writes the COMMITTED marker last, and renames the
// partial directory to its final name. m.Format defaults to FormatVersion
// and m.Created to now. On any error the partial directory is removed:
// a half-written RAM image holds tenant secrets and must not linger.
func (w *Writer) Commit(m *Meta) (err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return fmt.Errorf("committing snapshot %q: writer already committed or aborted", w.name)
	}
	defer func() {
		if err != nil {
			w.cleanupLocked()
			err = fmt.Errorf("committing snapshot %q: %w", w.name, err)
		}
	}()
	if m == nil {
		return errc(ErrInvalid, nil, "no metadata")
	}
	if m.Format == 0 {
		m.Format = FormatVersion
	}
	if m.Created.IsZero() {
		m.Created = time.Now()
	}
	m.Created = m.Created.UTC()
	if err := validateHeader(m); err != nil {
		return err
	}

	files, err := w.dataFiles()
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if _, ok := files[fileState]; !ok {
		return errc(ErrInvalid, nil, "no state file was written")
	}
	if _, hasRAM := files[fileRAM]; hasRAM != (m.RAMMode == RAMFile) {
		if hasRAM {
			return errc(ErrInvalid, nil, "ram_mode is %s but a ram file was written", m.RAMMode)
		}
		return errc(ErrInvalid, nil, "ram_mode is %s but no ram file was written", m.RAMMode)
	}

	m.Files, err = checksumFiles(context.Background(), files)
	if err != nil {
		return err
	}
	if err := validateFiles(m); err != nil {
		return err
	}
	for name, f := range files {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", name, err)
		}
	}

	// Compact, not indented: the chunk list would otherwise cost a line
	// per MiB of guest RAM. (Channel is re-encoded compactly too; it is
	// JSON, so that changes no meaning.)
	meta, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding metadata: %w", err)
	}
	meta = append(meta, '\n')
	if err := writeFileAt(w.dirfd, fileMeta, meta); err != nil {
		return err
	}
	// Everything the marker vouches for must be on disk before the
	// marker is: a crash must never leave a marker over missing data.
	if err := unix.Fsync(w.dirfd); err != nil {
		return fmt.Errorf("syncing partial directory: %w", err)
	}
	if err := writeFileAt(w.dirfd, fileCommitted, []byte(markerLine(sha256.Sum256(meta)))); err != nil {
		return err
	}
	if err := unix.Fsync(w.dirfd); err != nil {
		return fmt.Errorf("syncing partial directory: %w", err)
	}

	if err := w.publishLocked(); err != nil {
		return err
	}
	if err := unix.Fsync(w.parentfd); err != nil {
		return fmt.Errorf("syncing %s after the rename: %w", w.parentPath, err)
	}
	w.closeLocked()
	return nil
}

// publishLocked renames the partial directory to its final name without
// ever replacing one that appeared since Create.
func (w *Writer) publishLocked() error {
	err := unix.Renameat2(w.parentfd, w.partial, w.parentfd, w.name, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// Filesystem without RENAME_NOREPLACE: check, then rename. A
		// non-empty directory that wins the race still cannot be
		// replaced (ENOTEMPTY).
		if err = w.checkFree(); err != nil {
			return err
		}
		err = unix.Renameat(w.parentfd, w.partial, w.parentfd, w.name)
	}
	switch {
	case err == nil:
		// From here cleanup must remove the final name: the marker is
		// there but the parent is not yet durable.
		w.partial = w.name
		return nil
	case errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY):
		return w.existsErr()
	default:
		return fmt.Errorf("renaming %s to %s: %w", w.Dir(), filepath.Join(w.parentPath, w.name), err)
	}
}

// dataFiles opens every entry of the partial directory, which must be
// only "ram" and "state", regular files; it also enforces 0600 on files a
// tool created by path.
func (w *Writer) dataFiles() (map[string]*os.File, error) {
	names, err := listDir(w.dirfd)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", w.Dir(), err)
	}
	files := make(map[string]*os.File)
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, name := range names {
		if !dataFileName(name) {
			closeAll()
			return nil, errc(ErrInvalid, nil, "unexpected file %q in %s (an artifact holds only ram, state and disk)", name, w.Dir())
		}
		f, err := openRegularAt(w.dirfd, name, unix.O_RDONLY)
		if err == nil {
			if err = unix.Fchmod(int(f.Fd()), 0o600); err != nil {
				f.Close()
			}
		}
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("opening %s: %w", name, err)
		}
		files[name] = f
	}
	return files, nil
}

// checksumFiles hashes ram and state concurrently (the RAM hashing spreads
// over the cores itself; state is one sequential sha256).
func checksumFiles(ctx context.Context, files map[string]*os.File) (map[string]FileInfo, error) {
	out := make(map[string]FileInfo, len(files))
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for name, f := range files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st unix.Stat_t
			if err := unix.Fstat(int(f.Fd()), &st); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("stat %s: %w", name, err))
				mu.Unlock()
				return
			}
			fi := FileInfo{Size: st.Size}
			var err error
			if chunked(name) {
				fi.Chunks, err = ramChunkCRCs(ctx, f, st.Size)
			} else {
				fi.SHA256, err = fileSHA256(ctx, f, st.Size)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("checksumming %s: %w", name, err))
				return
			}
			out[name] = fi
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Abort removes the partial directory. It is idempotent and a no-op after
// a successful Commit.
func (w *Writer) Abort() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return nil
	}
	if err := w.cleanupLocked(); err != nil {
		return fmt.Errorf("aborting snapshot %q: %w", w.name, err)
	}
	return nil
}

// cleanupLocked removes whatever w.partial names and closes the fds.
func (w *Writer) cleanupLocked() error {
	var err error
	if w.partial != "" {
		err = removeDirAt(w.parentfd, w.partial, w.dirfd)
		if err == nil {
			err = unix.Fsync(w.parentfd)
		}
		if err != nil {
			err = fmt.Errorf("removing %s: %w", filepath.Join(w.parentPath, w.partial), err)
		}
	}
	w.closeLocked()
	return err
}

func (w *Writer) closeLocked() {
	if w.dirfd >= 0 {
		unix.Close(w.dirfd)
		w.dirfd = -1
	}
	if w.parentfd >= 0 {
		unix.Close(w.parentfd)
		w.parentfd = -1
	}
	w.done = true
}

// removeDirAt empties the directory name (open as dirfd, or -1) under
// parentfd and removes it. Artifacts are flat, so one level suffices for
// anything this package wrote; a tool that made subdirectories gets them
// removed one level deep too.
func removeDirAt(parentfd int, name string, dirfd int) error {
	if dirfd < 0 {
		fd, err := unix.Openat(parentfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		dirfd = fd
	}
	names, err := listDir(dirfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		err := unix.Unlinkat(dirfd, n, 0)
		if errors.Is(err, unix.EISDIR) {
			err = removeDirAt(dirfd, n, -1)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removing %s: %w", n, err)
		}
	}
	if err := unix.Unlinkat(parentfd, name, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	return nil
}

func markerLine(sum [32]byte) string {
	return fmt.Sprintf("%s%d meta-sha256=%s\n", markerPrefix, FormatVersion, hex.EncodeToString(sum[:]))
}

// parseMarker returns the format version and meta sha256 a marker line
// vouches for.
func parseMarker(b []byte) (int, [32]byte, error) {
	var sum [32]byte
	line, ok := strings.CutPrefix(string(b), markerPrefix)
	if !ok || !strings.HasSuffix(line, "\n") {
		return 0, sum, errc(ErrCorrupt, nil, "COMMITTED marker is malformed")
	}
	verStr, rest, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " ")
	ver, err := strconv.Atoi(verStr)
	if !ok || err != nil {
		return 0, sum, errc(ErrCorrupt, nil, "COMMITTED marker is malformed")
	}
	if ver != FormatVersion {
		return ver, sum, nil // the caller reports the version, not a parse error
	}
	hexSum, ok := strings.CutPrefix(rest, "meta-sha256=")
	if !ok || !isHexSHA256(hexSum) {
		return 0, sum, errc(ErrCorrupt, nil, "COMMITTED marker is malformed")
	}
	hex.Decode(sum[:], []byte(hexSum))
	return ver, sum, nil
}

// Open reads and checks an artifact without hashing file contents: the
// marker and its meta digest, the format, the metadata's shape, and that
// the directory holds exactly the listed files, as regular files of
// exactly the recorded sizes. Verify checks the contents.
func Open(path string) (*Artifact, error) {
	if isPartialName(filepath.Base(filepath.Clean(path))) {
		// The marker is written inside the partial directory before the
		// rename publishes it: a capture killed between the two leaves a
		// marker that is not a commit.
		return nil, pathErr(path, errc(ErrNotCommitted, nil, "not committed: a capture that was stopped before it was renamed into place (a leftover to remove)"))
	}
	dirfd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, pathErr(path, errc(ErrNotExist, err, "no such snapshot (missing, or a park already consumed by its wake)"))
	case errors.Is(err, unix.ENOTDIR):
		return nil, pathErr(path, errc(ErrInvalid, err, "not a snapshot directory"))
	case err != nil:
		return nil, pathErr(path, fmt.Errorf("opening: %w", err))
	}
	defer unix.Close(dirfd)
	a, err := load(dirfd, path)
	if err != nil {
		return nil, pathErr(path, err)
	}
	return a, nil
}

func load(dirfd int, path string) (*Artifact, error) {
	marker, err := readSmallAt(dirfd, fileCommitted, 256)
	if errors.Is(err, unix.ENOENT) {
		if exists(dirfd, fileClaimed) {
			return nil, wokenErr()
		}
		return nil, errc(ErrNotCommitted, err, "not committed (no COMMITTED marker: the capture did not finish)")
	}
	if err != nil {
		return nil, fmt.Errorf("reading COMMITTED marker: %w", err)
	}
	ver, sum, err := parseMarker(marker)
	if err != nil {
		return nil, err
	}
	if ver != FormatVersion {
		return nil, formatErr(ver)
	}
	if exists(dirfd, fileClaimed) {
		// Both markers: a claim is mid-flight (link fallback) or was
		// interrupted. Either way the park is not free to wake.
		return nil, wokenErr()
	}

	raw, err := readSmallAt(dirfd, fileMeta, maxMetaSize)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", fileMeta, err)
	}
	if got := sha256.Sum256(raw); got != sum {
		return nil, errc(ErrCorrupt, nil, "%s does not match the COMMITTED marker (sha256 %x, marker says %x): edited or corrupted after commit",
			fileMeta, got, sum)
	}
	m, err := decodeMeta(raw)
	if err != nil {
		return nil, err
	}
	if err := checkDir(dirfd, m); err != nil {
		return nil, err
	}
	return &Artifact{Dir: path, Meta: *m, metaSum: sum}, nil
}

// decodeMeta checks the format version before anything else, so a newer
// artifact is reported as a version problem rather than as unknown fields.
func decodeMeta(raw []byte) (*Meta, error) {
	var probe struct {
		Format int `json:"format"`
	}
	if err := json.Unmarshal(raw, &probe); err != nil {
		return nil, errc(ErrCorrupt, err, "%s is not valid metadata: %v", fileMeta, err)
	}
	if probe.Format != FormatVersion {
		return nil, formatErr(probe.Format)
	}
	var m Meta
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, errc(ErrCorrupt, err, "%s is not valid metadata: %v", fileMeta, err)
	}
	if err := validateHeader(&m); err != nil {
		return nil, err
	}
	if err := validateFiles(&m); err != nil {
		return nil, err
	}
	return &m, nil
}

// checkDir checks the directory holds exactly meta.json, the marker and
// the listed files, each a regular file of the recorded size.
func checkDir(dirfd int, m *Meta) error {
	for _, name := range sortedKeys(m.Files) {
		want := m.Files[name].Size
		var st unix.Stat_t
		err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		switch {
		case errors.Is(err, unix.ENOENT):
			return errc(ErrCorrupt, err, "%s is missing", name)
		case err != nil:
			return fmt.Errorf("stat %s: %w", name, err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return errc(ErrCorrupt, nil, "%s is a symlink, not a regular file", name)
		case st.Mode&unix.S_IFMT != unix.S_IFREG:
			return errc(ErrCorrupt, nil, "%s is not a regular file", name)
		case st.Size < want:
			return errc(ErrCorrupt, nil, "%s is %d bytes, metadata says %d (truncated?)", name, st.Size, want)
		case st.Size > want:
			return errc(ErrCorrupt, nil, "%s is %d bytes, metadata says %d (extended after commit?)", name, st.Size, want)
		}
	}
	names, err := listDir(dirfd)
	if err != nil {
		return fmt.Errorf("listing directory: %w", err)
	}
	for _, name := range names {
		if _, listed := m.Files[name]; listed || name == fileMeta || name == fileCommitted {
			continue
		}
		if name == fileClaimed {
			// A wake claimed the park after we read its marker.
			return wokenErr()
		}
		return errc(ErrCorrupt, nil, "unexpected file %q (an artifact holds only its listed files, %s and %s)",
			name, fileMeta, fileCommitted)
	}
	return nil
}

func wokenErr() error {
	return errc(ErrWoken, nil, "already woken (the park was claimed by a wake; a park wakes once)")
}

// Verify hashes the contents (state sha256, ram chunk CRC32Cs with holes
// skipped) and reports the first mismatch.
func (a *Artifact) Verify(ctx context.Context) error {
	_, err := a.VerifyCached(ctx, nil)
	return err
}

// VerifyCached is Verify, except that an artifact whose files are
// unchanged since cache recorded its full verification is not read again
// (remembered is then true). A full verification that passes is recorded
// in cache. A nil cache always verifies in full.
func (a *Artifact) VerifyCached(ctx context.Context, cache *VerifiedCache) (remembered bool, err error) {
	if remembered, err = a.verify(ctx, cache); err != nil {
		return false, pathErr(a.Dir, err)
	}
	return remembered, nil
}

func (a *Artifact) verify(ctx context.Context, cache *VerifiedCache) (bool, error) {
	start := time.Now()
	dirfd, err := unix.Open(a.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("opening: %w", err)
	}
	defer unix.Close(dirfd)
	// The metadata we compare against must still be what the marker
	// vouched for at Open, or we would verify one artifact against
	// another's checksums.
	raw, err := readSmallAt(dirfd, fileMeta, maxMetaSize)
	if err != nil {
		return false, fmt.Errorf("reading %s: %w", fileMeta, err)
	}
	if sha256.Sum256(raw) != a.metaSum {
		return false, errc(ErrCorrupt, nil, "%s changed since the snapshot was opened", fileMeta)
	}
	files := make(map[string]*os.File, len(a.Meta.Files))
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	stamps := make(map[string]FileStamp, len(a.Meta.Files))
	for _, name := range sortedKeys(a.Meta.Files) {
		f, err := openRegularAt(dirfd, name, unix.O_RDONLY)
		if err != nil {
			return false, errc(ErrCorrupt, err, "opening %s: %v", name, err)
		}
		files[name] = f
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return false, fmt.Errorf("stat %s: %w", name, err)
		}
		if want := a.Meta.Files[name].Size; st.Size != want {
			return false, errc(ErrCorrupt, nil, "%s is %d bytes, metadata says %d (truncated?)", name, st.Size, want)
		}
		stamps[name] = stampOf(&st)
	}
	if cache.remembers(a.metaSum, stamps) {
		return true, nil
	}
	got, err := checksumFiles(ctx, files)
	if err != nil {
		return false, err
	}
	if st := got[fileState]; st.SHA256 != a.Meta.Files[fileState].SHA256 {
		return false, errc(ErrCorrupt, nil, "state does not match its sha256 (corrupted)")
	}
	for _, name := range []string{fileRAM, FileDisk} {
		fi, ok := a.Meta.Files[name]
		if !ok {
			continue
		}
		have := got[name].Chunks
		for i, want := range fi.Chunks {
			if have[i] != want {
				return false, errc(ErrCorrupt, nil, "%s chunk %d (offset %d) does not match its checksum (corrupted)", name, i, int64(i)*ChunkSize)
			}
		}
	}
	// The stamps were taken before the files were read: a change while
	// they were read moves the ctime past them, so the record never
	// vouches for bytes other than the ones checked.
	cache.remember(a.metaSum, stamps, start)
	return false, nil
}

// Claim is a park taken for waking.
type Claim struct {
	mu    sync.Mutex
	a     *Artifact
	dirfd int // -1 once consumed or released
}

// Claim takes a park for waking: it renames COMMITTED to CLAIMED with
// RENAME_NOREPLACE, so of any number of concurrent claimers in any number
// of processes exactly one succeeds; the rest get ErrWoken. A base cannot
// be claimed: it is meant to be restored many times.
func (a *Artifact) Claim() (*Claim, error) {
	c, err := a.claim()
	if err != nil {
		return nil, pathErr(a.Dir, fmt.Errorf("claiming park: %w", err))
	}
	return c, nil
}

func (a *Artifact) claim() (*Claim, error) {
	if a.Meta.Kind != KindPark {
		return nil, errc(ErrNotPark, nil, "kind=%s cannot be claimed (only a park is one-shot; a base is restored without claiming)", a.Meta.Kind)
	}
	dirfd, err := unix.Open(a.Dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, errc(ErrWoken, err, "no such snapshot (a park is consumed by its wake)")
	}
	if err != nil {
		return nil, fmt.Errorf("opening: %w", err)
	}
	err = renameNoReplace(dirfd, fileCommitted, fileClaimed)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EEXIST) {
		unix.Close(dirfd)
		return nil, errc(ErrWoken, err, "already claimed or woken (a park wakes once)")
	}
	if err == nil {
		// The claim must survive a host crash, or a park could wake
		// twice: once before the crash, once after.
		err = unix.Fsync(dirfd)
	}
	if err != nil {
		unix.Close(dirfd)
		return nil, err
	}
	c := &Claim{a: a, dirfd: dirfd}
	// We won the marker, but it must be the marker of the artifact we
	// opened: a directory swapped in since Open was never validated.
	marker, err := readSmallAt(dirfd, fileClaimed, 256)
	if err == nil {
		var sum [32]byte
		if _, sum, err = parseMarker(marker); err == nil && sum != a.metaSum {
			err = errc(ErrCorrupt, nil, "the park changed since it was opened")
		}
	}
	if err != nil {
		if rerr := c.Release(); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	return c, nil
}

// renameNoReplace atomically renames old to new in dirfd, failing with
// EEXIST if new exists. On filesystems without RENAME_NOREPLACE it links
// (which is exclusive) and then unlinks the old name.
func renameNoReplace(dirfd int, oldName, newName string) error {
	err := unix.Renameat2(dirfd, oldName, dirfd, newName, unix.RENAME_NOREPLACE)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	if err := unix.Linkat(dirfd, oldName, dirfd, newName, 0); err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, oldName, 0)
}

// Consume removes the park's files and directory. Call it when the guest
// resumes: an open mapping of ram keeps its pages alive, and from then on
// the park cannot be opened again.
func (c *Claim) Consume() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirfd < 0 {
		return pathErr(c.a.Dir, errc(ErrInvalid, nil, "consuming park: claim already consumed or released"))
	}
	defer func() { unix.Close(c.dirfd); c.dirfd = -1 }()
	// Data first, CLAIMED last: an interrupted consume leaves a
	// directory that Open reports as already woken, never as a park.
	for _, name := range []string{fileRAM, fileState, FileDisk, fileMeta, fileClaimed} {
		if err := unix.Unlinkat(c.dirfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return pathErr(c.a.Dir, fmt.Errorf("consuming park: removing %s: %w", name, err))
		}
	}
	if err := unix.Rmdir(c.a.Dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return pathErr(c.a.Dir, fmt.Errorf("consuming park: removing directory: %w", err))
	}
	if err := syncDir(filepath.Dir(c.a.Dir)); err != nil {
		return pathErr(c.a.Dir, fmt.Errorf("consuming park: %w", err))
	}
	return nil
}

// Release undoes the claim when the wake failed before the guest resumed,
// so the park can be woken again.
func (c *Claim) Release() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dirfd < 0 {
		return pathErr(c.a.Dir, errc(ErrInvalid, nil, "releasing park: claim already consumed or released"))
	}
	defer func() { unix.Close(c.dirfd); c.dirfd = -1 }()
	err := renameNoReplace(c.dirfd, fileClaimed, fileCommitted)
	if err == nil {
		err = unix.Fsync(c.dirfd)
	}
	if err != nil {
		return pathErr(c.a.Dir, fmt.Errorf("releasing park: %w", err))
	}
	return nil
}

func syncDir(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening %s to sync it: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// openRegularAt opens name under dirfd without following a symlink and
// insists on a regular file (a FIFO or device would hang or lie).
func openRegularAt(dirfd int, name string, flags int) (*os.File, error) {
	fd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("%s is a symlink, not a regular file: %w", name, err)
	}
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readSmallAt reads a whole regular file of at most limit bytes.
func readSmallAt(dirfd int, name string, limit int64) ([]byte, error) {
	f, err := openRegularAt(dirfd, name, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return b, nil
}

func writeFileAt(dirfd int, name string, data []byte) error {
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("setting mode of %s: %w", name, err)
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", name, err)
	}
	return f.Close()
}

func exists(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// listDir returns the entry names of the directory dirfd, via a private
// fd so the caller's fd position is untouched.
func listDir(dirfd int) ([]string, error) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics internally rather than return short)
	return hex.EncodeToString(b)
}

// partialInfix is what names a Writer's directory before its commit
// (".name.partial-<hex>"), as the jail knows it too.
const partialInfix = ".partial-"

// isPartialName says whether name is a Writer's directory before its
// commit.
func isPartialName(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, partialInfix)
}
