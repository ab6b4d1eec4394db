//go:build guest

package guest

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/procgroup"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
)

// TestDHCPReservationWithISCClient: guestnet's reservation, added while
// dnsmasq runs (Reserve), gives the real isc-dhcp-client that names itself
// so the reserved address, outside the leased range, and the lease time it
// asks for (shorter than the range's) is the one the lease file shows
// (Lease.Expires), with the dhclient.conf statements the operator's
// cloud-config writes for requestStaticLease and leaseTime. No guest: the
// client runs in a second namespace whose veth is plugged into the bridge,
// as a guest's tap is; TestDHCPClientIdentifierOnRealGuests proves the
// same on a real guest.
func TestDHCPReservationWithISCClient(t *testing.T) {
	dhclient, err := exec.LookPath("dhclient")
	if err != nil {
		t.Fatalf("isc-dhcp-client is not installed (hack/test-deps.sh --guest installs it): %v", err)
	}
	name := fmt.Sprintf("hf-dhcpres-%d", os.Getpid())
	gn, srv := dhcpNetwork(t, name, netip.MustParsePrefix("10.98.9.0/24"))
	reserved := gn.Addr(reservedOffset)
	if err := srv.Reserve("reserved-host", reserved); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reserve("bad,name", reserved); err == nil {
		t.Error("Reserve took a host name with a comma")
	}

	client := clientNamespace(t, gn, name+"-c")
	dir := t.TempDir()
	conf := filepath.Join(dir, "dhclient.conf")
	statements := "send dhcp-client-identifier \"reserved-host\";\nsend host-name \"reserved-host\";\nsend dhcp-lease-time 600;\n"
	if err := os.WriteFile(conf, []byte(statements), 0o644); err != nil {
		t.Fatal(err)
	}
	// -sf /bin/true: the lease is taken, nothing configured.
	cmd := exec.Command("ip", "netns", "exec", client, dhclient, "-d", "-1", "-v", "-sf", "/bin/true", "-cf", conf,
		"-lf", filepath.Join(dir, "dhclient.leases"), "-pf", filepath.Join(dir, "dhclient.pid"), "vc1")
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	leader := procgroup.New(cmd)
	t.Cleanup(func() {
		_ = leader.Signal(syscall.SIGKILL)
		_ = leader.Wait(procgroup.KillGroup)
	})
	var got guestnet.Lease
	for deadline := time.Now().Add(30 * time.Second); got.Addr != reserved; time.Sleep(100 * time.Millisecond) {
		leases, err := srv.Leases()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range leases {
			if l.Hostname == "reserved-host" {
				got = l
			}
		}
		if time.Now().After(deadline) {
			log, _ := srv.Log()
			t.Fatalf("no lease of %s within 30 s: %+v\ndhclient:\n%s\ndnsmasq:\n%s", reserved, leases, out.String(), log)
		}
	}
	if want := guestnet.HexID([]byte("reserved-host")); got.ClientID != want {
		t.Errorf("lease keyed on client id %q, want the host name's %s", got.ClientID, want)
	}
	// Granted between start and now, for the 600 s asked (not the
	// range's 12 h); the file keeps whole seconds.
	if lo, hi := start.Add(599*time.Second), time.Now().Add(601*time.Second); got.Expires.Before(lo) || got.Expires.After(hi) {
		t.Errorf("lease expires %s, want between %s and %s (600 s after it was granted)", got.Expires, lo, hi)
	}
}

// clientNamespace makes a namespace with a veth (vc1) whose peer is
// plugged into gn's bridge; it goes when the test ends.
func clientNamespace(t *testing.T, gn *guestnet.Network, name string) string {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("remove %s: %v: %s", name, err, out)
		}
	})
	run("-n", gn.Netns, "link", "add", "vc0", "type", "veth", "peer", "name", "vc1", "netns", name)
	run("-n", gn.Netns, "link", "set", "vc0", "master", guestnet.Bridge, "up")
	run("-n", name, "link", "set", "lo", "up")
	run("-n", name, "link", "set", "vc1", "up")
	return name
}
