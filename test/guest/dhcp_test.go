//go:build guest

package guest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
)

// TestDHCPClientIdentifierOnRealGuests: a template in network mode dhcp,
// its real guest on a bridge of its own (a network namespace the test
// creates) where dnsmasq is the DHCP server, once per
// network.dhcp.clientIdentifier. What dnsmasq recorded proves what the
// guest's DHCP client sent: in hostname mode the lease is keyed on the
// VM's host name as client identifier (option 61), in mac mode on no such
// identifier; the guest holds exactly that lease's address, from
// dnsmasq's range, and the claim reports it (read through the guest
// agent). The job runs end to end over the namespace's forwarders. In mac
// mode the operator also registers the guest in a real BIND on the bridge
// and validates it from the host's side of the bridge: forward and
// reverse lookups at that BIND, and ping (validateOnBridge).
func TestDHCPClientIdentifierOnRealGuests(t *testing.T) {
	for i, id := range []hfv1.DHCPClientIdentifier{hfv1.DHCPClientIdentifierMAC, hfv1.DHCPClientIdentifierHostname} {
		t.Run(string(id), func(t *testing.T) {
			gn, srv := dhcpNetwork(t, fmt.Sprintf("hf-dhcp-%d-%s", os.Getpid(), id), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98, byte(i + 1), 0}), 24))
			img := image
			opts := devenv.Options{GuestImage: &img, GuestNetwork: gn, DHCPClientIdentifier: id}
			// The mac guest also proves DNS and network validation, with
			// no guest of its own (validation_test.go).
			var validated func(*devenv.World)
			if id == hfv1.DHCPClientIdentifierMAC {
				validated = validateOnBridge(t, gn, &opts)
			}
			w, _, _ := runJobs(t, scenario{jobs: 1, opts: opts, probe: probeDHCP(gn, srv, id)})
			if validated != nil {
				validated(w)
			}
			leases, err := srv.Leases()
			if err != nil {
				t.Fatal(err)
			}
			log, _ := srv.Log()
			t.Logf("dnsmasq's leases: %+v\ndnsmasq's log:\n%s", leases, log)
		})
	}
}

// dhcpNetwork creates the namespace with its bridge and runs dnsmasq on
// it, leasing .100-.199; both go when the test ends, after its world.
func dhcpNetwork(t *testing.T, name string, prefix netip.Prefix) (*guestnet.Network, *guestnet.DHCPServer) {
	t.Helper()
	gn, err := guestnet.Create(name, prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := gn.Close(); err != nil {
			t.Errorf("remove the guests' network: %v", err)
		}
	})
	srv, err := gn.StartDHCP(t.TempDir(), gn.Addr(100), gn.Addr(199))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return gn, srv
}

// probeDHCP checks a guest's lease against dnsmasq's records.
func probeDHCP(gn *guestnet.Network, srv *guestnet.DHCPServer, id hfv1.DHCPClientIdentifier) func(context.Context, *devenv.World, int, hfv1.MachineClaim) error {
	return func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
		st := claim.Status.Network
		if st == nil || st.MACAddress == "" || st.Hostname == "" {
			return fmt.Errorf("claim %s: no MAC address and host name yet", claim.Name)
		}
		leases, err := srv.Leases()
		if err != nil {
			return err
		}
		var mine []guestnet.Lease
		for _, l := range leases {
			if strings.EqualFold(l.MAC, st.MACAddress) {
				mine = append(mine, l)
			}
		}
		// In hostname mode the first lease (the default identifier's)
		// was released before the second was taken.
		if len(mine) != 1 {
			return fmt.Errorf("dnsmasq holds %d leases for %s, want 1: %+v", len(mine), st.MACAddress, leases)
		}
		l := mine[0]
		if l.Addr.Less(gn.Addr(100)) || gn.Addr(199).Less(l.Addr) {
			return fmt.Errorf("lease %s is outside dnsmasq's range", l.Addr)
		}
		hostID := guestnet.HexID([]byte(st.Hostname))
		switch {
		case id == hfv1.DHCPClientIdentifierHostname && l.ClientID != hostID:
			return fmt.Errorf("dnsmasq keyed the lease on client id %q, want the host name %s (%s)", l.ClientID, st.Hostname, hostID)
		case id == hfv1.DHCPClientIdentifierMAC && !nicKeyed(l.ClientID, l.MAC):
			return fmt.Errorf("mac mode: dnsmasq keyed the lease on client id %q, which is not the NIC's (%s)", l.ClientID, l.MAC)
		}
		if l.Hostname != st.Hostname {
			return fmt.Errorf("dnsmasq's lease names host %q, want %q (option 12)", l.Hostname, st.Hostname)
		}
		var addrs []string
		for _, a := range st.Addresses {
			ip, _, _ := strings.Cut(a, "/")
			addrs = append(addrs, ip)
		}
		if !slices.Contains(addrs, l.Addr.String()) {
			return fmt.Errorf("claim %s reports %v, not the lease's %s", claim.Name, st.Addresses, l.Addr)
		}
		// The guest's own view: that one address on eth0.
		return ipAddresses(ctx, w, vmid, netip.PrefixFrom(l.Addr, gn.Prefix.Bits()))
	}
}

// nicKeyed: a client identifier (dnsmasq's hex form) that the NIC's MAC
// address makes unique: none (the server keys on the MAC), 01 and the MAC
// (RFC 2132's hardware type 1), or RFC 4361's ff, an IAID of the MAC's
// last four bytes and a DUID, which ifupdown's dhclient -i sends
// (docs/cloud-init.md).
func nicKeyed(id, mac string) bool {
	mac = strings.ToLower(mac)
	return id == "" || id == "01:"+mac || strings.HasPrefix(id, "ff:"+mac[len("00:00:"):]+":")
}
