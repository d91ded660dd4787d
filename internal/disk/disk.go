// Package disk prepares a sandbox's persistent disk on the host: a new
// file is created sparse and formatted ext4 once, an existing one is
// checked (ext4, or a copy-on-write layer nether made, large enough,
// writable) and never reformatted, and every disk is locked for the life
// of the sandbox that uses it, so two live sandboxes cannot open one file.
//
// Nothing here writes a file it did not create: a check that fails leaves
// the file as it was.
package disk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
)

// Format is how a disk file stores its blocks.
type Format string

const (
	// Raw: the file is the block device, byte for byte (a disk nether
	// created, or one a platform made with mkfs.ext4).
	Raw Format = "raw"
	// QCOW2: a copy-on-write layer over a snapshot's disk (a fork's disk).
	QCOW2 Format = "qcow2"
)

// Info describes a disk file that passed the checks.
type Info struct {
	Path   string
	Format Format
	Size   int64 // the block device's size in bytes (qcow2: its virtual size)
	Fresh  bool  // created and formatted by this Prepare
}

// Superblock facts of ext4 (Documentation/filesystems/ext4): the
// superblock is the 1024 bytes from byte 1024; s_magic is at 0x38 in it,
// and the feature words at 0x5C (compat), 0x60 (incompat) and 0x64
// (ro_compat).
const (
	sbOffset     = 1024
	sbLen        = 1024
	sbMagicOff   = 0x38
	sbIncompat   = 0x60
	sbCompat     = 0x5C
	sbROCompat   = 0x64
	ext4Magic    = 0xEF53
	incompatExts = 0x40 // EXTENTS: what sets ext4 apart from ext2/ext3
	compatJournl = 0x4  // HAS_JOURNAL
	qcow2Magic   = "QFI\xfb"
)

// What the kernel checks of a superblock before it mounts one, and
// refuses: the block size (s_log_block_size, 0x18), the block count
// (s_blocks_count_lo at 0x4, _hi at 0x150 with the 64BIT feature)
// against the device, and, with METADATA_CSUM, the checksum type (0x175)
// and the CRC32C of the superblock up to s_checksum (0x3FC).
const (
	sbLogBlockSize  = 0x18
	sbBlocksLo      = 0x4
	sbBlocksHi      = 0x150
	sbChecksumType  = 0x175
	sbChecksum      = 0x3FC
	incompat64Bit   = 0x80
	roCompatCsum    = 0x400
	maxLogBlockSize = 6 // 64 KiB blocks
	csumCRC32C      = 1
)

// sniff reads what a disk file is: raw ext4, qcow2, or neither. A raw
// ext4 file whose superblock the guest's kernel would refuse is an
// unusableError.
func sniff(f *os.File) (Format, int64, error) {
	var b [sbOffset + sbLen]byte
	n, err := f.ReadAt(b[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return "", 0, err
	}
	if n >= 32 && string(b[:4]) == qcow2Magic {
		// The qcow2 header: the virtual size is the big-endian uint64 at
		// byte 24.
		return QCOW2, int64(binary.BigEndian.Uint64(b[24:32])), nil
	}
	if n < sbOffset+0x68 || binary.LittleEndian.Uint16(b[sbOffset+sbMagicOff:]) != ext4Magic {
		return "", 0, errNotExt4
	}
	incompat := binary.LittleEndian.Uint32(b[sbOffset+sbIncompat:])
	compat := binary.LittleEndian.Uint32(b[sbOffset+sbCompat:])
	if incompat&incompatExts == 0 || compat&compatJournl == 0 {
		return "", 0, errExt23
	}
	st, err := f.Stat()
	if err != nil {
		return "", 0, err
	}
	if n < len(b) {
		return "", 0, &unusableError{fmt.Sprintf("the file ends at byte %d, inside its superblock", n)}
	}
	if err := checkSuperblock(b[sbOffset:], st.Size()); err != nil {
		return "", 0, err
	}
	return Raw, st.Size(), nil
}

// unusableError is an ext4 superblock the kernel would refuse to mount:
// written over, or of a file cut short.
type unusableError struct{ why string }

func (e *unusableError) Error() string { return "is not a usable ext4 file system: " + e.why }

// checkSuperblock checks sb, the 1024 bytes of an ext4 superblock, as the
// kernel does before it mounts it on a device of size bytes.
func checkSuperblock(sb []byte, size int64) error {
	le := binary.LittleEndian
	if le.Uint32(sb[sbROCompat:])&roCompatCsum != 0 {
		if t := sb[sbChecksumType]; t != csumCRC32C {
			return &unusableError{fmt.Sprintf("its superblock names checksum type %d, not crc32c (written over?)", t)}
		}
		// The kernel's crc32c, seeded with ~0 and not inverted after:
		// the complement of the standard one.
		if want, got := le.Uint32(sb[sbChecksum:]), ^crc32.Checksum(sb[:sbChecksum], crc32.MakeTable(crc32.Castagnoli)); want != got {
			return &unusableError{fmt.Sprintf("its superblock's checksum is %#08x, its bytes sum to %#08x (written over?)", want, got)}
		}
	}
	logBS := le.Uint32(sb[sbLogBlockSize:])
	if logBS > maxLogBlockSize {
		return &unusableError{fmt.Sprintf("its superblock's block size (log %d) is out of range (written over?)", logBS)}
	}
	blocks := uint64(le.Uint32(sb[sbBlocksLo:]))
	if le.Uint32(sb[sbIncompat:])&incompat64Bit != 0 {
		blocks |= uint64(le.Uint32(sb[sbBlocksHi:])) << 32
	}
	bs := uint64(1024) << logBS
	if blocks > uint64(size)/bs {
		return &unusableError{fmt.Sprintf("its superblock counts %d blocks of %d bytes (%d MiB), the file holds %d MiB (truncated?)",
			blocks, bs, blocks*bs/MiB, size/MiB)}
	}
	return nil
}

var (
	errNotExt4 = errors.New("is not an ext4 file system (no ext4 superblock)")
	errExt23   = errors.New("is an ext2 or ext3 file system, not ext4 with a journal")
)

// NeverRepairs ends the refusal of a damaged disk: what the user can do.
const NeverRepairs = "nether never repairs a disk: check it on the host (e2fsck), or point disk = at another file"

// MiB is a mebibyte, the unit of disk_size_mb.
const MiB = 1 << 20

// checkExisting checks an existing disk file, open read-write as f,
// without writing it.
func checkExisting(f *os.File, path string, sizeMB int) (Info, error) {
	format, size, err := sniff(f)
	var unusable *unusableError
	switch {
	case errors.Is(err, errNotExt4), errors.Is(err, errExt23):
		return Info{}, fmt.Errorf("disk %s %w; nether formats only the disks it creates, so point disk = at a new path or an ext4 image", path, err)
	case errors.As(err, &unusable):
		return Info{}, fmt.Errorf("the disk %s %w; %s", path, err, NeverRepairs)
	case err != nil:
		return Info{}, fmt.Errorf("reading disk %s: %w", path, err)
	}
	if want := int64(sizeMB) * MiB; size < want {
		return Info{}, fmt.Errorf("disk %s holds %d MiB and disk_size_mb asks for %d; nether never resizes an existing disk: grow it yourself (truncate, then resize2fs) or lower disk_size_mb",
			path, size/MiB, sizeMB)
	}
	return Info{Path: path, Format: format, Size: size}, nil
}

// FormatOf reads which format a disk file nether checked or made is in,
// from its first bytes: QCOW2 for a layer, else Raw.
func FormatOf(path string) (Format, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("disk %s: %w", path, err)
	}
	defer f.Close()
	if format, _, err := sniff(f); err == nil && format == QCOW2 {
		return QCOW2, nil
	}
	return Raw, nil
}
