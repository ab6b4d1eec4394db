#!/usr/bin/env bash
# Builds (or finds cached) every tool the tests and checks use, one after
# the other, with a progress line per tool: what it is, whether it was
# already cached or how long its build took, and where it is. On a fresh
# machine this is the long part of the first `make test` (about 75 minutes
# on 2 cores, docs/testing.md, "Cold run"); run it once, in the background,
# and every later step only checks that the binaries are there.
#
#   hack/tools.sh            # called by make tools, with GOLANGCI_LINT and
#                            # CONTROLLER_GEN set to the Makefile's paths
#
# Each build script keeps its own cache key (the tool's version and the
# inputs of its build) under $HYPERFLEET_CACHE and its own lock, so a step
# that needs a tool while this runs waits for it rather than building it
# twice.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

: "${GOLANGCI_LINT:?set by make tools}" "${CONTROLLER_GEN:?set by make tools}"

# name | command printing the tool's path (or directory) as its last line
tools=(
	"kube-apiserver and etcd (envtest)|hack/envtest/build.sh"
	"helm|hack/helm/build.sh"
	"controller-gen|make -s $CONTROLLER_GEN >&2 && echo $CONTROLLER_GEN"
	"golangci-lint|make -s $GOLANGCI_LINT >&2 && echo $GOLANGCI_LINT"
	"external-dns|hack/external-dns/build.sh"
	"buildkite-agent (test world)|hack/buildkite-agent/build.sh"
	"syft, cosign and sign-image (release)|hack/release/build.sh"
	"spire-server and spire-agent|hack/spire/build.sh"
	"the real-guest image (Debian, QEMU)|hack/test-deps.sh --guest >&2 && go run ./hack/guest-image | sed -n 's/^ *\"disk\": \"\(.*\)\",\{0,1\}$/\1/p'"
)

failed=0
for i in "${!tools[@]}"; do
	name=${tools[i]%%|*} cmd=${tools[i]#*|}
	start=$SECONDS
	log=$(mktemp)
	if out=$(bash -c "$cmd" 2>"$log" | tail -n 1); then
		took=$((SECONDS - start))
		how="built in ${took}s"
		((took < 3)) && how="cached"
		printf '[%d/%d] %s: %s -> %s\n' $((i + 1)) ${#tools[@]} "$name" "$how" "$out"
	else
		printf '[%d/%d] %s: FAILED after %ds:\n' $((i + 1)) ${#tools[@]} "$name" $((SECONDS - start))
		tail -n 20 "$log"
		failed=1
	fi
	rm -f "$log"
done
exit "$failed"
