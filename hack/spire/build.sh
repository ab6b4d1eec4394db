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
# `make test-spire`. The first build takes about 4 minutes on 2 cores
# (docs/testing.md, "SPIRE"); its progress is printed to stderr.
#
# The binaries link only the plugins the test world configures: SPIRE's
# plugin catalogs (pkg/server/catalog and pkg/agent/catalog) are tables
# that link every built-in plugin, and with them the AWS, Azure and Google
# SDKs and Kubernetes' client, more than half of the build's packages
# (2,342 to 1,096). The build copies the module and puts the files of
# _overlay/ (named .go.in, so that no Go command of this repository reads
# them) in place of nine of those tables: the join_token and tpm_devid node
# attestors, the disk and memory key managers, the unix workload attestor,
# and no upstream authority, notifier, bundle publisher, credential
# composer or SVID store. The sql datastore, the APIs, the CA and the
# agent's cache, everything the tests exercise, are upstream's. A plugin not
# built in fails at start with SPIRE's error for an unknown built-in
# (TestSlimBuildRefusesUnlinkedPlugins in test/spiretest).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

version=$(go list -m -f '{{.Version}}' github.com/spiffe/spire)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
source "$here/../module-overlay.sh"
# The key names the overlay's hash too: another overlay is another build.
dir="$cache_root/spire/spire-${version}_slim-$(overlay_hash "$here/_overlay")_$(go env GOOS)-$(go env GOARCH)"

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
# A fixed directory (the lock above makes the build the only one): the
# binaries record the replacement's path (go version -m), so a fixed one
# keeps two builds of the same overlay byte for byte the same.
tmp="$dir/.build"
rm -rf "$tmp"
mkdir "$tmp"
trap 'rm -rf "$tmp"' EXIT

# A copy of the module with the catalog tables replaced by ours
# (hack/module-overlay.sh), built from a copy of this module (its go.mod
# and go.sum: the versions of SPIRE's dependencies stay this module's) that
# replaces github.com/spiffe/spire with it.
overlay_module "github.com/spiffe/spire@$version" "$here/_overlay" "$tmp/src"
mkdir "$tmp/mod"
cp "$here/go.mod" "$here/go.sum" "$tmp/mod/"
cd "$tmp/mod"
# Without the caller's GOFLAGS (CI sets -mod=readonly and -trimpath for the
# repository's own module; -trimpath is given below).
export GOFLAGS=
go mod edit -replace "github.com/spiffe/spire=$tmp/src"

cmds=(github.com/spiffe/spire/cmd/spire-server github.com/spiffe/spire/cmd/spire-agent)
# As SPIRE's own Makefile does: the version that `spire-server --version`
# reports (without the leading v); without it the binaries say
# <version>-dev-unk.
ld="-s -w -X github.com/spiffe/spire/pkg/common/version.gittag=${version#v}"
total=$(go list -deps "${cmds[@]}" | wc -l)

echo "Building spire-server and spire-agent $version (the test world's plugins only) into $dir (the first build takes about 4 minutes on 2 cores)" >&2
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
