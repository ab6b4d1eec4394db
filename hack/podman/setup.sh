#!/usr/bin/env bash
# Installs podman (Debian's, with Debian's runc) when missing and writes the
# containers.conf that makes it run containers in a sandbox like CI's, then
# prints that file's path for CONTAINERS_CONF:
#
#   export CONTAINERS_CONF=$(hack/podman/setup.sh)
#
# Why each setting (measured on the 2-core CI machine, podman 4.3):
#   - runtime runc: crun refuses the hybrid cgroup hierarchy found there;
#   - cgroup_manager cgroupfs, events_logger file: there is no systemd;
#   - default_ulimits empty: the sandbox may not raise rlimits, and podman
#     raises nofile by default, so every container fails to start.
# Images and containers stay in podman's default (rootful) storage, which
# `make image` and test/deploy share. The file lives in $HYPERFLEET_CACHE
# (default ~/.cache/hyperfleet) so that nothing outside it changes.
set -euo pipefail

missing=()
command -v podman >/dev/null || missing+=(podman)
[[ -x /usr/sbin/runc ]] || missing+=(runc)
[[ -d /usr/lib/cni ]] || missing+=(containernetworking-plugins)
if ((${#missing[@]})); then
	run=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || { echo "hack/podman/setup.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
		run=(sudo)
	fi
	echo "hack/podman/setup.sh: installing ${missing[*]} (Debian packages)" >&2
	# Other jobs on the machine may hold the dpkg lock: wait for it.
	"${run[@]}" apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
	DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >&2
fi

cache=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
dir="$cache/podman"
mkdir -p "$dir"
conf="$dir/containers.conf"
cat >"$conf.tmp" <<'CONF'
# Written by hack/podman/setup.sh; see there for why.
[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"

[engine.runtimes]
runc = ["/usr/sbin/runc"]
CONF
mv -f "$conf.tmp" "$conf"
echo "$conf"
