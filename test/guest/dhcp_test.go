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
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// TestDHCPClientIdentifierOnRealGuests: a template in network mode dhcp,
// its real guest on a bridge of its own (a network namespace the test
// creates) where dnsmasq is the DHCP server, once per
// network.dhcp.clientIdentifier. What dnsmasq recorded proves what the
// guest's DHCP client sent: in hostname mode the lease is keyed on the
// VM's host name as client identifier (option 61), in mac mode on no such
// identifier; the guest holds exactly that lease's address and the claim
// reports it (read through the guest agent). The job runs end to end over
// the namespace's forwarders.
//
// The hostname run is also the server-side static lease of
// network.dhcp.requestStaticLease, with a leaseTime: dnsmasq holds a
// reservation for the claim's host name (dhcp-host=<name>,<address>, added
// as soon as the claim exists, as a platform team adds one per name), at an
// address outside its range, and leases for 12 hours; the guest gets
// exactly the reserved address, and the lease file shows the 10 minutes
// the template asked for.
//
// The mac run also proves DNS and network validation, with no guest of
// its own: the operator registers the guest in a real BIND on the bridge
// and validates it from the host's side of the bridge, forward and reverse
// lookups at that BIND, ping and the guest's SSH host key
// (validateOnBridge, validation_test.go).
func TestDHCPClientIdentifierOnRealGuests(t *testing.T) {
	static := &hfv1.DHCPOptions{ClientIdentifier: hfv1.DHCPClientIdentifierHostname, RequestStaticLease: true,
		LeaseTime: &metav1.Duration{Duration: 10 * time.Minute}, Client: hfv1.DHCPClientISC}
	for i, dhcp := range []*hfv1.DHCPOptions{{ClientIdentifier: hfv1.DHCPClientIdentifierMAC}, static} {
		t.Run(string(dhcp.ClientIdentifier), func(t *testing.T) {
			gn, srv := dhcpNetwork(t, fmt.Sprintf("hf-dhcp-%d-%s", os.Getpid(), dhcp.ClientIdentifier), netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98, byte(i + 1), 0}), 24))
			img := image
			sc := scenario{jobs: 1, opts: devenv.Options{GuestImage: &img, GuestNetwork: gn, DHCP: dhcp}, probe: probeDHCP(gn, srv, dhcp)}
			if dhcp.RequestStaticLease {
				sc.onClaim = reserveFor(srv, gn.Addr(reservedOffset))
			}
			var validated func(*devenv.World)
			if dhcp.ClientIdentifier == hfv1.DHCPClientIdentifierMAC {
				var hostKeys func(context.Context, *devenv.World, int, hfv1.MachineClaim) error
				hostKeys, validated = validateOnBridge(t, gn, &sc.opts)
				sc.probe = probeAll(sc.probe, hostKeys)
			}
			w, _, _ := runJobs(t, sc)
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

// reservedOffset is the address dnsmasq reserves for a claim's host name,
// outside its range (.100-.199): only the reservation can lease it.
const reservedOffset = 50

// reserveFor reserves addr for each claim's host name, once.
func reserveFor(srv *guestnet.DHCPServer, addr netip.Addr) func(hfv1.MachineClaim) error {
	done := map[string]bool{}
	return func(claim hfv1.MachineClaim) error {
		name := vmspec.Hostname(&claim, "")
		if done[name] {
			return nil
		}
		if len(done) > 0 {
			return fmt.Errorf("a second claim (%s) in a one-job scenario; the reservation is %v's", name, done)
		}
		done[name] = true
		return srv.Reserve(name, addr)
	}
}

// dhcpNetwork creates the namespace with its bridge and runs dnsmasq on
// it, leasing .100-.199 for 12 hours; both go when the test ends, after
// its world.
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
	srv, err := gn.StartDHCP(t.TempDir(), gn.Addr(100), gn.Addr(199), 12*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	return gn, srv
}

// probeDHCP checks a guest's lease against dnsmasq's records.
func probeDHCP(gn *guestnet.Network, srv *guestnet.DHCPServer, dhcp *hfv1.DHCPOptions) func(context.Context, *devenv.World, int, hfv1.MachineClaim) error {
	id := dhcp.ClientIdentifier
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
		switch {
		case dhcp.RequestStaticLease && l.Addr != gn.Addr(reservedOffset):
			return fmt.Errorf("lease %s is not the address reserved for %s (%s)", l.Addr, st.Hostname, gn.Addr(reservedOffset))
		case !dhcp.RequestStaticLease && (l.Addr.Less(gn.Addr(100)) || gn.Addr(199).Less(l.Addr)):
			return fmt.Errorf("lease %s is outside dnsmasq's range", l.Addr)
		}
		if err := checkLeaseTime(l, dhcp.LeaseTime); err != nil {
			return err
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
		return ipAddresses(ctx, w, vmid, addressPlan{v4: netip.PrefixFrom(l.Addr, gn.Prefix.Bits())})
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

// checkLeaseTime: with a leaseTime the lease ends within that time of now
// (not the range's 12 hours) and, since the client renews halfway, not
// before half of it less a minute's slack has gone by.
func checkLeaseTime(l guestnet.Lease, want *metav1.Duration) error {
	if want == nil {
		return nil
	}
	left := time.Until(l.Expires)
	if left > want.Duration+2*time.Second || left < want.Duration/2-time.Minute {
		return fmt.Errorf("lease %s ends in %s, want at most the %s the template asked for (and over half of it: the client renews halfway)", l.Addr, left.Round(time.Second), want.Duration)
	}
	return nil
}

// probeAll is a probe that runs each of probes in turn on a guest; the
// guest is probed again until all of them pass.
func probeAll(probes ...func(context.Context, *devenv.World, int, hfv1.MachineClaim) error) func(context.Context, *devenv.World, int, hfv1.MachineClaim) error {
	return func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
		for _, p := range probes {
			if p == nil {
				continue
			}
			if err := p(ctx, w, vmid, claim); err != nil {
				return err
			}
		}
		return nil
	}
}
