package rootimage

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// mergedUsrHooks is the hook directory bootstrapOptions names; it comes
// with mmdebstrap >= 1.0.
const mergedUsrHooks = "/usr/share/mmdebstrap/hooks/merged-usr"

// mkfsPackage is the Debian package of each format's mkfs.
var mkfsPackage = map[Format]string{
	FormatErofs:    "erofs-utils",
	FormatSquashfs: "squashfs-tools",
	FormatExt4:     "e2fsprogs",
}

// ExecTools runs mmdebstrap and the format's mkfs.
type ExecTools struct {
	// Output receives the programs' output as they run; nil discards it.
	// The end of it is kept for the error either way.
	Output io.Writer
}

// Check implements Tools.
func (ExecTools) Check(r Recipe) error {
	if os.Geteuid() != 0 {
		return errors.New("building the root image needs root: mmdebstrap --mode=root keeps the files' owners (run it as root or with sudo)")
	}
	for _, need := range []struct{ prog, pkg string }{
		{"mmdebstrap", "mmdebstrap"},
		{mkfsOptions[r.Format][0], mkfsPackage[r.Format]},
	} {
		if _, err := exec.LookPath(need.prog); err != nil {
			return fmt.Errorf("%s not found: install it with apt-get install %s (scripts/setup.sh does)", need.prog, need.pkg)
		}
	}
	if _, err := os.Stat(mergedUsrHooks); err != nil {
		return fmt.Errorf("mmdebstrap's merged-usr hooks are missing (%w): install Debian 12's mmdebstrap", err)
	}
	return nil
}

// checkMakeFS fails, saying what to install, when the format's mkfs is
// missing.
func checkMakeFS(f Format) error {
	prog := mkfsOptions[f][0]
	if _, err := exec.LookPath(prog); err != nil {
		return fmt.Errorf("%s not found: install it with apt-get install %s (scripts/setup.sh installs erofs-utils)", prog, mkfsPackage[f])
	}
	return nil
}

// Bootstrap implements Tools.
func (t ExecTools) Bootstrap(ctx context.Context, r Recipe, tree string) error {
	out, err := t.run(ctx, nil, "mmdebstrap", r.BootstrapArgs(tree)...)
	if ctx.Err() != nil {
		return fmt.Errorf("mmdebstrap interrupted: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("mmdebstrap of %s from %s failed (if a download failed, the mirror is unreachable): %w; it ended with:\n%s", r.Suite, r.Mirror, err, out)
	}
	return nil
}

// MakeFS implements Tools.
func (t ExecTools) MakeFS(ctx context.Context, r Recipe, tree, image string) error {
	opts := mkfsOptions[r.Format]
	if opts == nil {
		return fmt.Errorf("no mkfs for format %q", r.Format)
	}
	prog, args := opts[0], slices.Clone(opts[1:])
	var env []string
	switch r.Format {
	case FormatErofs:
		args = append(args, image, tree)
	case FormatSquashfs:
		args = append([]string{tree, image}, args...)
	case FormatExt4:
		size, inodes, err := ext4Size(tree)
		if err != nil {
			return err
		}
		f, err := os.Create(image)
		if err != nil {
			return err
		}
		err = f.Truncate(size)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("sizing %s: %w", image, err)
		}
		args = append(args, "-N", strconv.FormatInt(inodes, 10), "-d", tree, image)
		env = []string{"E2FSPROGS_FAKE_TIME=" + strconv.Itoa(imageEpoch)}
	}
	out, err := t.run(ctx, env, prog, args...)
	if ctx.Err() != nil {
		return fmt.Errorf("%s interrupted: %w", prog, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%s failed: %w; it ended with:\n%s", prog, err, out)
	}
	return nil
}

// ext4Size returns an image size and inode count that hold tree with some
// room: mkfs.ext4 -d does not grow the file system it fills.
func ext4Size(tree string) (size, inodes int64, err error) {
	var blocks int64
	err = filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		fi, err := d.Info()
		if err != nil {
			return err
		}
		blocks += (fi.Size() + 4095) / 4096
		if fi.IsDir() {
			blocks++ // directory blocks beyond the size's worth
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("measuring the tree: %w", err)
	}
	size = blocks*4096*11/10 + 32<<20 // 10% and 32 MiB for metadata
	return size &^ (1<<20 - 1), inodes + inodes/5 + 1024, nil
}

// run runs prog and returns the end of its output. On cancellation it sends
// SIGTERM, not SIGKILL: mmdebstrap then unmounts what it mounted in the
// tree and removes its temporary files.
func (t ExecTools) run(ctx context.Context, env []string, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = append(programEnv(), env...)
	tail := &tailBuffer{max: 4 << 10}
	var w io.Writer = tail
	if t.Output != nil {
		w = io.MultiWriter(tail, t.Output)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err := cmd.Run()
	return tail.String(), err
}

// programEnv is this process's environment without SOURCE_DATE_EPOCH, in
// a fixed locale. With SOURCE_DATE_EPOCH set, python's byte-compilation
// writes .pyc files checked by hashing their source on every import, and
// mkfs.erofs and mksquashfs stamp every file with it, which breaks the
// timestamp check of the ordinary .pyc files (each import would compile).
func programEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SOURCE_DATE_EPOCH=") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C.UTF-8")
}

// tailBuffer keeps the last max bytes written to it, whole lines where it
// can.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 2*t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	b := t.b
	if len(b) > t.max {
		b = b[len(b)-t.max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return strings.TrimRight(string(b), "\n")
}

// lockDir takes an exclusive lock on dir/.lock, waiting for another build
// (another clone's setup) to finish, until ctx ends.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the cache's lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("locking the cache: %w", err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another build's lock on %s: %w", dir, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// unmountBelow detaches every mount at or below dir, deepest first.
func unmountBelow(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("listing mounts: %w", err)
	}
	defer f.Close()
	var below []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			below = append(below, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("listing mounts: %w", err)
	}
	slices.SortFunc(below, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range below {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("unmounting %s before removing %s: %w", mp, dir, err)
		}
	}
	return nil
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// owner returns the uid and gid of p itself (not a symlink's target).
func owner(p string) (uid, gid int, err error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return 0, 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("%s: no owner in its stat", p)
	}
	return int(st.Uid), int(st.Gid), nil
}
