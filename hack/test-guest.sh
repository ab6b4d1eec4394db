#!/usr/bin/env bash
# Runs the real-guest scenarios (test/guest, build tag guest) as
# GUEST_PARALLEL test processes side by side, the scenarios dealt out
# round-robin in the order `-test.list` gives them, so a scenario added
# later runs without being listed here. Separate processes, not t.Parallel:
# each scenario runs an operator in its test process, and controller-runtime
# keeps process-wide state (its logger, its metrics registry, controller
# names), so two worlds in one process interfere. Each guest is one QEMU
# (TCG) thread: two processes keep both cores of the CI machine busy while
# either one's operator and simulators wait on their guest.
#
# Environment: GUEST_PARALLEL (default 2), GUEST_TIMEOUT (default 45m), and
# what the tests read themselves (SPIRE_DIR, KUBEBUILDER_ASSETS,
# HF_GUEST_TIMINGS_OUT). Every line is prefixed with its process number;
# the run fails when any process fails or a listed scenario did not run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

n="${GUEST_PARALLEL:-2}"
timeout="${GUEST_TIMEOUT:-45m}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

go test -c -tags guest -o "$work/guest.test" ./test/guest/
mapfile -t tests < <(cd test/guest && "$work/guest.test" -test.list '.*' | grep '^Test')
if ((${#tests[@]} == 0)); then
	echo "test-guest: test/guest lists no tests" >&2
	exit 1
fi
((n > ${#tests[@]})) && n=${#tests[@]}

groups=()
for i in "${!tests[@]}"; do
	g=$((i % n))
	groups[g]="${groups[g]:+${groups[g]}|}${tests[i]}"
done

pids=()
for g in "${!groups[@]}"; do
	echo "== guest process $g: ${groups[g]//|/, }"
	(
		set -o pipefail
		cd test/guest
		"$work/guest.test" -test.v -test.count=1 -test.timeout "$timeout" -test.run "^(${groups[g]})\$" 2>&1 |
			tee "$work/out-$g.log" | sed -u "s/^/[guest $g] /"
	) &
	pids+=($!)
done

failed=0
for g in "${!pids[@]}"; do
	if ! wait "${pids[g]}"; then
		echo "== guest process $g failed"
		failed=1
	fi
done
# Every listed scenario must have passed in one of the processes.
for t in "${tests[@]}"; do
	if ! grep -q -- "^--- PASS: $t " "$work"/out-*.log; then
		echo "== $t did not pass"
		failed=1
	fi
done
exit "$failed"
