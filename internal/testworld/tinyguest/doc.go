// Package tinyguest is a cheap real guest for the libvirt provider's
// contract tests: Debian's cloud kernel and an initramfs whose /init is a
// static Go program (guestinit), booted by libvirt's direct kernel boot
// under TCG. The guest reads its NoCloud seed from the CD-ROM labelled
// cidata and keeps a copy under /run/tinyguest/seen, takes a DHCPv4 lease
// (or the static address its network-config gives), and serves a real
// QEMU guest agent on the org.qemu.guest_agent.0 port: sync, ping, info,
// OS info, host name, interfaces, files, exec (Exec: /init's tools,
// among them a network test's dial, serve and readdress) and shutdown; the ACPI
// power button powers it off too. It has no
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
// internal/testworld/libvirtd).
//
// Cost, measured on the project's 2-core machine while it was shared
// (load 10-15): the first build 9 s wall (download, unpack, the 53 MB
// vmlinux, go build; 160 MB of cache), a warm one 0.4-0.7 s (go build
// from its cache). A boot to a ready agent uses 3.2-3.7 CPU-s of QEMU
// (3.6 s wall on a quiet machine, 8-11 s under that load): QEMU's start 0.2-0.4, firmware and
// loading 0.3, the kernel's initialisation about 1.9 (ACPI, PCI, crypto
// self-tests, certificates), /init with its module loading and device
// probing 0.8-1.0. An idle guest then costs 0.04-0.06 CPU-s a second.
// Below 3 CPU-s would take a kernel of our own with the drivers built in
// (or a working KVM); the savings already taken (Template,
// KernelCmdline) brought it down from 4.3-4.9.
package tinyguest
