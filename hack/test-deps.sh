#!/usr/bin/env bash
# Installs the system programs the tests run for real: Debian's cloud-init
# (its schema validator and network-config converter check every rendered
# cloud-init). Uses apt-get, as root or through sudo. Tests never skip when
# a program is missing; they fail and point here.
set -euo pipefail

missing=()
command -v cloud-init >/dev/null || missing+=(cloud-init)
((${#missing[@]})) || exit 0

run=()
if [[ $(id -u) -ne 0 ]]; then
	command -v sudo >/dev/null || { echo "hack/test-deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
	run=(sudo)
fi
echo "hack/test-deps.sh: installing ${missing[*]} (Debian packages)" >&2
"${run[@]}" apt-get update -qq
# cloud-init is only run as a validator here; its services are never
# enabled in this environment.
DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
