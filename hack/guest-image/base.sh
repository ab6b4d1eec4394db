#!/usr/bin/env bash
# base.sh OUTDIR [PACKAGE...]: the guest's base image, the stand-in for
# Debian's genericcloud image that docs/templates.md starts from (this
# machine reaches Debian's package mirror, not cloud.debian.org). Writes
# OUTDIR/disk.raw (ext4 without a partition table, label hyperfleet-root),
# OUTDIR/vmlinuz and OUTDIR/initrd.img. Needs root, debootstrap and
# e2fsprogs; hack/test-deps.sh --guest installs them.
#
# The PACKAGEs (the template recipe's packages: list) are installed here
# already, so that the recipe's own package step at first boot, under
# QEMU's slow emulation, only finds them present.
set -euo pipefail

out=$1
shift
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# What a cloud image has: a kernel for virtual machines with its initramfs,
# systemd, cloud-init (python3-cffi-backend is a dependency of a
# dependency that debootstrap's resolver misses; without it cloud-init's
# configuration stage fails), the guest agent, ifupdown and a DHCP client
# (cloud-init's ENI renderer, Debian 12's default), sudo, locales and an
# SSH server (network validation's sshTest reads its host key, and
# operators log in with the template's sshAuthorizedKeys).
packages=(
	linux-image-cloud-amd64 initramfs-tools systemd-sysv udev dbus
	cloud-init python3-cffi-backend qemu-guest-agent
	ifupdown isc-dhcp-client iproute2 netbase ca-certificates curl sudo locales
	openssh-server
	"$@"
)

work=$(mktemp -d "${out%/}.work.XXXXXX")
root=$work/root
cleanup() {
	for m in proc sys dev/pts dev; do umount "$root/$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

step() { printf '==> guest base: %s (%s)\n' "$1" "$(date -u +%H:%M:%S)" >&2; }

step "debootstrap $suite with ${#packages[@]} packages from $mirror"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
	tail -n 30 "$work/debootstrap.log" >&2
	exit 1
}

step "security and point-release updates"
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
SOURCES
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
in_root apt-get update -qq
in_root apt-get -y -qq -o Dpkg::Options::=--force-confold dist-upgrade >/dev/null
# The kernel the upgrade replaced.
in_root apt-get -y -qq autoremove --purge >/dev/null
in_root apt-get clean
# cloud-init's locale module sets LANG=en_US.UTF-8, which Debian's
# locale-gen builds only when /etc/locale.gen lists it (it ignores the
# locale cloud-init names): generate it here, as the cloud images have it.
sed -i 's/^# *\(en_US.UTF-8 UTF-8\)/\1/' "$root/etc/locale.gen"
in_root locale-gen >/dev/null
in_root update-locale LANG=en_US.UTF-8

step "configuring"
# The root file system is found by label: the disk is the first SCSI disk
# (Proxmox's scsi0) or a virtio disk, whichever the VM has.
echo 'LABEL=hyperfleet-root / ext4 defaults,discard 0 1' >"$root/etc/fstab"
# The serial console carries the boot log (the simulator keeps it per VM).
systemctl --root="$root" enable serial-getty@ttyS0.service >/dev/null 2>&1 || true
# A cloud image's identity is made at first boot: no host name, no
# machine-id, no SSH host keys.
: >"$root/etc/hostname"
: >"$root/etc/machine-id"
rm -f "$root"/etc/ssh/ssh_host_*
rm -f "$root/var/lib/dbus/machine-id"
for m in dev/pts dev sys proc; do umount "$root/$m"; done

step "extracting the kernel and initramfs"
cp "$(readlink -f "$root/vmlinuz")" "$work/vmlinuz"
cp "$(readlink -f "$root/initrd.img")" "$work/initrd.img"

step "making the ext4 image"
# 4 GiB, sparse; a VM's linked clone (a qcow2 overlay) may be larger.
truncate -s 4G "$work/disk.raw"
mkfs.ext4 -q -L hyperfleet-root -d "$root" "$work/disk.raw"

mkdir -p "$out"
mv "$work/vmlinuz" "$work/initrd.img" "$work/disk.raw" "$out/"
step "done: $out"
