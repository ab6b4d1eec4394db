#!/usr/bin/env bash
# Runs go test over packages in the order of how long each took last time,
# longest first, so that the few slow packages (a chart installed and
# upgraded through helm, a provider's retry scenarios, the agent's job
# runs) start at once instead of last, where one of them alone kept the
# cores half idle for minutes: go test starts its packages' builds and
# runs in the order it is given them (docs/testing.md, "CI timings").
#
#   hack/go-test-longest-first.sh [GO TEST FLAGS ...] -- PACKAGE ...
#
# PACKAGEs are import paths (go list's). The elapsed time go test prints
# for each package ("ok <package> <seconds>s", and the same for a FAIL) is
# recorded in $HYPERFLEET_CACHE/test-durations under a name made of the
# flags, for the next run with the same flags; a package without one
# counts as their mean, and the first run keeps the given order. The
# recorded times of packages this run left out are kept. The output is go
# test's, as it comes, and so is the exit status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

flags=()
while (($#)) && [[ $1 != -- ]]; do
	flags+=("$1")
	shift
done
(($#)) || { echo "usage: $0 [GO TEST FLAGS ...] -- PACKAGE ..." >&2; exit 2; }
shift
(($#)) || { echo "go-test-longest-first: no package given" >&2; exit 2; }

cache=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}/test-durations
mkdir -p "$cache"
durations="$cache/packages_$(echo "${flags[*]}" | tr -c 'A-Za-z0-9.-' _).tsv"

# Longest first (seconds; the mean for a package without a time), the
# given order kept among equal times.
mapfile -t ordered < <(
	{ [[ -f "$durations" ]] && cat "$durations"; printf -- '- %s\n' "$@"; } |
		awk -f hack/longest-first.awk
)

out=$(mktemp)
ran="$out.ran"
next=$(mktemp "$cache/.packages.XXXXXX")
trap 'rm -f "$out" "$ran" "$next"' EXIT
rc=0
go test "${flags[@]}" "${ordered[@]}" 2>&1 | tee "$out" || rc=$?

# What each package took, for the next run's order (a cached result says
# nothing about how long the package takes, and is left out).
awk '/^(ok|FAIL)[ \t]/ && $NF ~ /^[0-9.]+s$/ { t = $NF; sub(/s$/, "", t); print t, $2 }' "$out" >"$ran"
{
	cat "$ran"
	if [[ -f "$durations" ]]; then awk 'NR == FNR { ran[$2] = 1; next } !($2 in ran)' "$ran" "$durations"; fi
} >"$next"
mv "$next" "$durations"
exit "$rc"
