#!/usr/bin/env bash
# Builds HyperFleet's test-world buildkite-agent (this directory's main.go:
# the real agent's agent and api packages from the github.com/buildkite/agent/v3
# module this directory's go.mod requires, with a command line and job
# runner of its own) into a cache directory outside the repository, keyed by
# version, and prints the binary's path. A second call with the binary
# present returns at once.
#
#   hack/buildkite-agent/build.sh              # build if missing, print the path
#   BUILDKITE_AGENT=$(hack/buildkite-agent/build.sh)
#
# The Buildkite simulator's agent test
# (internal/testworld/simulator/buildkite, TestRealAgent*) runs this binary;
# the Makefile's buildkite-agent, test and test-race targets call this
# script, and .ci/run builds it in the background from the start. The whole
# agent binary does not build here (its clicommand package imports
# drjosh.dev/zzglob, which the Go module proxy refuses): see
# docs/testing.md, "The Buildkite agent".
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"
# Without the caller's GOFLAGS (CI sets -mod=readonly for the repository's
# own module; this module's go.sum is complete on its own).
export GOFLAGS=

version=$(go list -m -f '{{.Version}}' github.com/buildkite/agent/v3)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
# The directory is keyed by this main's content too, so that a change to
# main.go builds anew instead of reusing an older binary.
key=$(cat main.go go.mod go.sum | sha256sum | cut -c1-12)
dir="$cache_root/buildkite-agent/${version}_$(go env GOOS)-$(go env GOARCH)_$key"

if [[ -x "$dir/buildkite-agent" ]]; then
	echo "$dir/buildkite-agent"
	exit 0
fi

mkdir -p "$dir"
# Wait for a build already running into $dir (hack/build-lock.sh).
source "$here/../build-lock.sh"
build_lock "$dir"
if [[ -x "$dir/buildkite-agent" ]]; then
	echo "$dir/buildkite-agent"
	exit 0
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

echo "Building buildkite-agent $version into $dir (the first build takes about 8 minutes and up to 3.5 GB of memory on 2 cores)" >&2
start=$SECONDS
# Static, as the real agent's release binaries are, so that it runs in any
# guest image.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/buildkite-agent" .
echo "hack/buildkite-agent/build.sh: built in $((SECONDS - start))s" >&2
mv "$tmp/buildkite-agent" "$dir/buildkite-agent"
echo "$dir/buildkite-agent"
