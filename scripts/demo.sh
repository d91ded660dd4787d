#!/usr/bin/env bash
# demo.sh: set everything up, then boot a sandbox, drive it through
# nether-ctl, and shut it down, printing what happens.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
repo=$PWD
ctl="$repo/bin/nether-ctl"

dir=$(mktemp -d /tmp/nether-demo-XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
cat >"$dir/nether.conf" <<CONF
# The launch directory is the transfer jail; the console goes to console.log.
control_socket = $dir/ctl.sock
cpus = 1
ram_mb = 512
CONF

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
show() { printf '$ nether-ctl ctl.sock %s\n' "$*"; "$ctl" "$dir/ctl.sock" "$@" || printf '(exit %d)\n' "$?"; }

step "boot: nether reads nether.conf from its launch directory"
start=$(date +%s%N)
(cd "$dir" && exec "$repo/bin/nether" -log-level warn >"$dir/nether.out" 2>&1) &
pid=$!
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

step "shut down: one final usage record on nether's stdout"
show __shutdown__
wait "$pid" || true
grep '^\[nether\]' "$dir/nether.out"
