package session

import (
	"os"
	"syscall"

	"github.com/nethersandbox/nether/internal/guestimage"
)

// sameStamp reports whether fi is the file a manifest stamp describes:
// same inode, size and modification time. (Stamp paths may be relative to
// wherever setup ran, so the path is not compared.)
func sameStamp(st guestimage.FileStamp, fi os.FileInfo) bool {
	sys, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Ino == sys.Ino && st.Size == fi.Size() && st.MTime == fi.ModTime().UnixNano()
}
