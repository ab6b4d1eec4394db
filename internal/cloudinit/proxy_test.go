package cloudinit

import (
	"slices"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestProxyReachesTheGuest checks where a template's proxy lands in the
// seed: agent.json's proxy with the operator's endpoints, loopback,
// link-local and the static subnet added to noProxy, the profile.d and
// apt files, and curl's environment in the agent download's runcmd.
func TestProxyReachesTheGuest(t *testing.T) {
	v := operatorAgentVars(runnerTokenVars(baseVars()))
	v.NetworkMode, v.DHCPClientIdentifier, v.SendHostname = NetworkStatic, "", false
	v.StaticIP, v.NetmaskBits, v.Gateway = "192.0.2.10", 24, "192.0.2.1"
	v.PowerOffNotify = &agentconfig.PowerOffNotify{URL: "https://203.0.113.7:9443/hints/v1/power-off", Token: "t0k3n-for-the-notice-0000000000000",
		Claim: agentconfig.ClaimRef{Namespace: "ci", Name: "runner-abc12", UID: "0b6f6c1e-1d57-4f43-9a4c-1234567890ab"}}
	proxyVars(&v)
	out, err := Render(Input{Vars: v})
	if err != nil {
		t.Fatal(err)
	}
	ud := string(out.UserData)
	for _, want := range []string{
		"path: " + ProxyProfilePath, "export https_proxy='http://proxy.example.com:3128'", "export NO_PROXY='.example.com,10.0.0.0/8,localhost,",
		"path: " + ProxyAptPath, `Acquire::https::Proxy "http://proxy.example.com:3128";`,
		"export http_proxy=''http://proxy.example.com:3128'' HTTP_PROXY=",
	} {
		if !strings.Contains(ud, want) {
			t.Errorf("user-data lacks %q:\n%s", want, ud)
		}
	}
	cfg := agentConfig(&v)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p := cfg.Proxy
	if p == nil || p.HTTPSProxy != "http://proxy.example.com:3128" {
		t.Fatalf("agent.json proxy = %+v", p)
	}
	for _, direct := range []string{".example.com", "10.0.0.0/8", "localhost", "127.0.0.0/8", "169.254.0.0/16",
		"hyperfleet-agent.hyperfleet-system.svc", "203.0.113.7", "192.0.2.0/24"} {
		if !slices.Contains(p.NoProxy, direct) {
			t.Errorf("noProxy %v lacks %s", p.NoProxy, direct)
		}
	}

	// Refused before anything is rendered: credentials, another scheme,
	// an entry the guest's files could not carry.
	for _, bad := range []func(*Vars){
		func(v *Vars) { v.HTTPSProxy = "http://u:p@proxy.example.com:3128" },
		func(v *Vars) { v.HTTPProxy = "socks5://proxy.example.com:1080" },
		func(v *Vars) { v.NoProxy = List{"a'b"} },
		func(v *Vars) { v.HTTPProxy, v.HTTPSProxy = "", "" },
	} {
		w := v
		w.NoProxy = slices.Clone(v.NoProxy)
		bad(&w)
		if _, err := Render(Input{Vars: w}); err == nil || !strings.Contains(err.Error(), "Proxy") {
			t.Errorf("rendered %+v / %+v / %v: err %v", w.HTTPProxy, w.HTTPSProxy, w.NoProxy, err)
		}
	}
}
