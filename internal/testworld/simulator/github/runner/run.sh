#!/bin/sh
# run.sh of the HyperFleet GitHub simulator's runner package.
#
# Runs the configured runner like the real actions/runner run.sh: connects
# (the runner becomes online and idle), long-polls for a job, runs it (its
# steps, when it has any: each with sh -c in the work folder, as this
# runner's user, until one fails, their outcome and output reported to the
# simulator; then waiting, in a long poll of its status, until the
# simulator says it completed) and, for an ephemeral runner, exits after
# that one job. POSIX sh + curl + sed + base64.
#
#   ./run.sh                             after ./config.sh
#   ./run.sh --jitconfig ENCODED_CONFIG  just-in-time runner (no config.sh)
#   ACTIONS_RUNNER_INPUT_JITCONFIG=ENCODED_CONFIG ./run.sh   the same, kept
#       out of the command line (like the real runner's ACTIONS_RUNNER_INPUT_*)
#   options: --cacert FILE; environment: HF_SIM_CA (CA file),
#   HF_SIM_POLL_WAIT (long polls, s), HF_SIM_RETRIES (attempts when the
#   server is unreachable)
#
# Exit status: 0 the job ran (ephemeral) or the runner stopped, 1 usage or
# local error, 2 refused by the server (bad credentials, runner removed),
# 3 server unreachable, 130/143 interrupted.
set -u

dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1
prog=run.sh

stamp() { date -u '+%Y-%m-%d %H:%M:%SZ'; }
die() { code=$1; shift; printf '%s: %s\n' "$prog" "$*" >&2; exit "$code"; }
usage() { sed -n '12,19p' "$dir/run.sh" | sed 's/^# \{0,1\}//'; }

cacert=${HF_SIM_CA:-}
[ -z "$cacert" ] && [ -f "$dir/sim-ca.pem" ] && cacert=$dir/sim-ca.pem
wait_s=${HF_SIM_POLL_WAIT:-20}
retries=${HF_SIM_RETRIES:-30}
maxtime=60

# api METHOD URL OUTFILE [curl args...]: prints the HTTP status (000 when
# the server could not be reached).
api() {
	m=$1 u=$2 o=$3
	shift 3
	if [ -n "$cacert" ]; then
		set -- --cacert "$cacert" "$@"
	fi
	c=$(curl -sS --connect-timeout 10 --max-time "$maxtime" -o "$o" -w '%{http_code}' -X "$m" "$@" "$u" 2>"$o.err") || c=000
	printf '%s' "$c"
}

# write_config ENCODED: decodes a GitHub-style encoded runner configuration
# (base64 JSON object of file name -> base64 content) into the runner dir.
write_config() {
	json=$(printf '%s' "$1" | base64 -d 2>/dev/null) || die 1 "the --jitconfig value is not valid base64"
	for f in .runner .credentials .credentials_rsaparams; do
		v=$(printf '%s\n' "$json" | sed -n "s/.*\"\\$f\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p")
		[ -n "$v" ] || die 1 "the --jitconfig value has no $f"
		printf '%s' "$v" | base64 -d >"$dir/$f" 2>/dev/null || die 1 "cannot decode $f of the --jitconfig value"
		chmod 600 "$dir/$f"
	done
}

# str_field KEY FILE / num_field KEY FILE read one "KEY": value line of the
# runner's JSON files.
str_field() { sed -n "s/^[[:space:]]*\"$1\"[[:space:]]*:[[:space:]]*\"\(.*\)\",\{0,1\}[[:space:]]*\$/\1/p" "$2" | head -n 1; }
num_field() { sed -n "s/^[[:space:]]*\"$1\"[[:space:]]*:[[:space:]]*\([0-9A-Za-z]*\).*/\1/p" "$2" | head -n 1; }

# --jitconfig wins over the environment, as with the real runner. The
# variable is read once and dropped, so that the job's steps do not
# inherit it.
jit=${ACTIONS_RUNNER_INPUT_JITCONFIG:-}
unset ACTIONS_RUNNER_INPUT_JITCONFIG
while [ $# -gt 0 ]; do
	case $1 in
	--jitconfig | --cacert)
		[ $# -ge 2 ] || die 1 "$1 needs a value"
		case $1 in
		--jitconfig) jit=$2 ;;
		--cacert) cacert=$2 ;;
		esac
		shift 2
		;;
	--once | --check) shift ;;
	--startuptype)
		[ $# -ge 2 ] || die 1 "$1 needs a value"
		shift 2
		;;
	-h | --help) usage; exit 0 ;;
	*) die 1 "unknown option $1 (see --help)" ;;
	esac
done

[ -n "$jit" ] && write_config "$jit"
if [ ! -f "$dir/.runner" ] || [ ! -f "$dir/.credentials" ]; then
	die 1 "the runner is not configured: run ./config.sh first, or ./run.sh --jitconfig <encoded config> (or with ACTIONS_RUNNER_INPUT_JITCONFIG set)"
fi
id=$(num_field agentId "$dir/.runner")
name=$(str_field agentName "$dir/.runner")
server=$(str_field serverUrl "$dir/.runner")
ephemeral=$(num_field ephemeral "$dir/.runner")
secret=$(str_field simRunnerSecret "$dir/.credentials")
[ -n "$id" ] && [ -n "$server" ] && [ -n "$secret" ] || die 1 "the runner configuration in $dir is incomplete"
auth="Authorization: Bearer $secret"

tmp=$(mktemp) || die 1 "cannot create a temporary file"
session=''
on_exit() {
	if [ -n "$session" ]; then
		maxtime=5
		api DELETE "$server/_runner/runners/$id/session?session=$session" "$tmp" -H "$auth" >/dev/null
	fi
	rm -f "$tmp" "$tmp.err"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# unreachable counts consecutive failures to reach the server.
fails=0
unreachable() {
	fails=$((fails + 1))
	[ "$fails" -ge "$retries" ] && die 3 "cannot reach $server after $fails attempts: $(cat "$tmp.err" 2>/dev/null)"
	sleep 1
}

connect() {
	while :; do
		maxtime=60
		code=$(api POST "$server/_runner/runners/$id/session" "$tmp" -H "$auth" --data-urlencode "os=$(uname -s)")
		case $code in
		200)
			session=$(sed -n 's/^session_id=//p' "$tmp")
			fails=0
			return 0
			;;
		401) die 2 "the server rejected the runner's credentials: $(cat "$tmp")" ;;
		404) die 2 "$(cat "$tmp")" ;;
		409)
			echo "$(stamp): $(cat "$tmp") Retrying." >&2
			unreachable
			;;
		000 | 5??) unreachable ;;
		*) die 2 "connecting failed (HTTP $code): $(cat "$tmp")" ;;
		esac
	done
}

# run_steps runs the job's steps (the job message's step= lines, base64)
# in the work folder until one fails, prints their output and reports it
# with their outcome; the simulator then completes the job.
run_steps() {
	steps=$(sed -n 's/^step=//p' "$tmp")
	[ -n "$steps" ] || return 0
	work=$(str_field workFolder "$dir/.runner")
	case $work in
	/*) ;;
	'') work=$dir/_work ;;
	*) work=$dir/$work ;;
	esac
	mkdir -p "$work" || die 1 "cannot create the work folder $work"
	log=$(mktemp) || die 1 "cannot create a temporary file"
	conclusion=success
	n=0
	for enc in $steps; do
		n=$((n + 1))
		step=$(printf '%s' "$enc" | base64 -d) || die 1 "step $n of job $job_id is not valid base64"
		if ! (cd "$work" && sh -c "$step") >>"$log" 2>&1; then
			echo "step $n failed" >>"$log"
			conclusion=failure
			break
		fi
	done
	cat "$log"
	maxtime=60
	code=$(api POST "$server/_runner/runners/$id/jobs/$job_id/result" "$tmp" -H "$auth" \
		--data-urlencode "conclusion=$conclusion" --data-urlencode "log@$log")
	rm -f "$log"
	[ "$code" = 200 ] || die 2 "job $job_id: reporting its steps failed (HTTP $code): $(cat "$tmp")"
}

run_job() {
	job_id=$(sed -n 's/^job_id=//p' "$tmp")
	job_name=$(sed -n 's/^job_name=//p' "$tmp")
	echo "$(stamp): Running job: $job_name"
	run_steps
	# The status read is a long poll: the simulator answers when the job
	# completed, or after wait_s with it still running.
	while :; do
		maxtime=$((wait_s + 30))
		code=$(api GET "$server/_runner/runners/$id/jobs/$job_id?wait=$wait_s" "$tmp" -H "$auth")
		case $code in
		200)
			fails=0
			status=$(sed -n 's/^status=//p' "$tmp")
			[ "$status" = completed ] && break
			;;
		000 | 5??) unreachable ;;
		*) die 2 "job $job_id: HTTP $code: $(cat "$tmp")" ;;
		esac
	done
	conclusion=$(sed -n 's/^conclusion=//p' "$tmp")
	case $conclusion in
	success) result=Succeeded ;;
	failure) result=Failed ;;
	cancelled) result=Canceled ;;
	*) result=$conclusion ;;
	esac
	echo "$(stamp): Job $job_name completed with result: $result"
}

connect
echo "√ Connected to GitHub"
echo ""
echo "Current runner version: 'simulator'"
echo "$(stamp): Listening for Jobs"
while :; do
	maxtime=$((wait_s + 30))
	code=$(api GET "$server/_runner/runners/$id/message?session=$session&wait=$wait_s" "$tmp" -H "$auth")
	case $code in
	200)
		fails=0
		run_job
		if [ "$ephemeral" = true ]; then
			# GitHub removes an ephemeral runner after its job; there is no
			# session left to close.
			session=''
			exit 0
		fi
		echo "$(stamp): Listening for Jobs"
		;;
	204) fails=0 ;;
	404)
		session=''
		die 2 "$(cat "$tmp")"
		;;
	409)
		echo "$(stamp): $(cat "$tmp")" >&2
		connect
		;;
	000 | 5??) unreachable ;;
	*) die 2 "polling for jobs failed (HTTP $code): $(cat "$tmp")" ;;
	esac
done
