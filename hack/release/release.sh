#!/usr/bin/env bash
# make release: builds into DIST (default dist/release) everything a release
# publishes, signs it and verifies it, offline; nothing is pushed anywhere.
#
#   DIST/bin/hyperfleet-linux-{amd64,arm64}        the operator
#   DIST/bin/hyperfleet-agent-linux-{amd64,arm64}  the in-VM agent
#   DIST/bin/hyperfleet-agent-windows-amd64.exe     the agent for Windows guests
#   DIST/image/                                    the operator image for linux/amd64
#                                                  and linux/arm64, one multi-arch
#                                                  index, and its cosign signature,
#                                                  as an OCI image layout
#   DIST/image.digest                              the index's digest
#   DIST/sbom/hyperfleet-linux-{amd64,arm64}.spdx.json
#                                                  an SBOM of each image (syft)
#   DIST/chart/hyperfleet-<version>.tgz            the chart, its image pinned to
#                                                  the index's digest
#   DIST/SHA256SUMS                                every file above but the image
#   DIST/*.sig, DIST/**/*.sig                      cosign signatures of each file
#   DIST/cosign.pub                                the key that verifies them
#
# The version is `git describe --tags --match 'v[0-9]*' --dirty`, or
# v0.0.0-g<commit>[-dirty] before the first tag; it is embedded in both
# binaries (the operator's `hyperfleet version` and hyperfleet_build_info,
# the agent's --version) and is the chart's version and appVersion.
#
# COSIGN_KEY (with COSIGN_PASSWORD) is the signing key; without it a
# throwaway key pair is generated and the release says so. IMAGE_REPOSITORY
# is the repository the chart and the signature name (default the chart's).
#
# Tools: syft, cosign and sign-image from hack/release/build.sh, helm from
# hack/helm/build.sh, podman from hack/podman/setup.sh, all cached.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

dist=${DIST:-$root/dist/release}
mkdir -p "$dist" && dist=$(cd "$dist" && pwd)
repository=${IMAGE_REPOSITORY:-ghcr.io/hyperfleet/hyperfleet}
platforms=(linux/amd64 linux/arm64)

version=$(git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || true)
if [[ -z "$version" ]]; then
	version="v0.0.0-g$(git rev-parse --short=12 HEAD)"
	[[ -z "$(git status --porcelain --untracked-files=no)" ]] || version+="-dirty"
fi
chart_version=${version#v}
# The build's timestamp is the commit's, so that the same commit builds the
# same image digest.
epoch=$(git log -1 --format=%ct)

step() { echo "== release: $*" >&2; }

tools=$(hack/release/build.sh)
helm=${HELM:-$(hack/helm/build.sh)}
CONTAINERS_CONF=$(hack/podman/setup.sh)
export CONTAINERS_CONF
# Offline: syft must not look for a newer version of itself.
export SYFT_CHECK_FOR_APP_UPDATE=false

work=$(mktemp -d)
list="localhost/hyperfleet-release:$chart_version-$$"
cleanup() {
	podman manifest rm "$list" >/dev/null 2>&1 || true
	for p in "${platforms[@]}"; do podman rmi "$list-${p#*/}" >/dev/null 2>&1 || true; done
	rm -rf "$work"
}
trap cleanup EXIT

find "$dist" -mindepth 1 -delete
mkdir -p "$dist/bin" "$dist/sbom" "$dist/chart"

step "$version: binaries"
# The version in the variables hyperfleet_build_info and the agent's
# --version report; -buildvcs=true whatever GOFLAGS says, so that the
# commit is stamped too (hyperfleet_build_info{revision}).
ld="-s -w -X github.com/hyperfleet/hyperfleet/internal/metrics.Version=$version -X main.version=$version"
for p in "${platforms[@]}"; do
	os=${p%/*} arch=${p#*/}
	for cmd in hyperfleet hyperfleet-agent; do
		CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -buildvcs=true -ldflags "$ld" \
			-o "$dist/bin/$cmd-$os-$arch" "./cmd/$cmd"
	done
done
# The agent for Windows guests (docs/windows.md), which no image carries.
CGO_ENABLED=0 GOOS=windows GOARCH=amd64 go build -trimpath -buildvcs=true -ldflags "$ld" \
	-o "$dist/bin/hyperfleet-agent-windows-amd64.exe" ./cmd/hyperfleet-agent

step "image for ${platforms[*]}"
# The build context make image stages (Containerfile), with the operator
# for every platform.
ctx="$work/context"
mkdir -p "$ctx/etc" "$ctx/agent"
for p in "${platforms[@]}"; do
	os=${p%/*} arch=${p#*/}
	mkdir -p "$ctx/$os-$arch"
	cp "$dist/bin/hyperfleet-$os-$arch" "$ctx/$os-$arch/hyperfleet"
	cp "$dist/bin/hyperfleet-agent-$os-$arch" "$ctx/agent/"
done
cp hack/image/passwd hack/image/group "$ctx/etc/"
cp LICENSE NOTICE "$ctx/"
cp "${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}" "$ctx/ca-certificates.crt"
chmod -R a+rX,go-w "$ctx"
podman manifest create "$list" >/dev/null
for p in "${platforms[@]}"; do
	# FROM scratch and no RUN: nothing is pulled and nothing runs, so the
	# foreign platform needs no emulator.
	podman build -q --platform "$p" --timestamp "$epoch" \
		--label "org.opencontainers.image.version=$version" \
		--label "org.opencontainers.image.revision=$(git rev-parse HEAD)" \
		-f Containerfile -t "$list-${p#*/}" "$ctx" >/dev/null
	podman manifest add "$list" "containers-storage:$list-${p#*/}" >/dev/null
done
podman manifest push -q --all "$list" "oci:$work/unsigned" >/dev/null

step "signing key"
key=${COSIGN_KEY:-}
if [[ -z "$key" ]]; then
	echo "release: no COSIGN_KEY: signing with a throwaway key pair; publish nothing signed with it" >&2
	export COSIGN_PASSWORD=
	(cd "$work" && "$tools/cosign" generate-key-pair >/dev/null 2>&1)
	key="$work/cosign.key"
fi
"$tools/cosign" public-key --key "$key" >"$dist/cosign.pub" 2>/dev/null

step "image signature"
digest=$("$tools/sign-image" --layout "$work/unsigned" --out "$dist/image" --key "$key" --reference "$repository")
echo "$digest" >"$dist/image.digest"

step "SBOMs"
for p in "${platforms[@]}"; do
	"$tools/syft" scan -q "oci-dir:$work/unsigned" --platform "$p" \
		--source-name "$repository" --source-version "$version" \
		-o "spdx-json=$dist/sbom/hyperfleet-${p%/*}-${p#*/}.spdx.json"
done

step "chart"
cp -r charts/hyperfleet "$work/chart"
# The image by the digest just built: the one line under image: that
# values.yaml leaves empty for it.
awk -v d="$digest" '
	/^image:/ { in_image = 1 }
	/^[^ #]/ && !/^image:/ { in_image = 0 }
	in_image && /^  digest: ""$/ { print "  digest: \"" d "\""; pinned = 1; next }
	{ print }
	END { if (!pinned) { print "release: no empty image.digest in values.yaml to pin" > "/dev/stderr"; exit 1 } }
' charts/hyperfleet/values.yaml >"$work/chart/values.yaml"
"$helm" package "$work/chart" --version "$chart_version" --app-version "$version" -d "$dist/chart" >/dev/null

step "checksums and signatures"
(cd "$dist" && find bin chart sbom -type f | LC_ALL=C sort | xargs sha256sum >SHA256SUMS)
while read -r _ f; do
	"$tools/cosign" sign-blob -y --key "$key" --tlog-upload=false --output-signature "$dist/$f.sig" "$dist/$f" >/dev/null 2>&1
done <"$dist/SHA256SUMS"
"$tools/cosign" sign-blob -y --key "$key" --tlog-upload=false --output-signature "$dist/SHA256SUMS.sig" "$dist/SHA256SUMS" >/dev/null 2>&1

step "verify"
# What a platform team runs on what it downloaded, offline (no
# transparency log: the key is the trust root).
"$tools/cosign" verify --local-image "$dist/image" --key "$dist/cosign.pub" --insecure-ignore-tlog >/dev/null 2>"$work/verify.log" ||
	{ cat "$work/verify.log" >&2; exit 1; }
for f in SHA256SUMS $(cut -d' ' -f3 "$dist/SHA256SUMS"); do
	"$tools/cosign" verify-blob --key "$dist/cosign.pub" --insecure-ignore-tlog --signature "$dist/$f.sig" "$dist/$f" >/dev/null 2>"$work/verify.log" ||
		{ echo "release: $f does not verify:" >&2; cat "$work/verify.log" >&2; exit 1; }
done
(cd "$dist" && sha256sum --quiet -c SHA256SUMS)

echo "release $version in $dist: image $repository@$digest"
