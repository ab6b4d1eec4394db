// Package tinyguest is a cheap real guest for the libvirt provider's
// contract tests: Debian's cloud kernel and an initramfs whose /init is a
// static Go program (guestinit), booted by libvirt's direct kernel boot
// under TCG. The guest reads its NoCloud seed from the CD-ROM labelled
// cidata and keeps a copy under /run/tinyguest/seen, takes a DHCPv4 lease
// (or the static address its network-config gives), and serves a real
// QEMU guest agent on the org.qemu.guest_agent.0 port: sync, ping, info,
// OS info, host name, interfaces, files, exec and shutdown. It has no
// disk filesystem, no shell and no SSH: tests reach it through libvirt.
//
// Build makes the image: the kernel comes from Debian's package
// (apt-get download; run apt-get update once on a new machine) and is
// kept with the initramfs under ~/.cache/hyperfleet/tinyguest, never in
// the repository. Template describes the domain; AgentCommand, GuestFile,
// SeenCloudInit and PowerOffFromInside are the test hooks, over an admin
// connection (internal/testworld/libvirtd's Dial).
//
// It needs apt-get and dpkg-deb for the first build, the go command (to
// build /init) and, to boot, a libvirtd with qemu-system-x86 (see
// internal/testworld/libvirtd). Cost, measured on the project's 2-core
// machine: the first build about 4.5 s (kernel download and unpack), a
// warm one under a second (go build from its cache); a boot to a
// ready agent takes TBD.
package tinyguest
