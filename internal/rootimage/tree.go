package rootimage

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The guest's user, created by the customize hooks of bootstrapOptions.
const (
	UserName = "nether"
	UserID   = 1000
	GroupID  = 1000
	UserHome = "/home/nether"
)

// homeOwner is who must own UserHome: the user. Tests that cannot chown,
// not being root, set it to themselves.
var homeOwner = [2]int{UserID, GroupID}

// mountPoints are the directories the guest mounts over; they are emptied,
// so nothing in the image hides under a mount. mmdebstrap leaves device
// nodes in /dev and /run/lock in /run.
var mountPoints = []struct {
	path string
	mode os.FileMode
}{
	{"dev", 0o755},
	{"proc", 0o555},
	{"sys", 0o555},
	{"run", 0o755},
	{"data", 0o777}, // the workload's files, whichever user it runs as
	{"etc/nether", 0o755},
}

// garbage is what apt and dpkg leave that the image does not need. Each is
// a glob below the tree; the directories themselves stay, as apt expects.
var garbage = []string{
	"var/cache/apt/*",
	"var/lib/apt/lists/*",
	"var/cache/debconf/*-old",
	"var/cache/ldconfig/aux-cache",
	"var/log/apt/*",
	"var/log/dpkg.log",
	"var/log/alternatives.log",
	"var/log/bootstrap.log",
	// path-exclude keeps dpkg from unpacking these, but mmdebstrap
	// extracts the essential packages before dpkg reads its options.
	"usr/share/man/*",
	"usr/share/info/*",
}

// hostsFile is the image's /etc/hosts. The agent rewrites it, and
// /etc/hostname, at boot on the writable overlay; both are regular files
// so that it can.
const hostsFile = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"

// finishTree turns mmdebstrap's tree into the guest's root: mount points,
// /tmp, the host files the agent rewrites, the user's home, and no caches.
func finishTree(tree string) error {
	for _, g := range garbage {
		matches, err := filepath.Glob(filepath.Join(tree, g))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	// Documentation, except the licences (see bootstrapOptions).
	docs, err := filepath.Glob(filepath.Join(tree, "usr/share/doc/*"))
	if err != nil {
		return err
	}
	for _, d := range docs {
		if err := keepOnly(d, "copyright"); err != nil {
			return err
		}
	}
	if err := finishRoot(tree); err != nil {
		return err
	}
	return checkUser(tree)
}

// finishRoot makes tree a root the agent can switch into, whoever made
// it: empty mount points, /tmp 1777, a /root for commands to start in,
// and regular /etc/hostname and /etc/hosts for the agent to rewrite. It
// follows no symlink of the tree's: an imported tree is an archive's, and
// its tmp -> / must not make the host's / world-writable. So it refuses
// an etc that is not a directory, and replaces a mount point or tmp that
// is not one (the guest mounts over them or needs them as they are).
func finishRoot(tree string) error {
	etc := filepath.Join(tree, "etc")
	fi, err := os.Lstat(etc)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.Mkdir(etc, 0o755); err != nil {
			return err
		}
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("the image's /etc is a %s, not a directory", fileKind(fi.Mode()))
	}
	for _, mp := range mountPoints {
		if err := emptyDir(filepath.Join(tree, mp.path), mp.mode); err != nil {
			return err
		}
	}
	tmp := filepath.Join(tree, "tmp")
	if fi, err := os.Lstat(tmp); err == nil && !fi.IsDir() {
		if err := os.Remove(tmp); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	if err := chmodDir(tmp, 0o777|os.ModeSticky); err != nil {
		return err
	}
	// Commands start in /root; a symlink there is the guest's to follow.
	if _, err := os.Lstat(filepath.Join(tree, "root")); errors.Is(err, fs.ErrNotExist) {
		if err := os.Mkdir(filepath.Join(tree, "root"), 0o700); err != nil {
			return err
		}
	}
	for name, data := range map[string]string{"etc/hostname": "sandbox\n", "etc/hosts": hostsFile} {
		p := filepath.Join(tree, name)
		if err := os.RemoveAll(p); err != nil { // a symlink or directory would not be rewritable in place
			return err
		}
		if err := writeNew(p, []byte(data), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeNew creates the file p, which must not exist (nor be a symlink).
func writeNew(p string, data []byte, perm os.FileMode) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fileKind names a file's type for a message.
func fileKind(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "file"
	}
	return "special file"
}

// keepOnly removes everything in dir but the file named keep; a dir that is
// a file or symlink is removed unless it is keep.
func keepOnly(dir, keep string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return os.Remove(dir)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() != keep {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// emptyDir makes p an empty directory with mode perm. Build runs as root,
// so a directory it creates is root's like mmdebstrap's.
func emptyDir(p string, perm os.FileMode) error {
	if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
		if err := os.Remove(p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(p)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(p, e.Name())); err != nil {
			return err
		}
	}
	return chmodDir(p, perm)
}

// chmodDir sets mode bits, sticky included, that MkdirAll's umask would cut.
func chmodDir(p string, perm os.FileMode) error {
	if err := os.Chmod(p, perm); err != nil {
		return fmt.Errorf("chmod %s: %w", p, err)
	}
	return nil
}

// checkUser fails unless the hooks created the user as the guest expects:
// a failed hook would otherwise ship an image whose commands run as nobody.
func checkUser(tree string) error {
	f, err := os.Open(filepath.Join(tree, "etc/passwd"))
	if err != nil {
		return err
	}
	defer f.Close()
	want := fmt.Sprintf("%s:x:%d:%d:", UserName, UserID, GroupID)
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, want) && strings.HasSuffix(line, ":"+UserHome+":/bin/bash") {
			found = true
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !found {
		return fmt.Errorf("etc/passwd has no %s with uid %d, gid %d, home %s, shell /bin/bash", UserName, UserID, GroupID, UserHome)
	}
	uid, gid, err := owner(filepath.Join(tree, UserHome))
	if err != nil {
		return err
	}
	if uid != homeOwner[0] || gid != homeOwner[1] {
		return fmt.Errorf("%s is owned by %d:%d, not %d:%d", UserHome, uid, gid, homeOwner[0], homeOwner[1])
	}
	return nil
}
