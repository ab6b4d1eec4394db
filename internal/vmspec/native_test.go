package vmspec

import (
	"reflect"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestNative: what a claim's VM gets from Proxmox's own cloud-init drive
// under each network mode, and nothing without delivery proxmox.
func TestNative(t *testing.T) {
	proxmoxTmpl := func(p *hfv1.ProxmoxCloudInit) *hfv1.HypervisorMachineTemplate {
		return &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
			CloudInit: &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: p}}}
	}
	kit := &hfv1.ProxmoxCloudInit{User: "ci", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA ops"}, VendorSnippet: "local:snippets/kit.yaml", DriveStorage: "ceph"}
	cases := []struct {
		name string
		tmpl *hfv1.HypervisorMachineTemplate
		dns  hfv1.DNSSettings
		vars cloudinit.Vars
		want *provider.NativeCloudInit
	}{
		{"iso", &hfv1.HypervisorMachineTemplate{}, hfv1.DNSSettings{}, cloudinit.Vars{NetworkMode: cloudinit.NetworkDHCP}, nil},
		{"dhcp with ipv6, domain first", proxmoxTmpl(kit), hfv1.DNSSettings{Domain: "ci.example.com"},
			cloudinit.Vars{NetworkMode: cloudinit.NetworkDHCP, IPv6: true, DNSServers: cloudinit.List{"192.0.2.53"}, SearchDomains: cloudinit.List{"example.com", "ci.example.com"}},
			&provider.NativeCloudInit{IPv4: "dhcp", IPv6: "dhcp", Nameservers: []string{"192.0.2.53"}, SearchDomains: []string{"ci.example.com", "example.com"},
				User: "ci", SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA ops"}, VendorData: "local:snippets/kit.yaml", Storage: "ceph"}},
		{"static ipv4", proxmoxTmpl(nil), hfv1.DNSSettings{},
			cloudinit.Vars{NetworkMode: cloudinit.NetworkStatic, StaticIP: "10.0.0.7", NetmaskBits: 24, Gateway: "10.0.0.1", SearchDomains: cloudinit.List{"lab"}},
			&provider.NativeCloudInit{IPv4: "10.0.0.7/24", Gateway4: "10.0.0.1", SearchDomains: []string{"lab"}}},
		{"static ipv6", proxmoxTmpl(&hfv1.ProxmoxCloudInit{UserSnippet: "local:snippets/user.yaml"}), hfv1.DNSSettings{},
			cloudinit.Vars{NetworkMode: cloudinit.NetworkStatic, StaticIP: "2001:db8::7", NetmaskBits: 64, Gateway: "2001:db8::1"},
			&provider.NativeCloudInit{IPv6: "2001:db8::7/64", Gateway6: "2001:db8::1", UserData: "local:snippets/user.yaml"}},
		{"dual stack", proxmoxTmpl(nil), hfv1.DNSSettings{},
			cloudinit.Vars{NetworkMode: cloudinit.NetworkStatic, StaticIP: "10.0.0.7", NetmaskBits: 24, Gateway: "10.0.0.1",
				StaticIPv6: "2001:db8::7", NetmaskBitsIPv6: 64, GatewayIPv6: "2001:db8::1"},
			&provider.NativeCloudInit{IPv4: "10.0.0.7/24", Gateway4: "10.0.0.1", IPv6: "2001:db8::7/64", Gateway6: "2001:db8::1"}},
	}
	for _, tc := range cases {
		got := Native(tc.tmpl, proxmoxCluster(), tc.dns, tc.vars)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: Native = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestTemplateHashNative: under delivery proxmox the template's
// cloudInit.proxmox fields reach the VM through its config, not through
// the rendered files, so changing them makes its VMs stale.
func TestTemplateHashNative(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	hash := func(p *hfv1.ProxmoxCloudInit) string {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.CloudInit = &hfv1.CloudInit{Delivery: hfv1.CloudInitDeliveryProxmox, Proxmox: p}
		h, err := TemplateHash(ws, tm, proxmoxCluster(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	seen := map[string]string{}
	for name, p := range map[string]*hfv1.ProxmoxCloudInit{
		"unset": nil, "user": {User: "ci"}, "other user": {User: "ops"}, "kit": {VendorSnippet: "local:snippets/kit.yaml"},
		"key": {SSHAuthorizedKeys: []string{"ssh-ed25519 AAAA a"}}, "drive": {DriveStorage: "ceph"},
	} {
		h := hash(p)
		if other, ok := seen[h]; ok {
			t.Errorf("%s and %s have the same template hash", name, other)
		}
		seen[h] = name
	}
}
