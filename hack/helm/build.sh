#!/usr/bin/env bash
# Builds the helm CLI from its Go module (helm.sh/helm/v3) into a cache
# directory outside the repository, keyed by version, and prints the
# binary's path. A second call with the binary present returns at once.
#
#   hack/helm/build.sh              # build if missing, print the path
#   HELM=$(hack/helm/build.sh)
#   HELM_VERSION=v3.21.4 hack/helm/build.sh
#
# The chart's tests (test/chart) run this binary; the Makefile's helm target
# and `make test` call this script, and so does .ci/run before `make test`.
set -euo pipefail

version=${HELM_VERSION:-v3.22.0}
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
dir="$cache_root/tools/helm-${version}_$(go env GOOS)-$(go env GOARCH)"

if [[ -x "$dir/helm" ]]; then
	echo "$dir/helm"
	exit 0
fi

mkdir -p "$dir"
# Wait for a build already running into $dir (hack/build-lock.sh).
source "$(dirname "${BASH_SOURCE[0]}")/../build-lock.sh"
build_lock "$dir"
if [[ -x "$dir/helm" ]]; then
	echo "$dir/helm"
	exit 0
fi
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# Outside any module, and without the caller's GOFLAGS (CI sets
# -mod=readonly for the repository's own module), so that nothing here
# reads or changes the repository's go.mod.
cd "$tmp"
export GOFLAGS=

# As helm's own Makefile does: the version `helm version` reports, and the
# Kubernetes version that `helm template` and `helm lint` assume without a
# cluster (.Capabilities.KubeVersion), taken from the client-go release the
# module requires (client-go v0.X.Y is Kubernetes 1.X).
gomod=$(go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
client_go=$(sed -n 's/^[[:space:]]*k8s\.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$gomod" | head -n 1)
if [[ -z "$client_go" ]]; then
	echo "hack/helm/build.sh: cannot find k8s.io/client-go in $gomod" >&2
	exit 1
fi
ld="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.metadata="
ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
	ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done

echo "Building helm $version into $dir (the first build takes about 2 minutes on 2 cores)" >&2
CGO_ENABLED=0 GOBIN="$tmp" go install -trimpath -ldflags "$ld" "helm.sh/helm/v3/cmd/helm@$version"
mv "$tmp/helm" "$dir/helm"
echo "$dir/helm"
