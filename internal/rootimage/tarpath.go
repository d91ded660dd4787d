package rootimage

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// The checks on the names in an archive, before anything is written. They
// are lexical: they look at the names alone. What the names meet on disk
// (a symlink the archive placed earlier, say) is the extractor's to check,
// as it goes.

// errUnsafeEntry is matched (errors.Is) by every refusal of an archive
// entry's name or link target, so a caller can tell hostile input from a
// failing disk.
var errUnsafeEntry = errors.New("unsafe archive entry")

// unsafeError is such a refusal; its message is its own.
type unsafeError struct{ msg string }

func (e *unsafeError) Error() string        { return e.msg }
func (e *unsafeError) Is(target error) bool { return target == errUnsafeEntry }

func unsafef(format string, args ...any) error {
	return &unsafeError{fmt.Sprintf(format, args...)}
}

// entryPath returns the name of an archive entry as a clean path relative
// to the root ("." for the root itself): "./usr//bin/" is "usr/bin". It
// refuses an empty name, a NUL byte, an absolute name and any ".."
// component, rather than strip or resolve them: an archive holding one was
// not made by exporting a root file system, and guessing what it meant is
// how extractors have written outside their root.
func entryPath(name string) (string, error) {
	switch {
	case name == "":
		return "", unsafef("an entry has an empty name")
	case strings.IndexByte(name, 0) >= 0:
		return "", unsafef("entry %q has a NUL byte in its name", name)
	case name[0] == '/':
		return "", unsafef("entry %q is an absolute path (an exported root file system names its files relative to the root)", name)
	}
	parts := make([]string, 0, strings.Count(name, "/")+1)
	for _, p := range strings.Split(name, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			return "", unsafef("entry %q has a .. component, which would reach outside the root", name)
		}
		parts = append(parts, p)
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}

// checkSymlink refuses a symlink at entry (a clean relative path, as
// entryPath returns) whose target climbs out of the root: a relative
// target with more ".." than the link has directories above it. An
// absolute target is allowed: it is resolved inside the guest's root, and
// the extractor never follows links.
func checkSymlink(entry, target string) error {
	switch {
	case target == "":
		return unsafef("symlink %q has an empty target", entry)
	case strings.IndexByte(target, 0) >= 0:
		return unsafef("symlink %q has a NUL byte in its target", entry)
	case target[0] == '/':
		return nil
	}
	depth := strings.Count(entry, "/") // the directories above the link
	if entry == "." {
		depth = 0
	}
	for _, p := range strings.Split(target, "/") {
		switch p {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return unsafef("symlink %q -> %q points outside the root", entry, target)
			}
		default:
			depth++
		}
	}
	return nil
}

// hardlinkTarget returns the clean path of a hard link's target, which a
// tar archive names like any entry, relative to the root; one that is
// absolute or climbs with ".." would link a file from outside the root.
func hardlinkTarget(entry, linkname string) (string, error) {
	p, err := entryPath(linkname)
	if err != nil {
		return "", unsafef("hard link %q -> %q points outside the root", entry, linkname)
	}
	if p == "." {
		return "", unsafef("hard link %q links the root directory", entry)
	}
	return p, nil
}

// whiteout says what an OCI layer's entry name (a clean relative path,
// as entryPath returns) means for the layers below it: ".wh..wh..opq" in
// a directory hides everything the lower layers put there (opaque),
// ".wh.NAME" hides NAME. Other names are ordinary files. A whiteout that
// names no file of its directory (".wh.", ".wh..") or one outside it
// (".wh...") is refused: removing ".." would remove the directory above
// the layer's tree.
func whiteout(p string) (dir, hidden string, opaque, ok bool, err error) {
	dir, base := "", p
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		dir, base = p[:i], p[i+1:]
	}
	if dir == "" {
		dir = "."
	}
	if !strings.HasPrefix(base, whiteoutPrefix) {
		return "", "", false, false, nil
	}
	if base == whiteoutOpaque {
		return dir, "", true, true, nil
	}
	hidden = base[len(whiteoutPrefix):]
	switch {
	case hidden == "" || hidden == ".":
		return "", "", false, false, unsafef("whiteout %q names no file", p)
	case hidden == "..":
		return "", "", false, false, unsafef("whiteout %q names %q, which is outside its directory", p, path.Join(dir, hidden))
	case strings.ContainsAny(hidden, "/\x00"):
		return "", "", false, false, unsafef("whiteout %q names no file of its directory", p)
	}
	return dir, hidden, false, true, nil
}

// The OCI image spec's whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)
