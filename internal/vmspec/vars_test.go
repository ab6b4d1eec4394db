package vmspec

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// fakeAgents serves a fixed set of platforms (GitHub naming, "linux/x64").
type fakeAgents map[string]string

func (f fakeAgents) Lookup(os, arch string) (string, string, bool) {
	sum, ok := f[os+"/"+arch]
	if !ok {
		return "", "", false
	}
	return "https://agents.example.com:9443/hf/agent/v1/hyperfleet-agent-" + os + "-" + arch + "?sha256=" + sum, sum, true
}

func (fakeAgents) CA() string     { return "-----BEGIN CERTIFICATE-----\n..." }
func (fakeAgents) CAError() error { return nil }

func TestSetAgentVars(t *testing.T) {
	ciPlatforms := githubsimtest.Backends(t, nil)
	sum := strings.Repeat("ab", 32)
	agents := fakeAgents{"linux/x64": sum}
	tmpl := func(source hfv1.AgentSource, arch hfv1.RunnerArch) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.Bootstrap.AgentSource = source
		tm.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Runner: &hfv1.RunnerSoftware{Arch: arch}}
		return tm
	}
	vars := func(tm *hfv1.HypervisorMachineTemplate) cloudinit.Vars {
		return TemplateVars(ciPlatforms, tm, proxmoxCluster(), nil)
	}

	// Image (and unset, created before the field existed): nothing changes.
	for _, source := range []hfv1.AgentSource{"", hfv1.AgentSourceImage} {
		tm := tmpl(source, "")
		v := vars(tm)
		if err := SetAgentVars(ciPlatforms, tm, agents, &v); err != nil || v.AgentDownloadURL != "" || v.BootstrapServiceURL != "" {
			t.Errorf("agentSource %q: %v, %+v", source, err, v)
		}
	}

	tm := tmpl(hfv1.AgentSourceOperator, "")
	v := vars(tm)
	if err := SetAgentVars(ciPlatforms, tm, agents, &v); err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(v.AgentDownloadURL, "/hyperfleet-agent-linux-x64?sha256="+sum) || v.AgentSHA256 != sum || v.AgentCA == "" {
		t.Errorf("agent vars = %q %q %q", v.AgentDownloadURL, v.AgentSHA256, v.AgentCA)
	}
	if v.BootstrapServiceURL != "https://agents.example.com:9443/hf/agent/v1" {
		t.Errorf("BootstrapServiceURL = %q, want the directory of the binaries", v.BootstrapServiceURL)
	}

	for _, tc := range []struct {
		name   string
		tm     *hfv1.HypervisorMachineTemplate
		agents AgentLocator
		want   []string
	}{
		{"no server", tmpl(hfv1.AgentSourceOperator, ""), nil, []string{"--agent-server-addr", "--agent-binaries-dir", "hyperfleet-agent-linux-amd64", "agentSource Image"}},
		{"no arm64 build", tmpl(hfv1.AgentSourceOperator, "arm64"), agents, []string{"no hyperfleet-agent-linux-arm64", "arch arm64", "--agent-binaries-dir"}},
		{"32-bit arm", tmpl(hfv1.AgentSourceOperator, "arm"), agents, []string{"linux/x64 and linux/arm64 runners only, not linux/arm", "spec.bootstrap.github.runner"}},
	} {
		v := vars(tc.tm)
		err := SetAgentVars(ciPlatforms, tc.tm, tc.agents, &v)
		for _, want := range tc.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: error %v does not mention %q", tc.name, err, want)
			}
		}
		if v.AgentDownloadURL != "" {
			t.Errorf("%s: a download URL despite the error", tc.name)
		}
	}
}

// TestDualStackVars: a claim of a template with an IPv6 and an IPv4 pool
// (in that order) gets StaticIP and its prefix and gateway from the IPv4
// pool and the IPv6 fields from the IPv6 one, the pools' nameservers
// IPv4 pool's first; its network-config carries both addresses and both
// gateways. A template of one IPv6 pool keeps it in StaticIP.
func TestDualStackVars(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	pool := func(spec ipam.Spec) *ipam.Pool {
		p, err := ipam.ParsePool(spec)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	v6 := pool(ipam.Spec{Addresses: []string{"2001:db8:1::/64"}, Prefix: 64, Gateways: []string{"2001:db8:1::1"}, Nameservers: []string{"2001:db8::53"}})
	v4 := pool(ipam.Spec{Addresses: []string{"192.0.2.0/24"}, Prefix: 24, Gateways: []string{"192.0.2.1"}, Nameservers: []string{"192.0.2.53"}})
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "dual"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org"}
	tmpl.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRefs: []hfv1.ObjectName{{Name: "v6"}, {Name: "v4"}}}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "vm-1", UID: placeholderClaimUID}}
	addrs := []StaticAddr{{IP: netip.MustParseAddr("2001:db8:1::10"), Pool: v6}, {IP: netip.MustParseAddr("192.0.2.10"), Pool: v4}}
	v := ClaimVars(ws, claim, tmpl, proxmoxCluster(), addrs)
	got := []any{v.StaticIP, v.NetmaskBits, v.Gateway, v.StaticIPv6, v.NetmaskBitsIPv6, v.GatewayIPv6, v.DNSServers.String()}
	want := []any{"192.0.2.10", 24, "192.0.2.1", "2001:db8:1::10", 64, "2001:db8:1::1", `["192.0.2.53","2001:db8::53"]`}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("vars %v, want %v", got, want)
	}
	out, err := cloudinit.Render(Input(tmpl, withPlaceholderCredentials(ws, v, tmpl)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"- 192.0.2.10/24", "- 2001:db8:1::10/64", "gateway4: 192.0.2.1", "gateway6: 2001:db8:1::1"} {
		if !strings.Contains(string(out.NetworkConfig), line) {
			t.Errorf("network-config lacks %q:\n%s", line, out.NetworkConfig)
		}
	}
	if err := CheckTemplate(ws, tmpl, proxmoxCluster(), []*ipam.Pool{v6, v4}, nil); err != nil {
		t.Errorf("CheckTemplate: %v", err)
	}

	tmpl.Spec.Network = hfv1.MachineNetwork{Mode: hfv1.NetworkModeStatic, IPPoolRef: &hfv1.ObjectName{Name: "v6"}}
	v = ClaimVars(ws, claim, tmpl, proxmoxCluster(), addrs[:1])
	if v.StaticIP != "2001:db8:1::10" || v.NetmaskBits != 64 || v.Gateway != "2001:db8:1::1" || v.StaticIPv6 != "" || v.NetmaskBitsIPv6 != 0 {
		t.Errorf("single IPv6 pool: StaticIP %q/%d via %q, StaticIPv6 %q/%d", v.StaticIP, v.NetmaskBits, v.Gateway, v.StaticIPv6, v.NetmaskBitsIPv6)
	}
}

// TestTPMDevicePathVars: a template with method tpm gives the agent its
// device path: the template's, or /dev/tpmrm0 when it names none (the API
// server defaults it only inside a tpm block); other methods none.
func TestTPMDevicePathVars(t *testing.T) {
	ciPlatforms := githubsimtest.Backends(t, nil)
	for _, c := range []struct {
		att  hfv1.Attestation
		want string
	}{
		{hfv1.Attestation{Method: hfv1.AttestationTPM}, "/dev/tpmrm0"},
		{hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{AddVirtualTPM: true}}, "/dev/tpmrm0"},
		{hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{DevicePath: "/dev/tpm0"}}, "/dev/tpm0"},
		{hfv1.Attestation{Method: hfv1.AttestationJoinToken}, ""},
	} {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.Attestation = c.att
		if got := TemplateVars(ciPlatforms, tm, proxmoxCluster(), nil).TPMDevicePath; got != c.want {
			t.Errorf("%+v: TPMDevicePath %q, want %q", c.att, got, c.want)
		}
	}
}
