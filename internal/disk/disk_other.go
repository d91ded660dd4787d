//go:build !linux

package disk

import (
	"context"
	"errors"
)

// Lock is a held disk (Linux only).
type Lock struct{}

// Close releases the disk.
func (*Lock) Close() error { return nil }

var errUnsupported = errors.New("persistent disks need Linux")

// Prepare is Linux only.
func Prepare(context.Context, string, int) (*Lock, Info, error) { return nil, Info{}, errUnsupported }

// LockLayer is Linux only.
func LockLayer(string) (*Lock, error) { return nil, errUnsupported }
