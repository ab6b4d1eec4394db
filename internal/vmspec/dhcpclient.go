package vmspec

import (
	"fmt"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// DHCPClientProblem says why the image's DHCP client, as the template
// declares it (spec.network.dhcp.client), cannot do what the template's
// spec.network.dhcp asks, or "" when it can. The operator configures the
// client from the VM's cloud-config (docs/cloud-init.md), and only
// isc-dhcp-client can be told to send a client identifier, a host name or
// a lease time from there: cloud-init's network config has no key for
// either option, and neither netplan nor cloud-init's networkd renderer
// writes networkd's SendOption=. Refusing the template here, not in the
// guest, keeps a claim from booting a VM that would never get its address.
// A template that leaves client unset keeps clientIdentifier hostname's
// behaviour of earlier versions (the guest reports an image without
// dhclient); the API requires client with the two newer options.
func DHCPClientProblem(tmpl *hfv1.HypervisorMachineTemplate) string {
	n := tmpl.Spec.Network
	d := n.DHCP
	if (n.Mode != hfv1.NetworkModeDHCP && n.Mode != "") || d == nil || d.Client == "" || d.Client == hfv1.DHCPClientISC {
		return ""
	}
	var asks []string
	if d.RequestStaticLease {
		asks = append(asks, "requestStaticLease")
	}
	if d.LeaseTime != nil {
		asks = append(asks, "leaseTime")
	}
	if d.ClientIdentifier == hfv1.DHCPClientIdentifierHostname {
		asks = append(asks, "clientIdentifier hostname")
	}
	if len(asks) == 0 {
		return ""
	}
	return fmt.Sprintf(
		"spec.network.dhcp.client: %s cannot be configured through cloud-init for spec.network.dhcp %s (cloud-init's network config has no key for a client identifier of the host name or for a lease time; docs/networking.md); remove %s, or use an image with isc-dhcp-client (ifupdown, such as Debian 12's cloud images) and set client: %s",
		d.Client, strings.Join(asks, ", "), strings.Join(asks, ", "), hfv1.DHCPClientISC)
}
