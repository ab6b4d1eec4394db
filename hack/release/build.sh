#!/usr/bin/env bash
# Builds the tools make release runs, from this directory's Go module, into a
# cache directory outside the repository, and prints that directory:
#
#   syft        an SBOM (SPDX JSON) of each image: github.com/anchore/syft
#   cosign      signs and verifies (blobs, and the image with --local-image):
#               github.com/sigstore/cosign/v2
#   sign-image  signs the multi-arch image in an OCI layout with cosign's
#               packages, offline (./sign-image; cosign sign needs a registry)
#
#   hack/release/build.sh              # build if missing, print the directory
#   RELEASE_TOOLS=$(hack/release/build.sh)
#
# The directory is keyed by the tools' versions and a hash of this module's
# go.sum and sign-image's source, so that a change to either builds anew and
# every checkout and CI run shares one build. A second call with the three
# binaries present returns at once. The first build takes about 7 minutes on
# 2 cores (syft and cosign share most of their dependencies, which is why
# they are one module); .ci/run starts it in the background at its start.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
# Without the caller's GOFLAGS (CI sets -mod=readonly for the repository's
# own module; this one is tidy by make verify).
export GOFLAGS=

syft=$(go list -m -f '{{.Version}}' github.com/anchore/syft)
cosign=$(go list -m -f '{{.Version}}' github.com/sigstore/cosign/v2)
sum=$(cat go.sum sign-image/*.go | sha256sum | cut -c1-12)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
dir="$cache_root/tools/release-syft-${syft}-cosign-${cosign}-${sum}_$(go env GOOS)-$(go env GOARCH)"

if [[ -x "$dir/syft" && -x "$dir/cosign" && -x "$dir/sign-image" ]]; then
	echo "$dir"
	exit 0
fi

mkdir -p "$dir"
# Wait for a build already running into $dir (hack/build-lock.sh).
source "$here/../build-lock.sh"
build_lock "$dir"
if [[ -x "$dir/syft" && -x "$dir/cosign" && -x "$dir/sign-image" ]]; then
	echo "$dir"
	exit 0
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "Building syft $syft, cosign $cosign and sign-image into $dir (the first build takes about 7 minutes on 2 cores)" >&2
start=$SECONDS
# The versions the tools report, as their own Makefiles set them.
CGO_ENABLED=0 go build -trimpath -o "$tmp/" \
	-ldflags "-s -w -X main.version=$syft -X sigs.k8s.io/release-utils/version.gitVersion=$cosign" \
	github.com/anchore/syft/cmd/syft github.com/sigstore/cosign/v2/cmd/cosign ./sign-image
echo "hack/release/build.sh: built in $((SECONDS - start))s" >&2
mv "$tmp/syft" "$tmp/cosign" "$tmp/sign-image" "$dir/"
echo "$dir"
