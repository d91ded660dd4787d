#!/usr/bin/env bash
# test.sh: set everything up, then run every check and every test: gofmt,
# go vet, unit and fuzz-seed tests with the race detector, and the
# end-to-end tests against real guests under QEMU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
./scripts/setup.sh
export PATH="$PATH:/usr/local/go/bin"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './cache/*'))
if [ -n "$unformatted" ]; then
	printf 'test: gofmt needed on:\n%s\n' "$unformatted" >&2
	exit 1
fi
go vet ./...
GOOS=darwin go build -o /dev/null ./client ./cmd/nether-ctl
GOOS=darwin go build ./nexus/... ./client/... ./runner/... ./cmd/nexus
# Unit tests (fuzz targets run their seed corpora) with the race detector;
# the end-to-end suite builds its own nether and boots real guests.
go test -race -count=1 $(go list ./... | grep -v /test/e2e)
go test -count=1 -timeout 30m ./test/e2e
echo "test: all passed"
