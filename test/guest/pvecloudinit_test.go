//go:build guest

package guest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// pveTestKey is an SSH public key for the ci user, in authorized_keys
// form; its private key is thrown away: the test only checks that the key
// lands in the guest.
var pveTestKey = func() string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	// The SSH wire format: the type and the key, each length-prefixed.
	var wire []byte
	for _, part := range [][]byte{[]byte("ssh-ed25519"), pub} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(part)))
		wire = append(wire, part...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(wire) + " hyperfleet-test"
}()

// TestProxmoxCloudInitDriveOnRealGuests boots a real Debian guest with no
// ISO at all, only Proxmox's own cloud-init drive (the template's ide2:
// <storage>:cloudinit) generated from the VM's ipconfig0, nameserver,
// searchdomain, ciuser, sshkeys and ciupgrade fields, as qemu-server
// generates it at start (the simulator renders it byte for byte,
// TestProxmoxCloudInitFiles). The guest must come up with exactly that
// static address, gateway and resolver, the VM's name as host name with
// the search domain as FQDN, and the user with the key: what
// spec.cloudInit.delivery proxmox would rely on (docs/cloud-init.md,
// "Delivery"). The operator is not involved: it refuses that delivery for
// now.
func TestProxmoxCloudInitDriveOnRealGuests(t *testing.T) {
	c, sim := startGuestSimulator(t, t.TempDir())
	const vmid, name = 102, "pve-ci-102"
	// Inside QEMU's user network (the simulator's 10.99.0.0/24), above its
	// DHCP leases: the same address plan as TestStaticAddressOnRealGuests.
	want := netip.MustParsePrefix("10.99.0.241/24")

	c.task(c.must("POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {fmt.Sprint(vmid)}, "name": {name}}), time.Minute)
	var conf map[string]any
	_ = json.Unmarshal(c.must("GET", fmt.Sprintf("/nodes/pve1/qemu/%d/config", vmid), nil), &conf)
	if d, _ := conf["ide2"].(string); !strings.Contains(d, "cloudinit") {
		t.Fatalf("the clone has no Proxmox cloud-init drive on ide2: %v", conf["ide2"])
	}
	c.must("PUT", fmt.Sprintf("/nodes/pve1/qemu/%d/config", vmid), url.Values{
		"ipconfig0":    {"ip=" + want.String() + ",gw=" + staticPool.Gateways[0]},
		"nameserver":   {staticPool.Nameservers[0]},
		"searchdomain": {"ci.example.com"},
		"ciuser":       {"ci"},
		// Proxmox takes the keys URL-encoded (%20 for spaces, not +).
		"sshkeys":   {strings.ReplaceAll(url.QueryEscape(pveTestKey+"\n"), "+", "%20")},
		"ciupgrade": {"0"},
	})

	start := time.Now()
	c.task(c.must("POST", fmt.Sprintf("/nodes/pve1/qemu/%d/status/start", vmid), nil), time.Minute)
	w := &devenv.World{Proxmox: sim}
	ctx := context.Background()
	eventually(t, 8*time.Minute, "the guest agent reports the ipconfig0 address on eth0", func() error {
		return agentInterfaces(ctx, w, vmid, slirpPlan(want))
	})
	t.Logf("guest agent reports %s after %s", want, time.Since(start).Round(time.Second))
	eventually(t, 5*time.Minute, "cloud-init has finished", func() error {
		return guestOutput(ctx, sim, vmid, "status: done", "cloud-init", "status")
	})
	for _, check := range []func(context.Context, *devenv.World, int, addressPlan) error{ipAddresses, ipRoutes, resolvConf, consoleTable} {
		if err := check(ctx, w, vmid, slirpPlan(want)); err != nil {
			t.Error(err)
		}
	}
	if err := guestOutput(ctx, sim, vmid, "ci:", "getent", "passwd", "ci"); err != nil {
		t.Errorf("ciuser: %v", err)
	}
	if err := guestOutput(ctx, sim, vmid, pveTestKey, "cat", "/home/ci/.ssh/authorized_keys"); err != nil {
		t.Errorf("sshkeys: %v", err)
	}
	if err := guestOutput(ctx, sim, vmid, name+".ci.example.com", "hostname", "--fqdn"); err != nil {
		t.Errorf("name and searchdomain: %v", err)
	}
	c.task(c.must("POST", fmt.Sprintf("/nodes/pve1/qemu/%d/status/stop", vmid), nil), time.Minute)
	c.task(c.must("DELETE", fmt.Sprintf("/nodes/pve1/qemu/%d", vmid), nil), time.Minute)
}

// guestOutput runs argv in the guest and wants it to succeed with want in
// its output.
func guestOutput(ctx context.Context, sim *proxmoxsim.Simulator, vmid int, want string, argv ...string) error {
	res, err := sim.GuestExec(ctx, vmid, argv...)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, want) {
		return fmt.Errorf("%v in the guest: exit %d, output %q (stderr %q), want %q in it", argv, res.ExitCode, res.Stdout, res.Stderr, want)
	}
	return nil
}
