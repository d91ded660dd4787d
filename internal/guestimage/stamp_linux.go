package guestimage

import (
	"os"
	"syscall"
)

// sameStamp reports whether fi is the file a manifest stamp describes:
// same inode, size and modification time. (Stamp paths may be relative to
// wherever setup ran, so the path is not compared.)
func sameStamp(st FileStamp, fi os.FileInfo) bool {
	sys, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Ino == sys.Ino && st.Size == fi.Size() && st.MTime == fi.ModTime().UnixNano()
}
