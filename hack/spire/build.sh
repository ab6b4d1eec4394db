#!/usr/bin/env bash
# Builds the real spire-server and spire-agent from the github.com/spiffe/spire
# module that this directory's go.mod requires into a cache directory outside
# the repository, keyed by version, and prints that directory. A second call
# with both binaries present returns at once.
#
#   hack/spire/build.sh              # build if missing, print the directory
#   SPIRE_DIR=$(hack/spire/build.sh)
#
# The SPIRE tests (test/spiretest) run these binaries; the Makefile's spire
# and test-spire targets call this script, and so does .ci/run before
# `make test-spire`. The first build takes about 15 minutes and up to 4 GB of
# memory on 2 cores (docs/testing.md); its progress is printed to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

version=$(go list -m -f '{{.Version}}' github.com/spiffe/spire)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
dir="$cache_root/spire/spire-${version}_$(go env GOOS)-$(go env GOARCH)"

if [[ -x "$dir/spire-server" && -x "$dir/spire-agent" ]]; then
	echo "$dir"
	exit 0
fi

# The server's sqlite datastore (github.com/mattn/go-sqlite3) is C: the build
# needs cgo and a C compiler.
export CGO_ENABLED=1
cc=$(go env CC)
if ! command -v "${cc%% *}" >/dev/null; then
	echo "hack/spire/build.sh: the sqlite datastore needs cgo, and the C compiler '$cc' is not installed (Debian: apt-get install gcc)" >&2
	exit 1
fi

mkdir -p "$dir"
# Wait for a build already running into $dir (hack/build-lock.sh).
source "$here/../build-lock.sh"
build_lock "$dir"
if [[ -x "$dir/spire-server" && -x "$dir/spire-agent" ]]; then
	echo "$dir"
	exit 0
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cmds=(github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent)
# As SPIRE's own Makefile does: the version that `spire-server --version`
# reports (without the leading v); without it the binaries say
# <version>-dev-unk.
ld="-s -w -X github.com/spiffe/spire/pkg/common/version.gittag=${version#v}"
total=$(go list -deps "${cmds[@]}" | wc -l)

echo "Building spire-server and spire-agent $version into $dir (the first build takes about 15 minutes and up to 4 GB of memory on 2 cores)" >&2
start=$SECONDS
# go build -v names each package as it compiles it (cached ones are not
# named); every 100th is reported as progress, and every other line (the
# compiler's errors) is passed through.
go build -v -trimpath -ldflags "$ld" -o "$tmp/" "${cmds[@]}" 2>&1 |
	awk -v total="$total" -v start="$start" '
		/^[^ \t:]+$/ {
			n++
			if (n % 100 == 0) {
				printf "hack/spire/build.sh: %d of at most %d packages compiled\n", n, total > "/dev/stderr"
				fflush("/dev/stderr")
			}
			next
		}
		{ print > "/dev/stderr"; fflush("/dev/stderr") }
	'
echo "hack/spire/build.sh: built in $((SECONDS - start))s" >&2
mv "$tmp/spire-server" "$tmp/spire-agent" "$dir/"
echo "$dir"
