#!/usr/bin/env bash
# demo.sh: set everything up, then boot a sandbox, drive it through
# nether-ctl, snapshot it, fork it, park and wake it, printing what happens.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
repo=$PWD
ctl="$repo/bin/nether-ctl"

dir=$(mktemp -d /tmp/nether-demo-XXXXXX)
fork=$(mktemp -d /tmp/nether-demo-fork-XXXXXX)
wake=$(mktemp -d /tmp/nether-demo-wake-XXXXXX)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir" "$fork" "$wake"' EXIT
cat >"$dir/nether.conf" <<CONF
# The launch directory is the transfer jail; the console goes to console.log.
control_socket = $dir/ctl.sock
cpus = 1
ram_mb = 512
CONF

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ nether-ctl ctl.sock %s\n' "$*"; "$ctl" "$dir/ctl.sock" "$@" || printf '(exit %d)\n' "$?"; }
showin() { local d=$1; shift; printf '$ nether-ctl %s/ctl.sock %s\n' "$(basename "$d")" "$*"; "$ctl" "$d/ctl.sock" "$@" || printf '(exit %d)\n' "$?"; }
# restore DIR ARTIFACT: start a nether in DIR that restores ARTIFACT.
restore() {
	printf 'control_socket = %s/ctl.sock\nrestore = 1\nrestore_from = %s\n' "$1" "$2" >"$1/nether.conf"
	local t0=$(date +%s%N)
	(cd "$1" && exec "$repo/bin/nether" -log-level warn >"$1/nether.out" 2>&1) &
	pids+=($!)
	until [ -S "$1/ctl.sock" ]; do sleep 0.005; done
	showin "$1" 'hostname; cat /root/warm'
	echo "first command answered $(( ($(date +%s%N) - t0) / 1000000 )) ms after nether started"
}

step "boot: nether reads nether.conf from its launch directory"
start=$(date +%s%N)
(cd "$dir" && exec "$repo/bin/nether" -log-level warn >"$dir/nether.out" 2>&1) &
pid=$!
pids+=($pid)
until [ -S "$dir/ctl.sock" ]; do sleep 0.01; done
show uname -sr
echo "first command answered $(( ($(date +%s%N) - start) / 1000000 )) ms after nether started"

step "drive: commands, exit codes, files"
show __info__
show 'echo "hello from $(hostname)"; cat /proc/cpuinfo | grep -m1 "model name"'
show 'echo to stderr >&2; exit 3'
head -c 1048576 /dev/urandom >"$dir/blob.bin"
show __put__ blob.bin /tmp/blob.bin
show sha256sum /tmp/blob.bin
show __get__ /tmp/blob.bin back.bin
echo "host: $(sha256sum <"$dir/back.bin" | cut -d' ' -f1) back.bin"
show __stats__

step "snapshot: warm the guest, capture a base, keep running"
show 'echo "warmed at boot $(cat /proc/sys/kernel/random/boot_id | cut -c1-8)" > /root/warm'
show __snapshot__ base
printf 'validate_snapshot = %s/base\n' "$dir" >"$fork/nether.conf"
(cd "$fork" && "$repo/bin/nether")

step "fork: a new nether restores the base (new identity, same warm state)"
restore "$fork" "$dir/base"
showin "$fork" 'echo "only in the fork" > /root/mine; dmesg | grep -c "virtual machine fork"'
show 'hostname; cat /root/mine 2>&1'

step "park the fork, wake it elsewhere (the park is consumed)"
showin "$fork" __park__ parked
wait "${pids[-1]}" || true
grep '^\[nether\]' "$fork/nether.out"
restore "$wake" "$fork/parked"
showin "$wake" 'cat /root/mine'
ls "$fork/parked" 2>&1 || true

step "shut down: one final usage record on each nether's stdout"
showin "$wake" __shutdown__
show __shutdown__
wait || true
grep -h '^\[nether\]' "$wake/nether.out" "$dir/nether.out"
