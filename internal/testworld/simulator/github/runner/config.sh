#!/bin/sh
# config.sh of the HyperFleet GitHub simulator's runner package.
#
# Registers this runner with the simulator the way the real actions/runner
# config.sh registers with GitHub, and writes .runner, .credentials and
# .credentials_rsaparams next to this script. POSIX sh + curl + base64 + sed.
#
#   ./config.sh --url https://HOST/OWNER[/REPO] --token REGISTRATION_TOKEN \
#       [--name NAME] [--labels a,b] [--runnergroup GROUP] [--work DIR] \
#       [--ephemeral] [--replace] [--no-default-labels] [--unattended] \
#       [--disableupdate] [--cacert FILE]
#   ACTIONS_RUNNER_INPUT_TOKEN=REGISTRATION_TOKEN ./config.sh --url ...
#       the token kept out of the command line (like the real runner,
#       which reads any option from ACTIONS_RUNNER_INPUT_<NAME>)
#   ./config.sh remove [--token TOKEN]     forget the local configuration
#
# Exit status: 0 configured, 1 usage or local error, 2 refused by the
# server, 3 server unreachable.
set -u

dir=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1
prog=config.sh

die() { code=$1; shift; printf '%s: %s\n' "$prog" "$*" >&2; exit "$code"; }
usage() { sed -n '8,18p' "$dir/config.sh" | sed 's/^# \{0,1\}//'; }

cacert=${HF_SIM_CA:-}
[ -z "$cacert" ] && [ -f "$dir/sim-ca.pem" ] && cacert=$dir/sim-ca.pem

# api METHOD URL OUTFILE [curl args...]: prints the HTTP status (000 when
# the server could not be reached).
api() {
	m=$1 u=$2 o=$3
	shift 3
	if [ -n "$cacert" ]; then
		set -- --cacert "$cacert" "$@"
	fi
	c=$(curl -sS --connect-timeout 10 --max-time 60 -o "$o" -w '%{http_code}' -X "$m" "$@" "$u" 2>"$o.err") || c=000
	printf '%s' "$c"
}

# write_config ENCODED: decodes a GitHub-style encoded runner configuration
# (base64 JSON object of file name -> base64 content) into the runner dir.
write_config() {
	json=$(printf '%s' "$1" | base64 -d 2>/dev/null) || die 1 "the runner configuration is not valid base64"
	for f in .runner .credentials .credentials_rsaparams; do
		v=$(printf '%s\n' "$json" | sed -n "s/.*\"\\$f\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p")
		[ -n "$v" ] || die 1 "the runner configuration has no $f"
		printf '%s' "$v" | base64 -d >"$dir/$f" 2>/dev/null || die 1 "cannot decode $f of the runner configuration"
		chmod 600 "$dir/$f"
	done
}

if [ "${1:-}" = remove ]; then
	rm -f "$dir/.runner" "$dir/.credentials" "$dir/.credentials_rsaparams"
	echo "Removed .credentials"
	echo "Removed .runner"
	exit 0
fi

# --token wins over the environment, as with the real runner.
token=${ACTIONS_RUNNER_INPUT_TOKEN:-}
url='' name='' labels='' group='' work='_work' ephemeral=false replace=false nodefault=false
while [ $# -gt 0 ]; do
	case $1 in
	--url | --token | --name | --labels | --runnergroup | --work | --cacert)
		[ $# -ge 2 ] || die 1 "$1 needs a value"
		case $1 in
		--url) url=$2 ;;
		--token) token=$2 ;;
		--name) name=$2 ;;
		--labels) labels=$2 ;;
		--runnergroup) group=$2 ;;
		--work) work=$2 ;;
		--cacert) cacert=$2 ;;
		esac
		shift 2
		;;
	--ephemeral) ephemeral=true; shift ;;
	--replace) replace=true; shift ;;
	--no-default-labels) nodefault=true; shift ;;
	--unattended | --disableupdate) shift ;;
	-h | --help) usage; exit 0 ;;
	*) die 1 "unknown option $1 (see --help)" ;;
	esac
done

[ -n "$url" ] || die 1 "--url is required"
[ -n "$token" ] || die 1 "--token (or the environment variable ACTIONS_RUNNER_INPUT_TOKEN) is required"
[ -n "$name" ] || name=$(hostname 2>/dev/null || echo runner)
[ -f "$dir/.runner" ] && die 1 "Cannot configure the runner because it is already configured. To reconfigure the runner, run './config.sh remove' first."

host=$(printf '%s' "$url" | sed -n 's#^\(https\{0,1\}://[^/]*\).*#\1#p')
[ -n "$host" ] || die 1 "--url $url is not an http(s) URL"

line=--------------------------------------------------------------------------------
printf '\n%s\n%s\n%s\n\n' "$line" '|        Self-hosted runner registration (HyperFleet GitHub simulator)         |' "$line"

tmp=$(mktemp) || die 1 "cannot create a temporary file"
trap 'rm -f "$tmp" "$tmp.err"' EXIT
code=$(api POST "$host/_runner/register" "$tmp" \
	-H "Authorization: RemoteAuth $token" \
	--data-urlencode "url=$url" --data-urlencode "name=$name" --data-urlencode "labels=$labels" \
	--data-urlencode "runnergroup=$group" --data-urlencode "work=$work" \
	--data-urlencode "ephemeral=$ephemeral" --data-urlencode "replace=$replace" \
	--data-urlencode "no_default_labels=$nodefault" \
	--data-urlencode "os=$(uname -s)" --data-urlencode "arch=$(uname -m)")
case $code in
201) ;;
000) die 3 "cannot reach $host: $(cat "$tmp.err" 2>/dev/null)" ;;
*) die 2 "registration refused (HTTP $code): $(cat "$tmp")" ;;
esac
echo "√ Connected to GitHub"
enc=$(sed -n 's/^encoded_config=//p' "$tmp")
[ -n "$enc" ] || die 2 "the server sent no runner configuration"
write_config "$enc"
echo "√ Runner successfully added"
echo "√ Runner connection is good"
echo "√ Settings Saved."
exit 0
