#!/usr/bin/env bash
# setup.sh: install the host tools nether needs, build the binaries into bin/
# and the guest image into build/guest. Idempotent; a second run only
# rebuilds what changed (Go's build cache, nether-guest's manifest check).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# mke2fs and depmod live in sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || die "not root and no sudo: cannot install packages"
	SUDO=(sudo)
fi

# busybox-static replaces the dynamic busybox package; the initramfs has no
# libc, so only the static one works as /bin/busybox there.
busybox_static() {
	[ -x /bin/busybox ] || return 1
	local out
	out=$(LC_ALL=C ldd /bin/busybox 2>&1 || true) # ldd exits 1 on static binaries
	[[ $out == *"not a dynamic executable"* ]]
}

missing=()
# mmdebstrap and mkfs.erofs build the default guest's root image (nether-guest
# rootfs); its packages come from Debian's mirror, nothing else is fetched.
for tool in qemu-system-x86_64 xz mke2fs dpkg-deb apt-get depmod mmdebstrap mkfs.erofs; do
	command -v "$tool" >/dev/null || missing+=("$tool")
done
busybox_static || missing+=("static /bin/busybox")
if [ ${#missing[@]} -gt 0 ]; then
	say "installing packages (missing: ${missing[*]})"
	"${SUDO[@]}" apt-get update -qq
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		qemu-system-x86 qemu-utils busybox-static xz-utils e2fsprogs kmod mmdebstrap erofs-utils >/dev/null
	busybox_static || die "/bin/busybox is still not the static build after installing busybox-static"
else
	say "host packages present"
fi

# Go >= 1.26, from PATH or the official tarball location.
GO=$(command -v go || true)
[ -n "$GO" ] || { [ -x /usr/local/go/bin/go ] && GO=/usr/local/go/bin/go; } || true
[ -n "$GO" ] || die "Go not found (need >= 1.26 on PATH or in /usr/local/go/bin)"
gover=$("$GO" env GOVERSION) # e.g. go1.26.8
IFS=. read -r major minor _ <<<"${gover#go}"
if [ "${major:-0}" -lt 1 ] || { [ "$major" -eq 1 ] && [ "${minor:-0}" -lt 26 ]; }; then
	die "Go $gover at $GO is too old; need >= 1.26"
fi

pkgs=(./cmd/nether ./cmd/nether-ctl ./cmd/nether-guest ./cmd/nexus)
mkdir -p bin
"$GO" build -trimpath -o bin/ "${pkgs[@]}"
say "built ${pkgs[*]#./cmd/} into bin/ ($gover)"

# The agent is PID 1 in an initramfs without libc: it must be static.
CGO_ENABLED=0 "$GO" build -trimpath -ldflags='-s -w' -o bin/nether-agent ./cmd/nether-agent
say "built static bin/nether-agent"

[ -x bin/nether-guest ] || die "bin/nether-guest was not built"
# The kernel cache lives outside the work tree, so a fresh clone (and every
# CI run on this machine) reuses it; a cache/kernel left by an older setup
# is moved there once.
cache="${NETHER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nether}/kernel"
if [ -d cache/kernel ] && [ ! -e "$cache" ]; then
	mkdir -p "$(dirname "$cache")"
	mv cache/kernel "$cache"
	rmdir cache 2>/dev/null || true
	say "moved the kernel cache to $cache"
fi
bin/nether-guest build --agent bin/nether-agent --cache "$cache" --out build/guest

# The default guest's root file system: Debian 12 built by mmdebstrap into a
# cache beside the kernel's (keyed by everything that shapes the image), then
# linked into build/guest. Once built, a run only checks the image's digest.
# mmdebstrap needs root to keep the files' owners.
"${SUDO[@]}" bin/nether-guest rootfs --cache "$(dirname "$cache")/rootfs" --out build/guest
