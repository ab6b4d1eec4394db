// Command guestinit is the /init of tinyguest's initramfs: the whole
// userspace of a cheap real guest for the libvirt provider's contract
// tests. It mounts the kernel's filesystems, loads the few modules the
// initramfs carries (in the order the harness computed from their
// dependencies), keeps a copy of the NoCloud seed it finds on the CD-ROM
// labelled cidata, configures its NIC (DHCPv4, or a static address from
// network-config), and serves the QEMU guest agent protocol on the
// org.qemu.guest_agent.0 virtio-serial port until it is powered off
// (through the agent or the ACPI power button).
//
// It is PID 1: it never exits (the kernel would panic); a step that fails
// is logged to the console and the next one runs.
package main

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Paths the harness and the agent's users rely on.
const (
	moduleDir = "/lib/modules"
	// moduleOrder lists the module files to load, one a line, each after
	// its dependencies.
	moduleOrder = "/lib/modules/order"
	seenDir     = "/run/tinyguest/seen"
	seedMount   = "/mnt/cidata"
)

func main() {
	// As PID 1 the arguments are the kernel command line's words it does
	// not know (nokaslr, ...); as a child of guest-exec they name a tool.
	if os.Getpid() != 1 && len(os.Args) > 1 {
		os.Exit(tool(os.Args[1:]))
	}
	began := time.Now()
	// Files the agent creates get exactly the mode it asks for.
	unix.Umask(0)
	mountBase()
	loadModules()
	logf("modules loaded at %s", time.Since(began).Round(time.Millisecond))
	// Straight after the button driver binds: a press from then on must
	// not wait behind the seed and DHCP (evdev keeps no event for a
	// reader that opens the device later).
	watchPowerButton()
	seed := readSeed()
	logf("seed read at %s", time.Since(began).Round(time.Millisecond))
	if host := seed.hostname(); host != "" {
		if err := unix.Sethostname([]byte(host)); err != nil {
			logf("hostname %q: %v", host, err)
		}
	}
	configureNetwork(seed)
	logf("up in %s", time.Since(began).Round(time.Millisecond))
	serveAgent()
	select {} // PID 1 never returns
}

// logf writes to the console (the init's stdout is /dev/console).
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stdout, "tinyguest: "+format+"\n", args...)
}

// mountBase mounts what a Linux userspace expects.
func mountBase() {
	for _, m := range []struct{ source, target, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
	} {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			logf("mkdir %s: %v", m.target, err)
		}
		if err := unix.Mount(m.source, m.target, m.fstype, 0, ""); err != nil && err != unix.EBUSY {
			logf("mount %s: %v", m.target, err)
		}
	}
}

// tool runs /init as a small command (for guest-exec): "echo ARGS...",
// "cat FILE", "false", or a network test's "dial ADDRESS", "serve PORT"
// "readdress ADDRESS/PREFIX" and "remac MAC" (nettools.go).
func tool(args []string) int {
	if run, ok := netTools[args[0]]; ok {
		if len(args) != 2 {
			fmt.Fprintf(os.Stderr, "init: %s takes one argument\n", args[0])
			return 2
		}
		return run(args[1])
	}
	switch args[0] {
	case "echo":
		for i, a := range args[1:] {
			if i > 0 {
				fmt.Print(" ")
			}
			fmt.Print(a)
		}
		fmt.Println()
		return 0
	case "cat":
		for _, name := range args[1:] {
			raw, err := os.ReadFile(name)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			_, _ = os.Stdout.Write(raw)
		}
		return 0
	case "false":
		return 1
	}
	fmt.Fprintf(os.Stderr, "init: unknown tool %q (echo, cat, false, dial, serve, readdress, remac)\n", args[0])
	return 2
}
