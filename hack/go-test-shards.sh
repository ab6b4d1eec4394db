#!/usr/bin/env bash
# Runs one Go package's tests as N test processes side by side (shards), for
# packages whose tests mostly wait: the controller suite (internal/controller)
# spends about 0.4 of a core over its 500 s, on timers, requeues and its API
# server, and the real-guest scenarios (test/guest) wait on their QEMU
# guests. Processes, not t.Parallel: each test of these packages drives an
# operator in its process, and controller-runtime keeps process-wide state
# (its logger, its metrics registry, controller names); each process starts
# its own API server (the package's TestMain).
#
#   hack/go-test-shards.sh [-n N] [-v] [-race] [-short] [-tags T] [-timeout D] [-run REGEXP] PACKAGE
#
# The test binary is built once; its top-level tests (-test.list: tests,
# fuzz targets' seed corpora, examples; with -run, those whose names
# REGEXP matches, as go test -run reads a top-level name) are dealt out longest first, each to
# the shard with the least work so far, by the durations the last run of the
# same package and flags recorded in $HYPERFLEET_CACHE/test-durations (a
# test without one counts as their mean; the first run deals them in list
# order). -v streams every line with its shard's number; without it a
# passing shard prints one line and a failing one its whole output. The run
# fails when a shard fails or a listed test neither passed nor skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

n=2 verbose=0 timeout=60m build=() run=() tags=() only='.*'
while (($#)); do
	case $1 in
	-n) n=$2; shift 2 ;;
	-v) verbose=1; shift ;;
	# -vet=off: vet checks source, which make test's build has vetted; under
	# -race it would vet the whole tree again (Makefile, test-race).
	-race) build+=(-race -vet=off); shift ;;
	-short) run+=(-test.short); shift ;;
	-tags) tags=(-tags "$2"); shift 2 ;;
	-timeout) timeout=$2; shift 2 ;;
	-run) only=$2; shift 2 ;;
	-*) echo "go-test-shards: unknown flag $1" >&2; exit 2 ;;
	*) break ;;
	esac
done
(($# == 1)) || { echo "usage: $0 [-n N] [-v] [-race] [-short] [-tags T] [-timeout D] [-run REGEXP] PACKAGE" >&2; exit 2; }
pkg=$1
# The tags go to go list too: a package whose files all carry a build tag
# (test/guest) does not exist without it.
build+=("${tags[@]}")
dir=$(go list "${tags[@]}" -f '{{.Dir}}' "$pkg")
path=$(go list "${tags[@]}" -f '{{.ImportPath}}' "$pkg")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The test binary is linked into a cache directory kept between runs, one
# file per package and build flags: go test -c relinks only when the
# package or a dependency changed (the file's build ID says so), where a
# fresh path cost a link on every run (the controller suite's binary: 16 s
# of the linker, 5 s when up to date). The build holds the file's lock; the
# shards run a copy, so that a later build never writes a binary that runs.
bins=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}/test-binaries
mkdir -p "$bins"
bin="$bins/$(echo "$path ${build[*]}" | tr -c 'A-Za-z0-9.-' _).test"
(
	flock 9
	go test -c "${build[@]}" -o "$bin" "$pkg"
	cp "$bin" "$work/pkg.test"
) 9>"$bin.lock"
mapfile -t tests < <(cd "$dir" && "$work/pkg.test" -test.list "$only" | grep -E '^(Test|Fuzz|Example)')
if ((${#tests[@]} == 0)); then
	echo "go-test-shards: $path lists no tests matching $only" >&2
	exit 1
fi
((n > ${#tests[@]})) && n=${#tests[@]}

cache=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}/test-durations
mkdir -p "$cache"
durations="$cache/$(echo "$path ${build[*]} ${run[*]}" | tr -c 'A-Za-z0-9.-' _).tsv"

# Longest first onto the least loaded shard (durations in seconds; the
# mean for a test without one).
mapfile -t groups < <(
	{ [[ -f "$durations" ]] && cat "$durations"; printf '%s\n' "${tests[@]/#/- }"; } |
		awk -v groups="$n" -f hack/longest-first.awk
)

# why repeats a failed shard's test lines (file:line lines and their
# continuations, panics, --- FAIL lines) after its whole output: a failing
# controller test ends with its operator's log and the manager's shutdown
# lines, which push the message out of the last lines a CI log shows. Log
# lines that are JSON (an operator's), continuation lines that are, the
# operator log's tail and rapid's replayed draws are left out (the line
# naming the whole log's file stays); of more than 80 lines, the first and
# the last 40 are shown.
why() {
	echo "== why shard $s failed (the test lines of its output above, without the operator's log):"
	awk '
		/^ +[A-Za-z0-9_.-]+\.go:[0-9]+: / {
			keep = ($0 !~ /\[rapid\] draw|operator log tail|\.go:[0-9]+: \{"/); more = 12
			if (keep) line[++n] = $0
			next
		}
		/^(--- FAIL|panic:|FAIL)/ { line[++n] = $0; keep = 0; next }
		keep && more > 0 && /^        / && $0 !~ /^ +\{"/ { line[++n] = $0; more--; next }
		{ keep = 0 }
		END {
			for (i = 1; i <= n; i++) {
				if (n > 80 && i == 41) { printf "... %d lines ...\n", n - 80; i = n - 40; continue }
				print line[i]
			}
		}
	' "$1"
}

pids=()
start=$SECONDS
for s in "${!groups[@]}"; do
	count=$(tr '|' '\n' <<<"${groups[s]}" | wc -l)
	((verbose)) && echo "== $path shard $s: ${groups[s]//|/, }"
	(
		cd "$dir"
		if ((verbose)); then
			"$work/pkg.test" -test.v -test.count=1 -test.timeout "$timeout" "${run[@]}" -test.run "^(${groups[s]})\$" 2>&1 |
				tee "$work/out-$s.log" | sed -u "s/^/[shard $s] /"
		else
			if "$work/pkg.test" -test.v -test.count=1 -test.timeout "$timeout" "${run[@]}" -test.run "^(${groups[s]})\$" >"$work/out-$s.log" 2>&1; then
				echo "ok  	$path (shard $s of ${#groups[@]}: $count tests)	$((SECONDS - start))s"
			else
				cat "$work/out-$s.log"
				why "$work/out-$s.log"
				echo "FAIL	$path (shard $s of ${#groups[@]})"
				exit 1
			fi
		fi
	) &
	pids+=($!)
done

failed=0
for s in "${!pids[@]}"; do
	if ! wait "${pids[s]}"; then
		echo "== $path shard $s failed"
		failed=1
	fi
done
for t in "${tests[@]}"; do
	if ! grep -qE -- "^--- (PASS|SKIP): $t " "$work"/out-*.log; then
		echo "== $path: $t did not pass"
		failed=1
	fi
done
# What each top-level test took, for the next run's deal; the recorded
# durations of tests this run left out (-run) are kept.
grep -hE '^--- (PASS|FAIL|SKIP): [^ /]+ \(' "$work"/out-*.log |
	sed -E 's/^--- [A-Z]+: ([^ ]+) \(([0-9.]+)s\).*/\2 \1/' >"$work/ran.tsv"
{
	cat "$work/ran.tsv"
	if [[ -f "$durations" ]]; then awk 'NR == FNR { ran[$2] = 1; next } !($2 in ran)' "$work/ran.tsv" "$durations"; fi
} >"$durations.tmp" && mv "$durations.tmp" "$durations"
exit "$failed"
