package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A resumed guest's DHCP leases are as old as its suspend: the server may
// have let them lapse, or handed the address to another machine, while the
// guest's own client, whose timers stood still with its clock, holds on.
// leaseRenewer has each interface's DHCP client ask again, as a client
// does at a reboot with a lease still recorded (INIT-REBOOT, RFC 2131
// 3.2): a DHCPREQUEST for the address it holds, which the server
// acknowledges (the address stays) or refuses (the client then takes a new
// lease). An interface no DHCP client holds has a static address, and is
// left alone.
//
// Two clients are known, by the state they keep:
//
//   - ifupdown's dhclient (ISC dhclient 4.4; Debian 12's cloud images and
//     HyperFleet's test guest, docs/templates.md): one process per
//     interface, its pid in /run/dhclient.<iface>.pid. It has no signal
//     that renews, and a second one started beside it does not replace
//     it, so it is stopped with SIGTERM, which ends it without a release
//     and without touching the address (what `dhclient -x` does to it,
//     without the DHCPDISCOVER that dhclient's own start sends), and
//     started again with its own command line: it reads its lease file
//     and asks for that lease, and returns once bound, its daemon going
//     on in the background. (That daemon is then a child of the agent's
//     service, which ends when the VM does.)
//   - systemd-networkd (Debian 13, netplan's default): a lease it holds is
//     /run/systemd/netif/leases/<ifindex>; `networkctl renew <iface>`
//     renews it.

// leaseRenewer renews the DHCP leases of the guest whose file system is
// at root ("/" in a VM).
type leaseRenewer struct {
	root string
	// run runs a program and returns its combined output.
	run func(ctx context.Context, argv ...string) ([]byte, error)
	// terminate sends SIGTERM to process pid.
	terminate func(pid int) error
}

// dhclientStopWait bounds the wait for a stopped dhclient to exit; it
// exits at once, ISC's own -x waits a second.
const dhclientStopWait = 5 * time.Second

// renew renews every lease it finds and returns the interfaces, sorted.
func (l leaseRenewer) renew(ctx context.Context) ([]string, error) {
	dhclients, err := l.dhclients()
	if err != nil {
		return nil, err
	}
	links, err := l.networkdLinks()
	if err != nil {
		return nil, err
	}
	var renewed []string
	for _, c := range dhclients {
		if err := l.restartDHClient(ctx, c); err != nil {
			return renewed, err
		}
		renewed = append(renewed, c.iface)
	}
	for _, iface := range links {
		if out, err := l.run(ctx, "networkctl", "renew", iface); err != nil {
			return renewed, fmt.Errorf("networkctl renew %s: %w: %s", iface, err, strings.TrimSpace(string(out)))
		}
		renewed = append(renewed, iface)
	}
	slices.Sort(renewed)
	return renewed, nil
}

// dhclient is a running dhclient that holds an interface's lease.
type dhclient struct {
	iface string
	pid   int
	argv  []string
}

// dhclients are the dhclients ifupdown runs, by their pid files, that are
// alive and are the dhclient of the interface their pid file names. A pid
// file left by a client that is gone holds nothing to renew.
func (l leaseRenewer) dhclients() ([]dhclient, error) {
	files, err := filepath.Glob(filepath.Join(l.root, "run", "dhclient.*.pid"))
	if err != nil {
		return nil, fmt.Errorf("find dhclient's pid files: %w", err)
	}
	var out []dhclient
	for _, f := range files {
		iface := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "dhclient."), ".pid")
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f, err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil || pid <= 0 {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join(l.root, "proc", strconv.Itoa(pid), "cmdline"))
		if err != nil {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if filepath.Base(argv[0]) != "dhclient" || argv[len(argv)-1] != iface {
			continue
		}
		out = append(out, dhclient{iface: iface, pid: pid, argv: argv})
	}
	return out, nil
}

// restartDHClient stops c and starts it again with its command line.
func (l leaseRenewer) restartDHClient(ctx context.Context, c dhclient) error {
	if err := l.terminate(c.pid); err != nil {
		return fmt.Errorf("stop the dhclient of %s (pid %d): %w", c.iface, c.pid, err)
	}
	proc := filepath.Join(l.root, "proc", strconv.Itoa(c.pid))
	for deadline := time.Now().Add(dhclientStopWait); ; {
		if _, err := os.Stat(proc); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the dhclient of %s (pid %d) did not exit within %s of SIGTERM", c.iface, c.pid, dhclientStopWait)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the dhclient of %s to exit: %w", c.iface, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if out, err := l.run(ctx, c.argv...); err != nil {
		return fmt.Errorf("start the dhclient of %s again (%s): %w: %s", c.iface, strings.Join(c.argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// networkdLinks are the interfaces for which systemd-networkd holds a
// DHCPv4 lease.
func (l leaseRenewer) networkdLinks() ([]string, error) {
	links, err := os.ReadDir(filepath.Join(l.root, "sys", "class", "net"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the network interfaces: %w", err)
	}
	var out []string
	for _, link := range links {
		raw, err := os.ReadFile(filepath.Join(l.root, "sys", "class", "net", link.Name(), "ifindex"))
		if err != nil {
			continue
		}
		lease := filepath.Join(l.root, "run", "systemd", "netif", "leases", strings.TrimSpace(string(raw)))
		if _, err := os.Stat(lease); err == nil {
			out = append(out, link.Name())
		}
	}
	return out, nil
}

// runCommand runs argv and returns its combined output. A DHCP client
// that daemonizes closes its output once its parent returns; WaitDelay
// bounds the wait for one that keeps it, which is then no failure.
func runCommand(ctx context.Context, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.WaitDelay = 2 * time.Second
	out, err := cmd.CombinedOutput()
	if errors.Is(err, exec.ErrWaitDelay) {
		err = nil
	}
	return out, err
}
