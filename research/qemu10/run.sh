#!/bin/sh
# Fetches QEMU 10.0 from bookworm-backports into $QEMU10_EVAL_DIR (never
# installed: apt-get download and dpkg -x), builds a busybox initramfs
# whose /init fills 100 MiB of tmpfs and then writes 1 MiB a second, and
# runs the captures the README's "QEMU 10.0" paragraph reports. By hand:
# not part of CI. Needs busybox-static, python3 and scripts/setup.sh's
# build/guest/vmlinux.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
D=${QEMU10_EVAL_DIR:-/tmp/qemu10-eval}
export QEMU10_EVAL_DIR=$D
mkdir -p "$D/debs" "$D/root" "$D/aptstate/lists/partial" "$D/aptcache/archives/partial" "$D/initrd/bin" "$D/initrd/dev" "$D/initrd/proc" "$D/initrd/sys" "$D/initrd/t"
A="-o Dir::Etc::sourcelist=$here/backports.list -o Dir::Etc::sourceparts=- -o Dir::State::Lists=$D/aptstate/lists -o Dir::Cache=$D/aptcache"
if [ ! -x "$D/root/usr/bin/qemu-system-x86_64" ]; then
	apt-get $A update
	(cd "$D/debs" && apt-get $A download qemu-system-x86/bookworm-backports qemu-system-common/bookworm-backports qemu-system-data/bookworm-backports seabios/bookworm-backports)
	for d in "$D"/debs/*.deb; do dpkg -x "$d" "$D/root"; done
fi
"$D/root/usr/bin/qemu-system-x86_64" --version
cp /bin/busybox "$D/initrd/bin/busybox"
cp "$here/init.sh" "$D/initrd/init" && chmod 755 "$D/initrd/init"
python3 "$here/mkinitrd.py" "$D/initrd" "$D/initrd.cpio"
c="python3 $here/capture.py"
$c --qemu 7 --ram anon --tag a7-live                     # 7.2, classic stream, live
$c --qemu 10 --ram anon --tag b10-mapped --caps mapped-ram   # 10.0 mapped-ram, file:
$c --qemu 10 --ram anon --tag b10-multifd --caps mapped-ram,multifd --params '{"multifd-channels": 2}'
$c --qemu 10 --ram memfd --tag c10-memfd-ignore --caps mapped-ram,x-ignore-shared
$c --qemu 7 --ram memfd --tag a7-memfd-ignore --caps x-ignore-shared
$c --qemu 10 --ram file --tag cf10-file-ignore --caps mapped-ram,x-ignore-shared || true
