//go:build guest

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
)

// The dual-stack static scenario's network: a bridge in a network
// namespace of its own (QEMU's user network has no IPv6 network a pool
// could use), at .1 and ::1 of these prefixes, with a pool of ten
// addresses in each family. The bridge is the gateway of both; it serves
// no DNS, and the guests reach the world's servers over the namespace's
// forwarders (as TestDHCPClientIdentifierOnRealGuests' do).
var (
	dualNet4 = netip.MustParsePrefix("10.98.10.0/24")
	dualNet6 = netip.MustParsePrefix("fd00:98:10::/64")
	dualV4   = hfv1.IPPoolSpec{
		Addresses:   []string{"10.98.10.240-10.98.10.249"},
		Prefix:      24,
		Gateways:    []string{"10.98.10.1"},
		Nameservers: []string{"10.98.10.1"},
	}
	dualV6 = hfv1.IPPoolSpec{
		Addresses: []string{"fd00:98:10::f0-fd00:98:10::f9"},
		Prefix:    64,
		Gateways:  []string{"fd00:98:10::1"},
	}
)

// staticDualStack is the dual-stack static scenario's part of a world: a
// template in network mode static with an IPv4 and an IPv6 IPPool
// (dualV4, dualV6), its real guests on a bridge of both prefixes in a
// network namespace named name (no DHCP: the seed's network-config is all
// the guest gets), and the probe of the guest's network against its
// claim's two allocations (probeDualStack).
func staticDualStack(t *testing.T, name string, opts *devenv.Options) func(context.Context, *devenv.World, int, hfv1.MachineClaim) error {
	t.Helper()
	gn := dualStackNetwork(t, name)
	v4, v6 := dualV4, dualV6
	opts.GuestNetwork, opts.IPPool, opts.IPv6Pool = gn, &v4, &v6
	return probeDualStack(gn)
}

// poolsReleased: once the VMs are gone, both IPPools have every address
// back.
func poolsReleased(t *testing.T, w *devenv.World) {
	t.Helper()
	eventually(t, time.Minute, "the IPPools have their addresses back", func() error {
		for _, name := range []string{devenv.IPPoolName, devenv.IPv6PoolName} {
			var p hfv1.IPPool
			if err := w.API.Client.Get(context.Background(), client.ObjectKey{Name: name}, &p); err != nil {
				return err
			}
			if p.Status.Allocated != 0 || p.Status.Free != 10 {
				return fmt.Errorf("IPPool %s: allocated %d, free %d, want 0 and 10", name, p.Status.Allocated, p.Status.Free)
			}
		}
		return nil
	})
}

// dualStackNetwork creates the dual-stack scenario's namespace: its bridge
// at .1 of dualNet4 and ::1 of dualNet6. It goes when the test ends, after
// its world.
func dualStackNetwork(t *testing.T, name string) *guestnet.Network {
	t.Helper()
	gn, err := guestnet.Create(name, dualNet4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := gn.Close(); err != nil {
			t.Errorf("remove the guests' network: %v", err)
		}
	})
	if err := gn.AddIPv6(dualNet6); err != nil {
		t.Fatal(err)
	}
	return gn
}

// addressPlan is what a guest's static network must be: its IPv4 address
// and, for a dual-stack guest, its IPv6 one (invalid otherwise), with
// their gateways and the resolvers.
type addressPlan struct {
	v4, v6      netip.Prefix
	gw4, gw6    string
	nameservers []string
}

// probeDualStack checks a guest's network against its claim's two
// allocations.
func probeDualStack(gn *guestnet.Network) func(context.Context, *devenv.World, int, hfv1.MachineClaim) error {
	return func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
		st := claim.Status.Network
		if st == nil || len(st.IPAllocations) != 2 {
			return fmt.Errorf("claim %s: not two allocations yet", claim.Name)
		}
		plan := addressPlan{gw4: dualV4.Gateways[0], gw6: dualV6.Gateways[0], nameservers: dualV4.Nameservers}
		for i, want := range []struct {
			pool string
			spec hfv1.IPPoolSpec
			into *netip.Prefix
		}{{devenv.IPPoolName, dualV4, &plan.v4}, {devenv.IPv6PoolName, dualV6, &plan.v6}} {
			alloc := st.IPAllocations[i]
			p, err := netip.ParsePrefix(alloc.Address)
			if err != nil || alloc.PoolRef != want.pool || alloc.Gateway != want.spec.Gateways[0] || p.Bits() != int(want.spec.Prefix) {
				return fmt.Errorf("claim %s: allocation %d is %+v, want one from %s with gateway %s and prefix %d", claim.Name, i, alloc, want.pool, want.spec.Gateways[0], want.spec.Prefix)
			}
			*want.into = p
		}
		for _, a := range []netip.Prefix{plan.v4, plan.v6} {
			if !slices.Contains(st.Addresses, a.Addr().String()) {
				return fmt.Errorf("claim %s reports addresses %v, without %s", claim.Name, st.Addresses, a.Addr())
			}
		}
		checks := []func(context.Context, *devenv.World, int, addressPlan) error{agentInterfaces, ipAddresses, ipRoutes, resolvConf, consoleTable, ipv6Carries(gn)}
		for _, check := range checks {
			if err := check(ctx, w, vmid, plan); err != nil {
				return err
			}
		}
		return nil
	}
}

// agentInterfaces: guest-network-get-interfaces reports exactly the plan's
// IPv4 address on eth0 and, for a dual-stack guest, exactly its IPv6
// address besides the link-local one. (A single-stack guest on QEMU's user
// network also has SLAAC addresses from QEMU's router advertisements, as
// on a real network: its IPv6 addresses are not checked.)
func agentInterfaces(ctx context.Context, w *devenv.World, vmid int, plan addressPlan) error {
	var ifs []struct {
		Name string `json:"name"`
		IPs  []struct {
			IP     string `json:"ip-address"`
			Type   string `json:"ip-address-type"`
			Prefix int    `json:"prefix"`
		} `json:"ip-addresses"`
	}
	if err := w.Proxmox.GuestAgentCall(ctx, vmid, "guest-network-get-interfaces", &ifs); err != nil {
		return err
	}
	var v4, v6 []string
	for _, i := range ifs {
		for _, ip := range i.IPs {
			a, err := netip.ParseAddr(ip.IP)
			switch {
			case i.Name != "eth0" || err != nil || a.IsLinkLocalUnicast():
			case ip.Type == "ipv4":
				v4 = append(v4, fmt.Sprintf("%s/%d", ip.IP, ip.Prefix))
			case ip.Type == "ipv6":
				v6 = append(v6, fmt.Sprintf("%s/%d", ip.IP, ip.Prefix))
			}
		}
	}
	return onlyAddresses("guest agent", v4, v6, plan)
}

// ipAddresses: `ip -j addr` shows exactly the plan's addresses on eth0
// (IPv6: those of global scope, for a dual-stack guest).
func ipAddresses(ctx context.Context, w *devenv.World, vmid int, plan addressPlan) error {
	var links []struct {
		AddrInfo []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Prefix int    `json:"prefixlen"`
			Scope  string `json:"scope"`
		} `json:"addr_info"`
	}
	if err := guestJSON(ctx, w, vmid, &links, "ip", "-j", "addr", "show", "dev", "eth0"); err != nil {
		return err
	}
	var v4, v6 []string
	for _, l := range links {
		for _, a := range l.AddrInfo {
			switch {
			case a.Family == "inet":
				v4 = append(v4, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
			case a.Family == "inet6" && a.Scope == "global":
				v6 = append(v6, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
			}
		}
	}
	return onlyAddresses("ip addr", v4, v6, plan)
}

// onlyAddresses: the IPv4 addresses source reports on eth0 are exactly the
// plan's, and so are the IPv6 ones of a dual-stack plan.
func onlyAddresses(source string, v4, v6 []string, plan addressPlan) error {
	if !slices.Equal(v4, []string{plan.v4.String()}) {
		return fmt.Errorf("%s: eth0 has IPv4 %v, want %s", source, v4, plan.v4)
	}
	if plan.v6.IsValid() && !slices.Equal(v6, []string{plan.v6.String()}) {
		return fmt.Errorf("%s: eth0 has IPv6 %v, want %s", source, v6, plan.v6)
	}
	return nil
}

// ipRoutes: the one IPv4 default route is via the plan's gateway on eth0,
// and so is the one IPv6 default route of a dual-stack plan.
func ipRoutes(ctx context.Context, w *devenv.World, vmid int, plan addressPlan) error {
	families := []struct{ flag, gw string }{{"-4", plan.gw4}}
	if plan.v6.IsValid() {
		families = append(families, struct{ flag, gw string }{"-6", plan.gw6})
	}
	for _, f := range families {
		var routes []struct {
			Gateway string `json:"gateway"`
			Dev     string `json:"dev"`
		}
		if err := guestJSON(ctx, w, vmid, &routes, "ip", "-j", f.flag, "route", "show", "default"); err != nil {
			return err
		}
		if len(routes) != 1 || routes[0].Gateway != f.gw || routes[0].Dev != "eth0" {
			return fmt.Errorf("ip %s route: default routes %+v, want one via %s on eth0", f.flag, routes, f.gw)
		}
	}
	return nil
}

// resolvConf: the resolvers are the plan's, only.
func resolvConf(ctx context.Context, w *devenv.World, vmid int, plan addressPlan) error {
	res, err := w.Proxmox.GuestExec(ctx, vmid, "cat", "/etc/resolv.conf")
	if err != nil {
		return err
	}
	var got []string
	for _, line := range strings.Split(res.Stdout, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "nameserver" {
			got = append(got, f[1])
		}
	}
	if !slices.Equal(got, plan.nameservers) {
		return fmt.Errorf("resolv.conf names %v, want %v:\n%s", got, plan.nameservers, res.Stdout)
	}
	return nil
}

// consoleTable: cloud-init's network tables on the console show the IPv4
// address with its netmask on eth0 and the default route via the gateway.
func consoleTable(_ context.Context, w *devenv.World, vmid int, plan addressPlan) error {
	console, err := w.Proxmox.Console(vmid)
	if err != nil {
		return err
	}
	want := plan.v4
	mask := net.IP(net.CIDRMask(want.Bits(), 32))
	addr := regexp.MustCompile(`ci-info: \|\s*eth0\s*\|\s*True\s*\|\s*` + regexp.QuoteMeta(want.Addr().String()) + `\s*\|\s*` + regexp.QuoteMeta(mask.String()) + `\s*\|`)
	route := regexp.MustCompile(`ci-info: \|\s*\d+\s*\|\s*0\.0\.0\.0\s*\|\s*` + regexp.QuoteMeta(plan.gw4) + `\s*\|\s*0\.0\.0\.0\s*\|\s*eth0\s*\|`)
	if !addr.Match(console) || !route.Match(console) {
		return fmt.Errorf("console: cloud-init's tables do not show %s (netmask %s) on eth0 (%t) and the default route via %s (%t)", want.Addr(), mask, addr.Match(console), plan.gw4, route.Match(console))
	}
	return nil
}

// ipv6Carries: the guest's IPv6 address carries traffic: the guest opens
// a TCP connection to a server on the bridge's IPv6 address, which sees it
// come from the plan's address.
func ipv6Carries(gn *guestnet.Network) func(context.Context, *devenv.World, int, addressPlan) error {
	return func(ctx context.Context, w *devenv.World, vmid int, plan addressPlan) error {
		ln, err := gn.Listen(net.JoinHostPort(gn.Host6.String(), "0"))
		if err != nil {
			return err
		}
		defer ln.Close()
		accepted := make(chan net.Addr, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c.RemoteAddr()
			_ = c.Close()
		}()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		// bash's /dev/tcp: the guest image need not have a client.
		res, err := w.Proxmox.GuestExec(ctx, vmid, "bash", "-c", `exec 3<>"/dev/tcp/$1/$2"`, "connect", gn.Host6.String(), port)
		if err != nil {
			return err
		}
		if res.ExitCode != 0 {
			return fmt.Errorf("the guest could not connect to [%s]:%s: exit %d: %s", gn.Host6, port, res.ExitCode, res.Stderr)
		}
		select {
		case from := <-accepted:
			ap, err := netip.ParseAddrPort(fmt.Sprint(from))
			if err != nil || ap.Addr() != plan.v6.Addr() {
				return fmt.Errorf("the guest's connection came from %v, want %s", from, plan.v6.Addr())
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("the server on [%s]:%s saw no connection: %w", gn.Host6, port, ctx.Err())
		}
	}
}

// guestJSON runs argv in the guest and decodes its output.
func guestJSON(ctx context.Context, w *devenv.World, vmid int, out any, argv ...string) error {
	res, err := w.Proxmox.GuestExec(ctx, vmid, argv...)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("%v in the guest: exit %d: %s", argv, res.ExitCode, res.Stderr)
	}
	if err := json.Unmarshal([]byte(res.Stdout), out); err != nil {
		return fmt.Errorf("%v in the guest: %w: %s", argv, err, res.Stdout)
	}
	return nil
}

// TestProxmoxDeliveryOnRealGuests: a dual-stack template (an IPv4 and an
// IPv6 IPPool) with cloudInit.delivery proxmox runs a job end to end with
// no ISO at all. The operator sets the VM's ipconfig0 (both allocated
// addresses with their prefixes and gateways: ip=, gw=, ip6=, gw6=),
// nameserver, searchdomain (the IPv4 pool's search domain), ciuser and
// sshkeys (the template's spec.cloudInit.proxmox.user and
// sshAuthorizedKeys) and ciupgrade 0; Proxmox's own cloud-init drive (the
// simulator generates it as qemu-server does) carries them and, as
// vendor-data, the static kit the platform team placed on a snippets
// storage (kit.VendorData of pkg/provider/proxmox/kit, here with the GitHub simulator's CA); the
// operator places the agent's configuration through the guest agent into
// /run/hyperfleet, where the kit's path unit starts the agent. The guest's
// network is exactly the two allocations (probeDualStack), as with the
// NoCloud ISO in TestTPMAndStaticAddressOnRealGuest; the guest has the
// user with the key in its authorized_keys, and its FQDN is the VM's name
// in the search domain (probeProxmoxUser).
func TestProxmoxDeliveryOnRealGuests(t *testing.T) {
	gn := dualStackNetwork(t, fmt.Sprintf("hf-pvedel-%d", os.Getpid()))
	img := image
	v4, v6 := dualV4, dualV6
	v4.SearchDomains = []string{pveSearchDomain}
	dualStack := probeDualStack(gn)
	_, _, tl := runJobs(t, scenario{jobs: 1,
		opts: devenv.Options{GuestImage: &img, GuestNetwork: gn, IPPool: &v4, IPv6Pool: &v6, ProxmoxDelivery: true,
			ProxmoxUser: pveUser, ProxmoxSSHKeys: []string{pveTestKey}},
		probe: func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
			if err := dualStack(ctx, w, vmid, claim); err != nil {
				return err
			}
			return probeProxmoxUser(ctx, w, vmid, claim)
		}})
	if n := tl.placed.uploads(); n != 0 {
		t.Errorf("%d uploads to the simulator's storages under delivery proxmox, want none", n)
	}
}
