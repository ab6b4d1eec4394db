#!/usr/bin/env bash
# Runs the test packages that drive operators again and again under CPU
# contention, and prints each test's failures: a flaky test is a bug whose
# cause a single run rarely shows, and contention (more test processes than
# cores, each with its own API server and operators) is what shifts the
# timings a test may wrongly depend on (docs/testing.md, "Stress").
#
#   hack/test-stress.sh                 # make test-stress
#   STRESS_COUNT=10 STRESS_PROCS=4 STRESS_PKGS="./internal/controller ./test/e2e:e2e" hack/test-stress.sh
#   STRESS_RUN='TestA|TestB' hack/test-stress.sh   # only the tests -run would select
#
# STRESS_PKGS lists packages, each optionally with its build tags after a
# colon. Each package's test binary is built once, then run STRESS_COUNT
# times, STRESS_PROCS runs at once (default: twice the cores). Every run's
# output is kept under STRESS_OUT; at the end a table gives, per failed
# test, how many runs it failed in and the logs of those runs. Exit status
# 1 when any run failed, with the failures listed; a run that fails with no
# --- FAIL line (a panic, a timeout) is listed by its log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

count=${STRESS_COUNT:-10}
procs=${STRESS_PROCS:-$(($(nproc) * 2))}
pkgs=${STRESS_PKGS:-./internal/controller ./test/failsafe ./test/e2e:e2e}
only=${STRESS_RUN:-.}
timeout=${STRESS_TIMEOUT:-60m}
out=${STRESS_OUT:-$(mktemp -d "${TMPDIR:-/tmp}/hyperfleet-stress.XXXXXX")}
mkdir -p "$out"

echo "== stress: $count runs of each of $pkgs, $procs at once on $(nproc) cores; logs in $out"
for spec in $pkgs; do
	pkg=${spec%%:*} tags=
	[[ $spec == *:* ]] && tags=${spec#*:}
	name=$(go list ${tags:+-tags "$tags"} -f '{{.ImportPath}}' "$pkg" | sed 's#^github.com/hyperfleet/hyperfleet/##')
	dir=$(go list ${tags:+-tags "$tags"} -f '{{.Dir}}' "$pkg")
	slug=${name//\//_}
	go test -c ${tags:+-tags "$tags"} -o "$out/$slug.test" "$pkg"
	start=$SECONDS
	# One run: its log is kept, and a line says how it ended. Each run is
	# a session of its own (setsid), whose every process is killed when the
	# run ends: a test binary that dies without its cleanups (a
	# -test.timeout panic, a signal) leaves the kube-apiserver and etcd it
	# started running, and every later run would share the cores with them.
	# The session, not the process group: envtest starts each server in a
	# process group of its own.
	seq 1 "$count" | xargs -P "$procs" -I{} bash -c '
		cd "$1" || exit 1
		setsid "$2" -test.v -test.count=1 -test.timeout "$3" -test.run "$4" >"$5-run{}.log" 2>&1 &
		pid=$!
		wait "$pid"
		rc=$?
		pkill -KILL -s "$pid" 2>/dev/null
		if [[ $rc == 0 ]]; then
			echo "   $6 run {}: ok"
		else
			echo "   $6 run {}: FAIL ($5-run{}.log)"
		fi
	' _ "$dir" "$out/$slug.test" "$timeout" "$only" "$out/$slug" "$name" || true
	echo "-- $name: $count runs in $((SECONDS - start))s"
done

# The table: each failed test (top-level or subtest), in how many runs,
# and those runs' logs; then runs that failed without a --- FAIL line.
for log in "$out"/*-run*.log; do
	[[ -e $log ]] || continue
	grep -qE '^(--- FAIL|FAIL|panic:)' "$log" || continue
	tests=$(grep -oE -- '--- FAIL: [^ ]+' "$log" | sed 's/^--- FAIL: //' | sort -u || true)
	for t in ${tests:-"(no-FAIL-line:a-panic-or-timeout)"}; do echo "$t $log"; done
done | awk '{ n[$1]++; logs[$1] = logs[$1] " " $2 } END { for (t in n) printf "%s failed in %d run(s):%s\n", t, n[t], logs[t] }' | sort >"$out/failures.txt"
if [[ -s "$out/failures.txt" ]]; then
	echo "== failures (test, runs, logs):"
	cat "$out/failures.txt"
	exit 1
fi
echo "== no failure in $count runs of each package"
