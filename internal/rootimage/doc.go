// Package rootimage builds the default guest's root file system image: a
// Debian 12 (bookworm) userland from deb.debian.org, made by mmdebstrap
// (variant minbase plus DefaultPackages and any extras), finished for the
// guest (user nether, uid and gid 1000; /tmp 1777; empty mount points /data
// 0777, /dev, /proc, /sys, /run, /etc/nether; regular /etc/hostname and
// /etc/hosts for the agent to rewrite; no apt caches or lists, man pages or
// documentation but the licences), and written as one file system image.
//
// Images are cached outside the work tree (~/.cache/nether/rootfs), one
// directory per Recipe.Key: the SHA-256 of the builder version, suite,
// mirror, sorted package list, format and the mmdebstrap and mkfs options.
// An entry holds rootfs.img and rootfs.json (Manifest) and is reused only
// while the image's length and digest match its manifest; it is built in a
// temporary directory and renamed into place, so an interrupted build leaves
// nothing that looks valid. Build then hard-links (or copies) the image into
// the output directory (build/guest) with its manifest.
//
// # Why erofs, uncompressed
//
// Measured on the development machine (2 host cores, no KVM) for the same
// userland: the guest kernel 6.1.0-57 under QEMU TCG (pc machine, 1 vCPU,
// 512 MiB), the image attached as a read-only raw virtio-blk drive, busybox
// as PID 1. "cold" is the first chroot /mnt python3 -c 'import sqlite3'
// after boot and mount, "warm" the runs after it; medians of 10 boots (5
// for the two also-rans), with min-max, since the host ran other work.
// mmdebstrap took 35-44 s per build (5 builds) whatever the format.
//
//	format            mkfs    image     mount   cold python        warm
//	erofs             0.4 s   122.5 MiB 0.01 s  1.08 s (0.83-1.59) 0.37 s
//	erofs lz4         0.8 s    77.5 MiB 0.02 s  1.16 s (1.05-1.65) 0.38 s
//	erofs lz4hc       4.5 s    71.7 MiB 0.01 s  1.26 s (0.94-1.88) 0.38 s
//	ext4 (no journal) 0.5 s   192 MiB*  0.04 s  1.21 s (0.88-1.60) 0.34 s
//	squashfs lz4      0.9 s    64.0 MiB 0.03 s  1.33 s (1.13-1.82) 0.35 s
//	squashfs zstd    10.0 s    41.0 MiB 0.04 s  1.56 s (1.19-2.38) 0.39 s
//	squashfs gzip    12.3 s    45.3 MiB 0.03 s  2.09 s (1.49-2.30) 0.38 s
//
//	* sized to the tree plus 10% and 32 MiB; 139 MiB allocated (sparse).
//
// A cold start is what a sandbox pays, and under TCG every byte the guest
// decompresses costs emulated instructions: uncompressed erofs had the
// fastest cold import, the fastest mount and the fastest mkfs. The sizes
// differ more than the times, but the image is read-only and shared by
// every sandbox on the host (one file, one page cache), so its 122 MiB are
// paid once per machine; squashfs zstd is a third of that and 0.5 s slower
// on every cold start. With KVM the compressed formats' cost shrinks and
// the choice may be worth measuring again; --format keeps the others a flag
// away. The warm figures do not tell the formats apart.
//
// On method: a "cold" run after echo 3 > /proc/sys/vm/drop_caches took
// 2.7-3.8 s on every format, more than the first run after boot; TCG then
// re-translates code in reused guest pages, so only first runs are counted.
package rootimage
