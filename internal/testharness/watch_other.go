//go:build !linux

package testharness

import (
	"errors"
	"time"
)

// DirWatch needs inotify (Linux).
type DirWatch struct{}

// WatchDir needs inotify (Linux).
func WatchDir(dir, prefix string) (*DirWatch, error) {
	return nil, errors.New("watching a directory needs inotify (Linux)")
}

// Since is never reached off Linux.
func (w *DirWatch) Since(t time.Time) ([]string, error) { return nil, nil }

// Close is never reached off Linux.
func (w *DirWatch) Close() error { return nil }
