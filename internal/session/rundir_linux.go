package session

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// runDirPrefix names the private directories a session keeps its engine's
// sockets in while the engine starts.
const runDirPrefix = "nether-run-"

// makeRunDir creates a private run directory, holding an exclusive lock on
// it for as long as this process lives, after removing the run directories
// of nether processes that died without cleaning up (SIGKILL during a
// start): their lock is free, because the kernel drops a dead process's
// locks.
func makeRunDir(parent string, log *slog.Logger) (dir string, release func(), err error) {
	if parent == "" {
		parent = os.TempDir()
	}
	reapRunDirs(parent, log)
	dir, err = os.MkdirTemp(parent, runDirPrefix)
	if err != nil {
		return "", nil, fmt.Errorf("creating a run directory: %w", err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		os.Remove(dir)
		return "", nil, fmt.Errorf("opening run directory %s: %w", dir, err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		os.Remove(dir)
		return "", nil, fmt.Errorf("locking run directory %s: %w", dir, err)
	}
	// The lock lives as long as fd: a reaper in another nether sees the
	// directory as live until release, or until this process dies.
	release = func() {
		os.RemoveAll(dir)
		unix.Close(fd)
	}
	return dir, release, nil
}

// reapAfter keeps a reaper away from a directory another nether has just
// made and not yet locked.
const reapAfter = 10 * time.Second

// reapRunDirs removes run directories whose owner is gone.
func reapRunDirs(parent string, log *slog.Logger) {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), runDirPrefix) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		if fi, err := e.Info(); err != nil || time.Since(fi.ModTime()) < reapAfter {
			continue
		}
		fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			// Nobody holds it: its nether died. Remove it while we hold
			// the lock, so two reapers never race a live owner.
			if rerr := os.RemoveAll(dir); rerr == nil {
				log.Info("removed the run directory of a nether that died", "dir", dir)
			}
		} else if !errors.Is(err, unix.EWOULDBLOCK) {
			log.Debug("checking a run directory", "dir", dir, "err", err)
		}
		unix.Close(fd)
	}
}
