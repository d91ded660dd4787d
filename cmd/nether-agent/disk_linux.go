package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// dataDir is where the persistent disk is mounted.
const dataDir = "/data"

// dataSerial is engine.DataDiskSerial.
const dataSerial = "nether-data"

// diskError is why the persistent disk is not at /data. what is the rest
// of a sentence whose subject is the disk: the host, which knows the
// disk's file, names it (hello's DiskProblem).
type diskError struct{ what string }

func (e *diskError) Error() string { return "the persistent disk " + e.what }

// mountData mounts the persistent disk at /data, synchronously: every
// write reaches the disk (and a flush, the host's file) before the write
// returns, so what a program wrote survives the sandbox being killed.
func mountData() *diskError {
	dev, err := waitBlockDevice(dataSerial, rootDeviceWait)
	if err != nil {
		return &diskError{"did not appear in the guest: " + err.Error()}
	}
	if err := os.MkdirAll(dataDir, 0o777); err != nil {
		return &diskError{"could not be mounted: " + err.Error()}
	}
	if err := unix.Mount(dev, dataDir, "ext4", unix.MS_SYNCHRONOUS|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
		// The errno alone (EINVAL, mostly) says little: the kernel's
		// log says what it found wrong.
		what := fmt.Sprintf("is not a usable ext4 file system: the guest's kernel would not mount it (%v)", err)
		if said := kernelSaid(filepath.Base(dev)); len(said) > 0 {
			what += ": " + strings.Join(said, "; ")
		}
		return &diskError{what}
	}
	return nil
}

// maxKernelLines bounds how many of the kernel's messages about a device
// a problem quotes: the last few say why a mount failed.
const maxKernelLines = 3

// kernelSaid is the kernel's last messages about block device dev, from
// its log (/dev/kmsg), oldest first; nil if it cannot be read.
func kernelSaid(dev string) []string {
	// Raw system calls: an os.File of a non-blocking descriptor would
	// wait in the poller at the log's end instead of returning EAGAIN.
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	var records []string
	buf := make([]byte, 8192)
	for {
		// One read, one record; EPIPE: records were overwritten
		// while we read, and the next read goes on after them;
		// EAGAIN: the end of the log.
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		records = append(records, string(buf[:n]))
	}
	return aboutDevice(records, dev, maxKernelLines)
}

// aboutDevice picks, from /dev/kmsg records ("prio,seq,usec,flags;text"
// then dictionary lines that start with a space), the texts of the last
// max that are about dev: "EXT4-fs (vdb): ...", "EXT4-fs error (device
// vdb): ...", "I/O error, dev vdb, ...".
func aboutDevice(records []string, dev string, max int) []string {
	marks := []string{"(" + dev + ")", "(device " + dev + ")", "dev " + dev + ","}
	var out []string
	for _, r := range records {
		_, text, ok := strings.Cut(r, ";")
		if !ok {
			continue
		}
		text, _, _ = strings.Cut(text, "\n")
		for _, m := range marks {
			if strings.Contains(text, m) {
				out = append(out, strings.TrimSpace(text))
				break
			}
		}
	}
	if len(out) > max {
		out = out[len(out)-max:]
	}
	return out
}
