//go:build guest

package guest

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// pveTestKey is an SSH public key for the user Proxmox's drive creates,
// in authorized_keys form; its private key is thrown away: the test only
// checks that the key lands in the guest.
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

// The user and search domain of TestProxmoxDeliveryOnRealGuests' template
// and IPv4 pool.
const (
	pveUser         = "ci"
	pveSearchDomain = "ci.example.com"
)

// probeProxmoxUser: what Proxmox's cloud-init drive carried besides the
// network reached the guest. Real cloud-init made the drive's ciuser with
// the sshkeys key in its authorized_keys, and the host name is the VM's
// name (the claim's) with the searchdomain as FQDN.
func probeProxmoxUser(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
	if err := guestOutput(ctx, w.Proxmox, vmid, pveUser+":", "getent", "passwd", pveUser); err != nil {
		return fmt.Errorf("ciuser: %w", err)
	}
	if err := guestOutput(ctx, w.Proxmox, vmid, pveTestKey, "cat", "/home/"+pveUser+"/.ssh/authorized_keys"); err != nil {
		return fmt.Errorf("sshkeys: %w", err)
	}
	if err := guestOutput(ctx, w.Proxmox, vmid, claim.Name+"."+pveSearchDomain, "hostname", "--fqdn"); err != nil {
		return fmt.Errorf("name and searchdomain: %w", err)
	}
	return nil
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
