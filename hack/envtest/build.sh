#!/usr/bin/env bash
# Builds the real kube-apiserver, etcd and kubectl (and the kustomize CLI
# kubectl's version embeds) from their Go modules into a cache directory
# outside the repository, keyed by version, and prints that directory. A
# second call with the binaries present returns at once. kubectl and
# kustomize run the command blocks of docs/install.md as written
# (test/deploy, docs_test.go).
#
#   hack/envtest/build.sh            # build if missing, print the directory
#   KUBEBUILDER_ASSETS=$(hack/envtest/build.sh)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

k8s_version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
etcd_version=$(go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
# The key names go.sum's hash too: the module's other requirements are kept
# at the operator module's versions (so that the packages both use compile
# once; test/repo, buildcache_test.go), and a binary built from other versions is another
# build.
deps=$(sha256sum go.sum | cut -c1-12)
dir="$cache_root/envtest/kube-apiserver-${k8s_version}_etcd-${etcd_version}_deps-${deps}_$(go env GOOS)-$(go env GOARCH)"

if [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" && -x "$dir/kubectl" && -x "$dir/kustomize" ]]; then
	echo "$dir"
	exit 0
fi

mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The version variables are what `kube-apiserver --version` and /version
# report; without them the server says v0.0.0-master and clients that gate
# features on the server version misbehave.
major=${k8s_version#v}; major=${major%%.*}
minor=${k8s_version#v*.}; minor=${minor%%.*}
# The release's tag time from the module proxy stands in for the build date so
# that the binaries are reproducible.
info=$(go mod download -json k8s.io/kubernetes@"$k8s_version" | sed -n 's/.*"Info": "\(.*\)".*/\1/p')
build_date=$(sed -n 's/.*"Time": *"\([^"]*\)".*/\1/p' "$info")
build_date=${build_date:-1970-01-01T00:00:00Z}
kv=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kv+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	kv+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

kustomize_version=$(go list -m -f '{{.Version}}' sigs.k8s.io/kustomize/kustomize/v5)
echo "Building kube-apiserver and kubectl $k8s_version, etcd $etcd_version and kustomize $kustomize_version into $dir (the first build takes about 13 minutes on 2 cores)" >&2
export CGO_ENABLED=0
go build -trimpath -ldflags "-s -w$kv" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
go build -trimpath -ldflags "-s -w$kv" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kustomize/api/provenance.version=${kustomize_version}" -o "$tmp/kustomize" sigs.k8s.io/kustomize/kustomize/v5
go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${etcd_version}" -o "$tmp/etcd" ./etcd
mv "$tmp/kube-apiserver" "$tmp/kubectl" "$tmp/kustomize" "$tmp/etcd" "$dir/"
echo "$dir"
