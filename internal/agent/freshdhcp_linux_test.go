package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// guestRoot lays out what the lease renewer reads of a guest: files by
// path (under root), written as given.
func guestRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// ifupdownDHClient is the command line ifupdown starts dhclient with
// (Debian 12's, as the test guest runs it), NUL-separated as in
// /proc/<pid>/cmdline.
const ifupdownDHClient = "dhclient\x00-4\x00-v\x00-i\x00-pf\x00/run/dhclient.eth0.pid\x00-lf\x00/var/lib/dhcp/dhclient.eth0.leases\x00-I\x00-df\x00/var/lib/dhcp/dhclient6.eth0.leases\x00eth0\x00"

// fakeGuest records the renewer's signals and commands, in order: a
// signalled process exits (its /proc entry goes) unless it is deaf.
type fakeGuest struct {
	root   string
	deaf   bool
	runErr error
	events []string
}

func (g *fakeGuest) renewer() leaseRenewer {
	return leaseRenewer{root: g.root,
		run: func(_ context.Context, argv ...string) ([]byte, error) {
			g.events = append(g.events, "run "+strings.Join(argv, " "))
			if g.runErr != nil {
				return []byte("No DHCPOFFERS received."), g.runErr
			}
			return nil, nil
		},
		terminate: func(pid int) error {
			g.events = append(g.events, "SIGTERM "+strconv.Itoa(pid))
			if g.deaf {
				return nil
			}
			return os.RemoveAll(filepath.Join(g.root, "proc", strconv.Itoa(pid)))
		},
	}
}

// TestLeaseRenewer: after a resume, ifupdown's dhclient (the test guest's
// and Debian 12's) is stopped with SIGTERM, which keeps its address, and
// started again with its own command line, once it has exited; a link
// systemd-networkd holds a lease for is renewed with networkctl. Static
// interfaces (no client holds them), a pid file whose process is gone or
// is another program, and the DHCPv6 client are left alone.
//
// Mutation: starting dhclient again without stopping it first (two
// clients on eth0, as the test guest showed) fails the order check;
// dropping the command line check renews eth2 through a stranger's pid.
func TestLeaseRenewer(t *testing.T) {
	g := &fakeGuest{root: guestRoot(t, map[string]string{
		"run/dhclient.eth0.pid":             "301\n",
		"proc/301/cmdline":                  ifupdownDHClient,
		"run/dhclient.eth1.pid":             "999\n", // its client is gone
		"run/dhclient.eth2.pid":             "400\n", // the pid is another program's now
		"proc/400/cmdline":                  "sleep\x00100\x00",
		"run/dhclient6.eth0.pid":            "302\n", // DHCPv6: not a DHCPv4 lease
		"proc/302/cmdline":                  "dhclient\x00-6\x00eth0\x00",
		"sys/class/net/lo/ifindex":          "1\n",
		"sys/class/net/eth0/ifindex":        "2\n",
		"sys/class/net/ens4/ifindex":        "3\n",
		"sys/class/net/eth3/ifindex":        "4\n", // static: no lease anywhere
		"run/systemd/netif/leases/3":        "ADDRESS=10.0.0.5\n",
		"run/systemd/netif/links/4":         "ADMIN_STATE=configured\n",
		"var/lib/dhcp/dhclient.eth0.leases": "lease {}\n",
	})}
	renewed, err := g.renewer().renew(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(renewed, []string{"ens4", "eth0"}) {
		t.Errorf("renewed %v, want ens4 (networkd) and eth0 (dhclient)", renewed)
	}
	want := []string{
		"SIGTERM 301",
		"run " + strings.ReplaceAll(strings.TrimSuffix(ifupdownDHClient, "\x00"), "\x00", " "),
		"run networkctl renew ens4",
	}
	if !slices.Equal(g.events, want) {
		t.Errorf("the guest saw\n%s\nwant\n%s", strings.Join(g.events, "\n"), strings.Join(want, "\n"))
	}
}

// TestLeaseRenewerStaticOnly: a guest whose addresses are all static has
// no lease to renew and sees no command.
func TestLeaseRenewerStaticOnly(t *testing.T) {
	g := &fakeGuest{root: guestRoot(t, map[string]string{"sys/class/net/eth0/ifindex": "2\n", "etc/network/interfaces": "iface eth0 inet static\n"})}
	renewed, err := g.renewer().renew(t.Context())
	if err != nil || len(renewed) != 0 || len(g.events) != 0 {
		t.Errorf("renew = %v, %v; events %v, want nothing done", renewed, err, g.events)
	}
}

// TestLeaseRenewerFailures: a dhclient that does not exit is not started
// a second time beside itself, and a client that cannot start again fails
// the renewal with its output.
func TestLeaseRenewerFailures(t *testing.T) {
	files := map[string]string{"run/dhclient.eth0.pid": "301\n", "proc/301/cmdline": ifupdownDHClient}
	g := &fakeGuest{root: guestRoot(t, files), deaf: true}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, err := g.renewer().renew(ctx); err == nil || !strings.Contains(err.Error(), "wait for the dhclient of eth0 to exit") {
		t.Errorf("a dhclient deaf to SIGTERM: %v, want the wait's failure", err)
	}
	if !slices.Equal(g.events, []string{"SIGTERM 301"}) {
		t.Errorf("events %v, want the signal only", g.events)
	}

	g = &fakeGuest{root: guestRoot(t, files), runErr: errors.New("exit status 2")}
	_, err := g.renewer().renew(t.Context())
	if err == nil || !strings.Contains(err.Error(), "start the dhclient of eth0 again") || !strings.Contains(err.Error(), "No DHCPOFFERS received.") {
		t.Errorf("a dhclient that cannot start again: %v", err)
	}
}
