// Package jail confines host-side file transfers (__put__ sources, __get__
// destinations, __snapshot__/__park__ outputs) to one directory, the
// transfer jail, pinned by a file descriptor when nether starts.
//
// The confinement is enforced when a file is opened, not only when its name
// is checked: every path is resolved relative to the pinned directory fd
// with symlinks refused at every component, so a symlink swapped into the
// path between a check and the open cannot redirect I/O outside the jail
// (TOCTOU), and renaming or replacing the jail directory after Open does
// not move the jail either.
package jail

import (
	"errors"
	"fmt"
	"strings"
)

// Refusal reasons. Errors returned by this package wrap one of these (or
// the underlying system error) so callers can classify them with
// errors.Is; the message always names the path and the operation.
var (
	ErrInvalidPath = errors.New("invalid path")
	ErrEscape      = errors.New("path escapes the transfer jail")
	ErrSymlink     = errors.New("symbolic link in path refused")
	ErrIsDir       = errors.New("is a directory")
	ErrNotRegular  = errors.New("not a regular file")
	ErrUnsupported = errors.New("transfer jail is only supported on Linux")
	ErrFinished    = errors.New("file already committed or aborted")
	ErrProtected   = errors.New("nether's own file; transfers may not touch it")
)

// artifactMarker is the file every committed snapshot artifact holds, and
// partialInfix what the name of one being written contains: a transfer
// never writes into either.
const (
	artifactMarker = "COMMITTED"
	partialInfix   = ".partial-"
)

// protectedDir reports whether a directory component names an artifact
// being written (".name.partial-xxxx").
func protectedDir(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, partialInfix)
}

// split validates a jail-relative path and returns its parent components
// and final name. It is purely lexical; the kernel-side resolution flags
// enforce the same rules again at open time, so this only exists to give
// clear errors for the common mistakes.
func split(rel string) (dirs []string, base string, err error) {
	switch {
	case rel == "":
		return nil, "", fmt.Errorf("%w: empty path", ErrInvalidPath)
	case strings.IndexByte(rel, 0) >= 0:
		return nil, "", fmt.Errorf("%w: path contains a NUL byte", ErrInvalidPath)
	case strings.HasPrefix(rel, "/"):
		return nil, "", fmt.Errorf("%w: absolute paths are not allowed", ErrEscape)
	case strings.HasSuffix(rel, "/"):
		return nil, "", fmt.Errorf("%w: path ends in a slash", ErrIsDir)
	}
	var parts []string
	for _, c := range strings.Split(rel, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return nil, "", fmt.Errorf("%w: \"..\" components are not allowed", ErrEscape)
		}
		parts = append(parts, c)
	}
	if len(parts) == 0 {
		return nil, "", fmt.Errorf("%w: path names the jail directory itself", ErrIsDir)
	}
	return parts[:len(parts)-1], parts[len(parts)-1], nil
}
