package isolation

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

type fakeResolver map[string][]netip.Addr

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := f[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host " + host)
}

func isolatedCluster() *hfv1.HypervisorCluster {
	c := &hfv1.HypervisorCluster{}
	c.Name = "pve"
	c.Spec.DNS = &hfv1.ClusterDNSSettings{DNSSettings: hfv1.DNSSettings{Servers: []string{"192.0.2.53"}}}
	c.Spec.Network = &hfv1.ClusterNetworkSettings{
		VMSubnets: []string{"192.0.2.0/24"},
		Isolation: &hfv1.NetworkIsolation{
			OperatorCIDRs:   []string{"198.51.100.5"},
			ManagementCIDRs: []string{"10.0.0.0/24"},
			DefaultPolicy:   "web",
			Policies: []hfv1.IsolationPolicy{
				{Name: "web", Egress: []hfv1.EgressRule{{CIDRs: []string{"0.0.0.0/0"}, Protocol: hfv1.IsolationTCP, Ports: []string{"443", "8000-8100"}}}},
				{Name: "closed"},
			},
		},
	}
	return c
}

// TestCompileOrder: the platform team's endpoints first, then the denied
// networks, then what a tenant chose (DNS anywhere only without cluster
// servers, the proxy), then the policy; ingress only from the operator.
func TestCompileOrder(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Attestation.Method = hfv1.AttestationJoinToken
	tmpl.Spec.Network.Proxy = &hfv1.ProxySettings{HTTPProxy: "http://proxy.example:3128", HTTPSProxy: "http://proxy.example:3128"}
	cluster := isolatedCluster()
	cluster.Spec.Network.Validation = &hfv1.NetworkValidation{SSHTest: true, SSHPort: 2222}
	cluster.Spec.SPIRE = &hfv1.SPIREConfig{ServerAddress: "spire.example:8081"}
	res := fakeResolver{"proxy.example": {netip.MustParseAddr("203.0.113.8")}, "spire.example": {netip.MustParseAddr("198.51.100.81")}}
	iso, err := Compile(context.Background(), tmpl, cluster, Operator{Ports: []uint16{9443}}, res)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range iso.Egress {
		got = append(got, string(r.Action)+" "+r.CIDR+" "+r.Protocol+" "+portsOf(r))
	}
	want := []string{
		"accept 198.51.100.5 tcp 9443",
		"accept 198.51.100.81 tcp 8081",
		"accept 192.0.2.53 udp 53", "accept 192.0.2.53 tcp 53",
		"drop 10.0.0.0/24  ", "drop 192.0.2.0/24  ",
		"accept 203.0.113.8 tcp 3128",
		"accept 0.0.0.0/0 tcp 443,8000:8100",
	}
	if !slices.Equal(got, want) {
		t.Errorf("egress:\n got %q\nwant %q", got, want)
	}
	got = nil
	for _, r := range iso.Ingress {
		got = append(got, string(r.Action)+" "+r.CIDR+" "+r.Protocol+" "+portsOf(r))
	}
	if want := []string{"accept 198.51.100.5 icmp ", "accept 198.51.100.5 tcp 2222"}; !slices.Equal(got, want) {
		t.Errorf("ingress:\n got %q\nwant %q", got, want)
	}
	if iso.Policy != "web" || !iso.DHCP || !slices.Equal(iso.AddressSubnets, []string{"192.0.2.0/24"}) {
		t.Errorf("policy %q, DHCP %v, subnets %v", iso.Policy, iso.DHCP, iso.AddressSubnets)
	}
}

// TestCompileDNSWithoutServers: a cluster that names no DNS servers lets
// port 53 through anywhere, but only after the denied networks.
func TestCompileDNSWithoutServers(t *testing.T) {
	cluster := isolatedCluster()
	cluster.Spec.DNS = nil
	cluster.Spec.SPIRE = &hfv1.SPIREConfig{ServerAddress: "spire.example:8081"}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Network.IsolationPolicy = "closed"
	iso, err := Compile(context.Background(), tmpl, cluster, Operator{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	firstDNS := slices.IndexFunc(iso.Egress, func(r provider.FirewallRule) bool { return r.Comment == "DNS" })
	lastDrop := -1
	for i, r := range iso.Egress {
		if r.Action == provider.FirewallDrop {
			lastDrop = i
		}
	}
	if firstDNS < 0 || iso.Egress[firstDNS].CIDR != "" || firstDNS < lastDrop {
		t.Errorf("DNS to anywhere must follow the denied networks: %+v", iso.Egress)
	}
	if slices.ContainsFunc(iso.Egress, func(r provider.FirewallRule) bool { return r.Comment == "the cluster's SPIRE server" }) {
		t.Error("a template that does not attest was let through to the SPIRE server")
	}
	if slices.ContainsFunc(iso.Egress, func(r provider.FirewallRule) bool { return r.Comment == "the operator's agent server" }) {
		t.Error("an operator that serves VMs nothing opened a port to itself")
	}
	if slices.ContainsFunc(iso.Egress, func(r provider.FirewallRule) bool { return r.Comment == "policy egress" }) {
		t.Error("the policy without egress allowed some")
	}
}

// TestPolicyFor: the template's policy, else the cluster's default, else
// the built-in one; a policy the cluster does not define, or any on a
// cluster without isolation, is ErrPolicyNotFound naming the field.
func TestPolicyFor(t *testing.T) {
	cases := []struct {
		name, named string
		cluster     func() *hfv1.HypervisorCluster
		want        string
		wantErr     string
	}{
		{name: "default of the cluster", cluster: isolatedCluster, want: "web"},
		{name: "named", named: "closed", cluster: isolatedCluster, want: "closed"},
		{name: "built-in default", named: "default", cluster: isolatedCluster, want: "default"},
		{name: "built-in when no default", cluster: func() *hfv1.HypervisorCluster {
			c := isolatedCluster()
			c.Spec.Network.Isolation.DefaultPolicy = ""
			return c
		}, want: "default"},
		{name: "undefined", named: "strict", cluster: isolatedCluster, wantErr: "spec.network.isolationPolicy names strict, which HypervisorCluster pve does not define (its policies: web, closed, default (built in))"},
		{name: "no isolation", named: "web", cluster: func() *hfv1.HypervisorCluster { return &hfv1.HypervisorCluster{} }, wantErr: "has no spec.network.isolation"},
		{name: "no isolation, none named", cluster: func() *hfv1.HypervisorCluster { return &hfv1.HypervisorCluster{} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &hfv1.HypervisorMachineTemplate{}
			tmpl.Spec.Network.IsolationPolicy = tc.named
			p, ok, err := PolicyFor(tmpl, tc.cluster())
			switch {
			case tc.wantErr != "":
				if !errors.Is(err, ErrPolicyNotFound) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want ErrPolicyNotFound with %q", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case p.Name != tc.want || ok != (tc.want != ""):
				t.Fatalf("policy %q (ok %v), want %q", p.Name, ok, tc.want)
			}
		})
	}
}

// TestWithAddresses: static addresses become the VM's allowed sources,
// without touching the compiled value; a VM without isolation stays so.
func TestWithAddresses(t *testing.T) {
	if WithAddresses(nil, []vmspec.StaticAddr{{IP: netip.MustParseAddr("192.0.2.10")}}) != nil {
		t.Fatal("a VM without isolation got some")
	}
	iso := &provider.Isolation{Policy: "web", AddressSubnets: []string{"192.0.2.0/24"}}
	got := WithAddresses(iso, []vmspec.StaticAddr{{IP: netip.MustParseAddr("192.0.2.10")}, {IP: netip.MustParseAddr("2001:db8::a")}})
	if !slices.Equal(got.Addresses, []string{"192.0.2.10", "2001:db8::a"}) || len(iso.Addresses) != 0 {
		t.Fatalf("addresses %v (original %v)", got.Addresses, iso.Addresses)
	}
	if !got.AllowsAddress(netip.MustParseAddr("2001:db8::a")) || !got.AllowsAddress(netip.MustParseAddr("192.0.2.77")) || got.AllowsAddress(netip.MustParseAddr("198.51.100.1")) {
		t.Error("AllowsAddress does not follow Addresses and AddressSubnets")
	}
}

// TestProxyHostMustResolve: a proxy named by a host that does not resolve
// fails the compile (the claim waits) rather than leaving the proxy out.
func TestProxyHostMustResolve(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	tmpl.Spec.Network.Proxy = &hfv1.ProxySettings{HTTPSProxy: "https://gone.example"}
	if _, err := Compile(context.Background(), tmpl, isolatedCluster(), Operator{}, fakeResolver{}); err == nil || !strings.Contains(err.Error(), "gone.example") {
		t.Fatalf("error %v", err)
	}
	op, err := OperatorFromURL("https://hyperfleet-agent.example")
	if err != nil || !slices.Equal(op.Ports, []uint16{443}) {
		t.Fatalf("operator %v, %v", op, err)
	}
}

func portsOf(r provider.FirewallRule) string {
	var s []string
	for _, p := range r.Ports {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}
