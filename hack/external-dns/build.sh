#!/usr/bin/env bash
# Builds the real external-dns from its Go module (sigs.k8s.io/external-dns)
# into a cache directory outside the repository, keyed by version, and prints
# the binary's path. A second call with the binary present returns at once.
#
#   hack/external-dns/build.sh              # build if missing, print the path
#   EXTERNAL_DNS=$(hack/external-dns/build.sh)
#   EXTERNAL_DNS_VERSION=v0.20.0 hack/external-dns/build.sh  # _overlay/ must fit its factories
#
# The external-dns end-to-end test (internal/controller,
# TestExternalDNSRegistration) runs this binary against the test's API server
# and a real BIND; the Makefile's external-dns, test and test-race targets
# call this script, and .ci/run builds it in the background from the start.
#
# The module is large (every DNS provider's SDK: AWS, Azure, Google, ...):
# only its main package is built, with -trimpath, as the main module of a copy
# of it (none of it enters the operator's go.mod), the copy with two
# files of ours (_overlay/, named .go.in so that the operator's module, which
# lacks external-dns, never builds or vets them; the build here compiles
# them) in place of the provider and registry
# factories, whose tables link every provider's SDK: only the
# rfc2136 provider and the txt and noop registries are linked in, and any
# other --provider or --registry fails at start. Everything else, the
# flags, sources, plan, registry, provider and controller loop, is
# upstream's. Half of the upstream build's source is the providers' SDKs,
# which no test uses (docs/testing.md, "external-dns"). v0.21.0 is the
# newest release that builds here: v0.22.0 needs module versions the Go
# module proxy no longer serves (403 for github.com/exoscale/egoscale/v3
# v3.1.44 and a github.com/openshift/api pseudo-version), and v0.23.0 needs
# Go 1.27 (CI runs 1.26.8).
set -euo pipefail

version=${EXTERNAL_DNS_VERSION:-v0.21.0}
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../module-overlay.sh"
# The key names the overlay's hash too: another overlay is another build.
dir="$cache_root/external-dns/${version}_rfc2136-$(overlay_hash "$here/_overlay")_$(go env GOOS)-$(go env GOARCH)"

if [[ -x "$dir/external-dns" ]]; then
	echo "$dir/external-dns"
	exit 0
fi

mkdir -p "$dir"
# Wait for a build already running into $dir (hack/build-lock.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../build-lock.sh"
build_lock "$dir"
if [[ -x "$dir/external-dns" ]]; then
	echo "$dir/external-dns"
	exit 0
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Outside any module, and without the caller's GOFLAGS (CI sets
# -mod=readonly for the repository's own module), so that nothing here
# reads or changes the repository's go.mod.
cd "$tmp"
export GOFLAGS=

# As external-dns's own Makefile does: the version `external-dns --version`
# reports.
ld="-s -w -X sigs.k8s.io/external-dns/pkg/apis/externaldns.Version=$version"

# A copy of the module with the two factory files replaced by ours
# (hack/module-overlay.sh), built as the main module, from its own go.mod
# and go.sum, as go install would.
overlay_module "sigs.k8s.io/external-dns@$version" "$here/_overlay" "$tmp/src"

echo "Building external-dns $version (rfc2136 provider only) into $dir (the first build takes about 3 minutes and 1 GB of memory on 2 cores)" >&2
start=$SECONDS
(cd "$tmp/src" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$tmp/external-dns" .)
echo "hack/external-dns/build.sh: built in $((SECONDS - start))s" >&2
mv "$tmp/external-dns" "$dir/external-dns"
echo "$dir/external-dns"
