//go:build !linux

package rootimage

import (
	"context"
	"errors"
	"io"
)

// errUnsupported: the image is built with mmdebstrap, mkfs and Linux mounts.
var errUnsupported = errors.New("building a root image needs Linux")

// ExecTools cannot run off Linux.
type ExecTools struct{ Output io.Writer }

// Check implements Tools.
func (ExecTools) Check(Recipe) error { return errUnsupported }

// Bootstrap implements Tools.
func (ExecTools) Bootstrap(context.Context, Recipe, string) error { return errUnsupported }

// MakeFS implements Tools.
func (ExecTools) MakeFS(context.Context, Recipe, string, string) error { return errUnsupported }

func checkMakeFS(Format) error { return errUnsupported }
func checkShell(string) error  { return errUnsupported }
func extractLayers(context.Context, string, []layerSource, int64) (ExtractStats, error) {
	return ExtractStats{}, errUnsupported
}

// ExtractStats counts what an extraction wrote and left out.
type ExtractStats struct {
	Entries, Devices, Other, Whiteouts int
	Bytes                              int64
}

func lockDir(context.Context, string) (func(), error) { return nil, errUnsupported }
func unmountBelow(string) error                       { return errUnsupported }
func owner(string) (int, int, error)                  { return 0, 0, errUnsupported }
