package libvirtd

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"
)

// DefinePool defines a storage pool of type dir at path (made if missing),
// starts it and returns it. It stays until the daemon ends.
func (d *Daemon) DefinePool(t testing.TB, name, path string) libvirt.StoragePool {
	t.Helper()
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("libvirtd: pool %s: %v", name, err)
	}
	return d.definePool(t, name, path)
}

// DefineSmallPool defines and starts a dir pool named name on a tmpfs of
// size bytes mounted, inside the daemon's mount namespace only, at
// Dir()/name; it returns the pool's path. It is the storage-pool-full
// fault: a volume that does not fit fails with "No space left on device".
// A few KiB are already too small for a qcow2 overlay (it needs about
// 200 KiB). The host sees the empty directory under the tmpfs, not its
// files: read them through libvirt.
func (d *Daemon) DefineSmallPool(t testing.TB, name string, size int64) (libvirt.StoragePool, string) {
	t.Helper()
	path := d.Dir() + "/" + name
	if err := os.MkdirAll(path, 0o755); err != nil {
		t.Fatalf("libvirtd: pool %s: %v", name, err)
	}
	if _, err := d.inside("mount", "-t", "tmpfs", "-o", "size="+strconv.FormatInt(size, 10), "hf-small-pool", path); err != nil {
		t.Fatal(err)
	}
	return d.definePool(t, name, path), path
}

func (d *Daemon) definePool(t testing.TB, name, path string) libvirt.StoragePool {
	t.Helper()
	doc, err := (&libvirtxml.StoragePool{Type: "dir", Name: name, Target: &libvirtxml.StoragePoolTarget{Path: path}}).Marshal()
	if err != nil {
		t.Fatalf("libvirtd: pool %s XML: %v", name, err)
	}
	l := d.Dial(t)
	pool, err := l.StoragePoolDefineXML(doc, 0)
	if err != nil {
		t.Fatalf("libvirtd: defining pool %s: %v", name, err)
	}
	if err := l.StoragePoolCreate(pool, 0); err != nil {
		t.Fatalf("libvirtd: starting pool %s: %v", name, err)
	}
	return pool
}

// DefineNetwork defines and starts an isolated network (no forwarding)
// named name on subnet, with the subnet's first address on its bridge and
// DHCP serving the rest. It lives in the daemon's private network
// namespace, so any subnet will do and none collides with another test's.
func (d *Daemon) DefineNetwork(t testing.TB, name string, subnet netip.Prefix) libvirt.Network {
	t.Helper()
	if d.hostNetwork {
		t.Fatal("libvirtd: a daemon in the host's network namespace (HostNetwork) defines no network: its bridge and dnsmasq would be the host's")
	}
	doc, err := networkXML(name, subnet)
	if err != nil {
		t.Fatal(err)
	}
	l := d.Dial(t)
	network, err := l.NetworkDefineXML(doc)
	if err != nil {
		t.Fatalf("libvirtd: defining network %s: %v", name, err)
	}
	if err := l.NetworkCreate(network); err != nil {
		t.Fatalf("libvirtd: starting network %s: %v\n%s", name, err, d.Logs())
	}
	return network
}

// networkXML describes an isolated network with DHCP over subnet's
// addresses after the bridge's (the first).
func networkXML(name string, subnet netip.Prefix) (string, error) {
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 29 {
		return "", fmt.Errorf("libvirtd: network %s: %s: want an IPv4 network of /29 or larger", name, subnet)
	}
	bridge := subnet.Addr().Next()
	// The leases run from the bridge's next address to the one before the
	// broadcast address, at most 253 of them.
	end := bridge.Next()
	for i := 0; i < 252 && subnet.Contains(end.Next().Next()); i++ {
		end = end.Next()
	}
	doc, err := (&libvirtxml.Network{
		Name:   name,
		Bridge: &libvirtxml.NetworkBridge{STP: "off", Delay: "0"},
		IPs: []libvirtxml.NetworkIP{{
			Address: bridge.String(),
			Prefix:  uint(subnet.Bits()),
			DHCP: &libvirtxml.NetworkDHCP{Ranges: []libvirtxml.NetworkDHCPRange{{
				Start: bridge.Next().String(),
				End:   end.String(),
			}}},
		}},
	}).Marshal()
	if err != nil {
		return "", fmt.Errorf("libvirtd: network %s XML: %w", name, err)
	}
	return doc, nil
}
