//go:build guest

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// staticPool fits QEMU's user network (the simulator's 10.99.0.0/24:
// slirp answers ARP for its gateway, 10.99.0.2, and its DNS, 10.99.0.3,
// from any guest address in the network), above the simulator's DHCP
// leases, which count up from 10.99.0.10.
var staticPool = hfv1.IPPoolSpec{
	Addresses:   []string{"10.99.0.240-10.99.0.249"},
	Prefix:      24,
	Gateways:    []string{"10.99.0.2"},
	Nameservers: []string{"10.99.0.3"},
}

// TestStaticAddressOnRealGuests: a template with network mode static and
// an IPPool. The guest's own network configuration, read through its
// guest agent (the agent's interface list, ip's addresses and routes,
// resolv.conf) and on its console (cloud-init's network table), is
// exactly the address, prefix, gateway and DNS the operator allocated;
// once the VM is gone the address is released.
func TestStaticAddressOnRealGuests(t *testing.T) {
	img := image
	pool := staticPool
	w, _, _ := runJobs(t, scenario{jobs: 1, opts: devenv.Options{GuestImage: &img, IPPool: &pool}, probe: probeStatic})
	eventually(t, time.Minute, "the IPPool has its address back", func() error {
		var p hfv1.IPPool
		if err := w.API.Client.Get(context.Background(), client.ObjectKey{Name: devenv.IPPoolName}, &p); err != nil {
			return err
		}
		if p.Status.Allocated != 0 || p.Status.Free != 10 {
			return fmt.Errorf("allocated %d, free %d, want 0 and 10", p.Status.Allocated, p.Status.Free)
		}
		return nil
	})
}

// probeStatic checks a guest's network against its claim's allocation.
func probeStatic(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
	if claim.Status.Network == nil || len(claim.Status.Network.IPAllocations) != 1 {
		return fmt.Errorf("claim %s: no single allocation yet", claim.Name)
	}
	alloc := claim.Status.Network.IPAllocations[0]
	want, err := netip.ParsePrefix(alloc.Address)
	if err != nil {
		return fmt.Errorf("claim %s: allocation %q: %w", claim.Name, alloc.Address, err)
	}
	if alloc.PoolRef != devenv.IPPoolName || alloc.Gateway != staticPool.Gateways[0] || want.Bits() != int(staticPool.Prefix) {
		return fmt.Errorf("claim %s: allocation %+v, want from %s with gateway %s and prefix %d", claim.Name, alloc, devenv.IPPoolName, staticPool.Gateways[0], staticPool.Prefix)
	}
	for _, check := range []func(context.Context, *devenv.World, int, netip.Prefix) error{agentInterfaces, ipAddresses, ipRoutes, resolvConf, consoleTable} {
		if err := check(ctx, w, vmid, want); err != nil {
			return err
		}
	}
	return nil
}

// agentInterfaces: guest-network-get-interfaces reports exactly the
// IPv4 address on eth0. (IPv6 is not the pool's: QEMU's router
// advertisements give the guest SLAAC addresses, as a real network's
// would.)
func agentInterfaces(ctx context.Context, w *devenv.World, vmid int, want netip.Prefix) error {
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
	var got []string
	for _, i := range ifs {
		for _, ip := range i.IPs {
			if i.Name == "eth0" && ip.Type == "ipv4" {
				got = append(got, fmt.Sprintf("%s/%d", ip.IP, ip.Prefix))
			}
		}
	}
	return onlyAddress("guest agent", got, want)
}

// ipAddresses: `ip -j addr` shows exactly the address on eth0.
func ipAddresses(ctx context.Context, w *devenv.World, vmid int, want netip.Prefix) error {
	var links []struct {
		AddrInfo []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
			Prefix int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := guestJSON(ctx, w, vmid, &links, "ip", "-j", "addr", "show", "dev", "eth0"); err != nil {
		return err
	}
	var got []string
	for _, l := range links {
		for _, a := range l.AddrInfo {
			if a.Family == "inet" {
				got = append(got, fmt.Sprintf("%s/%d", a.Local, a.Prefix))
			}
		}
	}
	return onlyAddress("ip addr", got, want)
}

// onlyAddress: the IPv4 addresses source reports on eth0 are exactly want.
func onlyAddress(source string, got []string, want netip.Prefix) error {
	if !slices.Equal(got, []string{want.String()}) {
		return fmt.Errorf("%s: eth0 has %v, want %s", source, got, want)
	}
	return nil
}

// ipRoutes: the one default route is via the pool's gateway on eth0.
func ipRoutes(ctx context.Context, w *devenv.World, vmid int, _ netip.Prefix) error {
	var routes []struct {
		Gateway string `json:"gateway"`
		Dev     string `json:"dev"`
	}
	if err := guestJSON(ctx, w, vmid, &routes, "ip", "-j", "-4", "route", "show", "default"); err != nil {
		return err
	}
	if len(routes) != 1 || routes[0].Gateway != staticPool.Gateways[0] || routes[0].Dev != "eth0" {
		return fmt.Errorf("ip route: default routes %+v, want one via %s on eth0", routes, staticPool.Gateways[0])
	}
	return nil
}

// resolvConf: the resolver is the pool's nameserver, only.
func resolvConf(ctx context.Context, w *devenv.World, vmid int, _ netip.Prefix) error {
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
	if !slices.Equal(got, staticPool.Nameservers) {
		return fmt.Errorf("resolv.conf names %v, want %v:\n%s", got, staticPool.Nameservers, res.Stdout)
	}
	return nil
}

// consoleTable: cloud-init's network tables on the console show the
// address with its netmask on eth0 and the default route via the gateway.
func consoleTable(_ context.Context, w *devenv.World, vmid int, want netip.Prefix) error {
	console, err := w.Proxmox.Console(vmid)
	if err != nil {
		return err
	}
	mask := net.IP(net.CIDRMask(want.Bits(), 32))
	addr := regexp.MustCompile(`ci-info: \|\s*eth0\s*\|\s*True\s*\|\s*` + regexp.QuoteMeta(want.Addr().String()) + `\s*\|\s*` + regexp.QuoteMeta(mask.String()) + `\s*\|`)
	route := regexp.MustCompile(`ci-info: \|\s*\d+\s*\|\s*0\.0\.0\.0\s*\|\s*` + regexp.QuoteMeta(staticPool.Gateways[0]) + `\s*\|\s*0\.0\.0\.0\s*\|\s*eth0\s*\|`)
	if !addr.Match(console) || !route.Match(console) {
		return fmt.Errorf("console: cloud-init's tables do not show %s (netmask %s) on eth0 (%t) and the default route via %s (%t)", want.Addr(), mask, addr.Match(console), staticPool.Gateways[0], route.Match(console))
	}
	return nil
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

// TestProxmoxDeliveryOnRealGuests: a template with cloudInit.delivery
// proxmox, network mode static and an IPPool runs a job end to end with
// no ISO at all. The operator sets the VM's ipconfig0 (the allocated
// address, prefix and gateway), nameserver and searchdomain; Proxmox's
// own cloud-init drive (the simulator generates it as qemu-server does)
// carries them and, as vendor-data, the static kit the platform team
// placed on a snippets storage (cloudinit.ProxmoxKit, here with the GitHub
// simulator's CA); the operator places the agent's configuration through
// the guest agent into /run/hyperfleet, where the kit's path unit starts
// the agent. The guest's network is exactly the allocation (probeStatic).
func TestProxmoxDeliveryOnRealGuests(t *testing.T) {
	img := image
	pool := staticPool
	_, _, tl := runJobs(t, scenario{jobs: 1, opts: devenv.Options{GuestImage: &img, IPPool: &pool, ProxmoxDelivery: true}, probe: probeStatic})
	if n := tl.placed.uploads(); n != 0 {
		t.Errorf("%d uploads to the simulator's storages under delivery proxmox, want none", n)
	}
}
