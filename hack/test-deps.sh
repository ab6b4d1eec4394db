#!/usr/bin/env bash
# Installs what the tests run or read for real, outside the repository:
#   - Debian's cloud-init (its schema validator and network-config converter
#     check every rendered cloud-init), curl (the GitHub simulator's runner
#     scripts use it) and prometheus (promtool checks and unit-tests the
#     alerts; test/e2e scrapes the operator with the prometheus server),
#     bind9 and knot (internal/dnsreg/rfc2136 runs its DNS registration
#     tests against a real BIND named and Knot knotd on loopback, and the
#     external-dns end-to-end test publishes to a BIND; its external-dns is
#     built by hack/external-dns/build.sh, which make test calls) and
#     nginx (internal/testworld/mtlsproxy: the TLS-terminating proxy that
#     requires client certificates in front of the Proxmox simulator, for
#     the mTLS tests of pkg/provider/proxmox and internal/controller),
#     swtpm and swtpm-tools (the TPMs of the TPM attestation tests and the
#     simulator's virtual TPMs), tinyproxy, iproute2 and nftables (the
#     proxy tests' HTTP proxy, alone in a network namespace with their
#     servers: internal/testworld/proxytest), libvirt's daemon with its
#     QEMU driver, QEMU, qemu-img and dnsmasq (the real libvirtd of the
#     libvirt provider's tests: internal/testworld/libvirtd), through
#     apt-get as root or through sudo;
#   - GitHub's published REST description and webhook examples (npm
#     @octokit/openapi and @octokit/webhooks-examples), pinned, into
#     $HYPERFLEET_CACHE/npm (default ~/.cache/hyperfleet/npm), and
#     tree-sitter's PowerShell grammar with web-tree-sitter (the Windows
#     user data's PowerShell is parsed with them; there is no PowerShell in
#     Debian) into $HYPERFLEET_CACHE/npm-powershell.
# Tests never skip when something is missing; they fail and point here.
#
#   hack/test-deps.sh --dev   only what `make dev` (cmd/hyperfleet-dev) needs
#                             (curl: the simulated VMs' runner scripts and
#                             power button)
#   hack/test-deps.sh --guest only what `make test-guest` needs besides the
#                             rest: debootstrap and e2fsprogs (hack/guest-image
#                             builds the guest image), QEMU (qemu-system-x86
#                             runs the guests, qemu-utils' qemu-img makes
#                             their linked clones), dnsmasq-base (the DHCP
#                             server of the DHCP test's guest network),
#                             isc-dhcp-client (the client of the DHCP
#                             reservation test without a guest) and
#                             iproute2 (ip netns makes that network)
#   hack/test-deps.sh --chaos only what the chaos runs (`make test-chaos`,
#                             `make test-chaos-small`) need besides the rest:
#                             iproute2 and nftables (internal/testworld/netns:
#                             a Proxmox cluster in a network namespace that
#                             the run partitions from the manager)
set -euo pipefail

dev_only=false
guest=false
chaos=false
case ${1:-} in
--dev) dev_only=true ;;
--guest) guest=true ;;
--chaos) chaos=true ;;
esac

missing=()
command -v curl >/dev/null || missing+=(curl)
if $guest; then
	command -v debootstrap >/dev/null || missing+=(debootstrap)
	command -v debugfs >/dev/null || missing+=(e2fsprogs)
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	command -v qemu-img >/dev/null || missing+=(qemu-utils)
	command -v dnsmasq >/dev/null || missing+=(dnsmasq-base)
	[[ -x /usr/sbin/dhclient ]] || command -v dhclient >/dev/null || missing+=(isc-dhcp-client)
	command -v ip >/dev/null || missing+=(iproute2)
fi
if $chaos; then
	command -v ip >/dev/null || missing+=(iproute2)
	command -v nft >/dev/null || missing+=(nftables)
fi
if ! $dev_only; then
	command -v cloud-init >/dev/null || missing+=(cloud-init)
	command -v npm >/dev/null || missing+=(npm)
	{ command -v prometheus && command -v promtool; } >/dev/null || missing+=(prometheus)
	# The DNS servers of internal/dnsreg/rfc2136's tests and nginx live in
	# /usr/sbin, which a non-root PATH may lack.
	[[ -x /usr/sbin/named ]] || command -v named >/dev/null || missing+=(bind9)
	[[ -x /usr/sbin/knotd ]] || command -v knotd >/dev/null || missing+=(knot)
	[[ -x /usr/sbin/nginx ]] || command -v nginx >/dev/null || missing+=(nginx)
	# swtpm and swtpm_setup (with swtpm_localca) are the TPMs of the TPM
	# attestation tests (internal/testworld/swtpm) and the simulator's
	# virtual TPMs.
	command -v swtpm >/dev/null || missing+=(swtpm)
	command -v swtpm_setup >/dev/null || missing+=(swtpm-tools)
	# tinyproxy in a network namespace (internal/testworld/proxytest) is
	# the only way to the servers of the proxy tests.
	command -v tinyproxy >/dev/null || missing+=(tinyproxy)
	command -v ip >/dev/null || missing+=(iproute2)
	command -v nft >/dev/null || missing+=(nftables)
	# libvirt's daemon with its QEMU driver, QEMU and qemu-img: the real
	# libvirtd the libvirt provider's contract suite runs against
	# (internal/testworld/libvirtd starts a private one per test, by hand,
	# without systemd), and its guests (internal/testworld/tinyguest).
	[[ -x /usr/sbin/libvirtd ]] || missing+=(libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients)
	command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
	command -v qemu-img >/dev/null || missing+=(qemu-utils)
	command -v dnsmasq >/dev/null || [[ -x /usr/sbin/dnsmasq ]] || missing+=(dnsmasq-base)
fi
if ((${#missing[@]})); then
	run=()
	if [[ $(id -u) -ne 0 ]]; then
		command -v sudo >/dev/null || { echo "hack/test-deps.sh: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
		run=(sudo)
	fi
	echo "hack/test-deps.sh: installing ${missing[*]} (Debian packages)" >&2
	"${run[@]}" apt-get update -qq
	# cloud-init is only run as a validator here; its services are never
	# enabled in this environment. The tests start prometheus themselves;
	# on a machine run by systemd the package also starts its own service
	# (port 9090), which `systemctl disable --now prometheus` stops.
	# Likewise bind9 and knot (port 53) and nginx (port 80); the tests run
	# their own servers on free ports and need none of those services
	# (`systemctl disable --now named knot nginx` stops them).
	DEBIAN_FRONTEND=noninteractive "${run[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

{ $dev_only || $guest || $chaos; } && exit 0

# Keep these versions in step with internal/testworld/testdeps.
npm_packages=(@octokit/openapi@23.0.2 @octokit/webhooks-examples@7.6.1)
cache_root=${HYPERFLEET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hyperfleet}
npm_dir="$cache_root/npm"
stamp="$npm_dir/.installed"
want="${npm_packages[*]}"
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
	echo "hack/test-deps.sh: installing npm ${want} into $npm_dir (about 400 MB, once)" >&2
	mkdir -p "$npm_dir"
	npm install --prefix "$npm_dir" --no-audit --no-fund --no-save --loglevel=error "${npm_packages[@]}"
	printf '%s' "$want" >"$stamp"
fi

# The PowerShell grammar the Windows user data's script is parsed with
# (hack/powershell-parse/parse.mjs; internal/cloudinit's
# TestWindowsPowerShellParses): a prefix of its own, so that its stamp and
# the one above never reinstall each other. Keep in step with
# internal/testworld/testdeps.
ps_packages=(web-tree-sitter@0.25.10 tree-sitter-powershell@0.26.4)
ps_dir="$cache_root/npm-powershell"
ps_stamp="$ps_dir/.installed"
ps_want="${ps_packages[*]}"
if [[ ! -f $ps_stamp || $(cat "$ps_stamp") != "$ps_want" ]]; then
	echo "hack/test-deps.sh: installing npm ${ps_want} into $ps_dir (about 10 MB, once)" >&2
	mkdir -p "$ps_dir"
	npm install --prefix "$ps_dir" --ignore-scripts --no-audit --no-fund --no-save --loglevel=error "${ps_packages[@]}"
	printf '%s' "$ps_want" >"$ps_stamp"
fi
