//go:build linux

package snapshot

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// VerifiedCache remembers the artifacts this host verified in full, by
// the identity and times of their files (device, inode, size, mtime and
// ctime), the way a build tool or git's index trusts a file whose stat is
// unchanged. A restore of an unchanged artifact then skips reading every
// byte of its RAM and disk again: each fork of one base read all of it.
//
// What it still catches: any change made through the file system (a
// write, a truncation, a file replaced or moved in) changes the ctime,
// which no unprivileged process can set back, so the next restore
// verifies in full and refuses the damage. What it does not catch is a
// change below the file system (the medium flipping a bit); validate_snapshot
// always verifies in full for that.
type VerifiedCache struct {
	// Dir holds one record per artifact, named by its metadata digest.
	// It must be the caller's own: a record there vouches for artifacts.
	Dir string
	// Settle, if set, is how long before a verification a file must
	// have last changed for the result to be recorded, beyond what its
	// stamp needs anyway (FileStamp.ClearAt). The tests use it.
	Settle time.Duration
	// Max is how many records are kept (the oldest go first); default 256.
	Max int
	// Log hears of a record that could not be written: that costs only
	// the next restore's time, so it never fails a verification.
	Log *slog.Logger
}

func stampOf(st *unix.Stat_t) FileStamp {
	return FileStamp{
		Dev: st.Dev, Ino: st.Ino, Size: st.Size,
		MtimeNS: st.Mtim.Nano(), CtimeNS: st.Ctim.Nano(),
	}
}

// StatStamp is the stamp of the file at path now.
func StatStamp(path string) (FileStamp, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileStamp{}, err
	}
	return stampOf(&st), nil
}

// maxStampRecord bounds a record read back: a handful of files.
const maxStampRecord = 64 << 10

// DefaultVerifiedCacheDir is where nether keeps its records: beside the
// kernel and image caches setup uses ($NETHER_CACHE, else the user's
// cache directory), in verified/.
func DefaultVerifiedCacheDir() (string, error) {
	if d := os.Getenv("NETHER_CACHE"); d != "" {
		return filepath.Join(d, "verified"), nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(d, "nether", "verified"), nil
}

func (c *VerifiedCache) max() int {
	if c.Max <= 0 {
		return 256
	}
	return c.Max
}

func (c *VerifiedCache) record(metaSum [32]byte) string {
	return filepath.Join(c.Dir, hex.EncodeToString(metaSum[:]))
}

// usable reports whether Dir is a directory of ours that nobody else can
// write: a record there is trusted, so a directory another user can
// write into is not used at all.
func (c *VerifiedCache) usable() error {
	var st unix.Stat_t
	if err := unix.Lstat(c.Dir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("%s is not a directory", c.Dir)
	}
	if int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return fmt.Errorf("%s is not this user's own directory (uid %d, mode %o)", c.Dir, st.Uid, st.Mode&0o777)
	}
	return nil
}

// remembers reports whether a record says the artifact with metaSum was
// verified while its files were exactly stamps.
func (c *VerifiedCache) remembers(metaSum [32]byte, stamps map[string]FileStamp) bool {
	if c == nil || c.usable() != nil {
		return false
	}
	f, err := os.OpenFile(c.record(metaSum), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxStampRecord {
		return false
	}
	var have map[string]FileStamp
	if err := json.NewDecoder(f).Decode(&have); err != nil {
		return false
	}
	if len(have) != len(stamps) {
		return false
	}
	for name, s := range stamps {
		if h, ok := have[name]; !ok || h != s {
			return false
		}
	}
	return true
}

// remember records a verification that began at start, unless a file
// changed too close to it (FileStamp.ClearAt, Settle).
func (c *VerifiedCache) remember(metaSum [32]byte, stamps map[string]FileStamp, start time.Time) {
	if c == nil {
		return
	}
	if err := c.write(metaSum, stamps, start); err != nil && c.Log != nil {
		c.Log.Warn("could not record a verified snapshot; its next restore verifies it again", "dir", c.Dir, "err", err)
	}
}

func (c *VerifiedCache) write(metaSum [32]byte, stamps map[string]FileStamp, start time.Time) error {
	for _, s := range stamps {
		if start.Before(s.ClearAt()) || start.Before(time.Unix(0, max(s.CtimeNS, s.MtimeNS)).Add(c.Settle)) {
			return nil // changed too recently to tell a later change apart
		}
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return err
	}
	if err := c.usable(); err != nil {
		return err
	}
	b, err := json.Marshal(stamps)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(c.Dir, ".record-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.record(metaSum))
	}
	if err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return c.prune()
}

// prune keeps the newest Max records.
func (c *VerifiedCache) prune() error {
	entries, err := os.ReadDir(c.Dir)
	if err != nil || len(entries) <= c.max() {
		return err
	}
	type aged struct {
		name string
		mod  time.Time
	}
	var recs []aged
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			recs = append(recs, aged{e.Name(), info.ModTime()})
		}
	}
	slices.SortFunc(recs, func(a, b aged) int { return b.mod.Compare(a.mod) })
	var errs []error
	for _, r := range recs[min(len(recs), c.max()):] {
		if err := os.Remove(filepath.Join(c.Dir, r.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
