package cloudinit

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

const (
	// ProxyProfilePath exports the template's proxy to login shells
	// (Vars.HTTPProxy set): what a person or a job's login shell runs.
	ProxyProfilePath = "/etc/profile.d/hyperfleet-proxy.sh"
	// ProxyAptPath points apt at the proxy: apt reads no proxy variable
	// when cloud-init's packages module or a job runs it.
	ProxyAptPath = "/etc/apt/apt.conf.d/90hyperfleet-proxy"
)

// proxyURLRE is the shape of a proxy URL the guest's files can carry
// unquoted, the API's rule (api/v1alpha1): scheme, host and port, nothing a shell or apt.conf would read
// differently (the API server refuses the rest first).
var proxyURLRE = regexp.MustCompile(`^https?://[][A-Za-z0-9.:-]+/?$`)

// noProxyRE is the shape of a noProxy entry the guest's files can carry.
var noProxyRE = regexp.MustCompile(`^(\*|[.]?[A-Za-z0-9[][][A-Za-z0-9.:/-]*)$`)

// hasProxy says whether the template names a proxy.
func (v *Vars) hasProxy() bool { return v.HTTPProxy != "" || v.HTTPSProxy != "" }

// checkProxy checks the proxy variables.
func (v *Vars) checkProxy() error {
	if !v.hasProxy() {
		if len(v.NoProxy) > 0 {
			return fmt.Errorf("vars: NoProxy is set without HTTPProxy or HTTPSProxy")
		}
		return nil
	}
	for _, f := range []struct{ name, val string }{{"HTTPProxy", v.HTTPProxy}, {"HTTPSProxy", v.HTTPSProxy}} {
		if f.val == "" {
			continue
		}
		if err := agentconfig.CheckProxyURL("vars: "+f.name, f.val); err != nil {
			return err
		}
		if !proxyURLRE.MatchString(f.val) {
			return fmt.Errorf("vars: %s %q must be scheme://host[:port] of letters, digits, '.', '-', ':' and brackets", f.name, f.val)
		}
	}
	if len(v.NoProxy) > agentconfig.MaxNoProxyEntries/2 {
		return fmt.Errorf("vars: NoProxy has %d entries; at most %d (the operator adds its own)", len(v.NoProxy), agentconfig.MaxNoProxyEntries/2)
	}
	for _, e := range v.NoProxy {
		if err := agentconfig.CheckNoProxyEntry("vars: NoProxy", e); err != nil {
			return err
		}
		if !noProxyRE.MatchString(e) {
			return fmt.Errorf("vars: NoProxy entry %q must be a host name, IP address or CIDR network (optionally :port), or *", e)
		}
	}
	return nil
}

// proxy is the agent's proxy: the template's, with the addresses the VM
// reaches directly whatever the template says appended to noProxy
// (docs/templates.md, "Proxy"): loopback; link-local (169.254.0.0/16,
// fe80::/10: cloud metadata services); the operator's own endpoints,
// which it publishes for the VMs' network (the agent server's broker,
// hints and agent download, the SPIRE server); and a static VM's own
// subnets. nil without a proxy.
func (v *Vars) proxy() *agentconfig.Proxy {
	if !v.hasProxy() {
		return nil
	}
	no := slices.Clone([]string(v.NoProxy))
	add := func(entries ...string) {
		for _, e := range entries {
			if e != "" && !slices.Contains(no, e) {
				no = append(no, e)
			}
		}
	}
	add("localhost", "127.0.0.0/8", "::1", "169.254.0.0/16", "fe80::/10")
	add(urlHost(v.BrokerURL), urlHost(v.AgentDownloadURL), urlHost(v.BootstrapServiceURL))
	if n := v.PowerOffNotify; n != nil {
		add(urlHost(n.URL), urlHost(n.ReadyURL))
	}
	if h, _, err := net.SplitHostPort(v.SPIREServerAddress); err == nil {
		add(h)
	}
	add(subnet(v.StaticIP, v.NetmaskBits), subnet(v.StaticIPv6, v.NetmaskBitsIPv6))
	return &agentconfig.Proxy{HTTPProxy: v.HTTPProxy, HTTPSProxy: v.HTTPSProxy, NoProxy: no}
}

// urlHost is raw's host without port, empty when raw is not a URL.
func urlHost(raw string) string {
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// subnet is the network of ip/bits, empty when ip is.
func subnet(ip string, bits int) string {
	a, err := netip.ParseAddr(ip)
	if err != nil || bits <= 0 {
		return ""
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return ""
	}
	return p.String()
}

// proxyProfile is ProxyProfilePath's content: the proxy variables in
// both cases (curl and wget read the lower-case http_proxy only).
func proxyProfile(p *agentconfig.Proxy) string {
	var b strings.Builder
	b.WriteString("# Written by HyperFleet from the template's spec.network.proxy.\n")
	for _, kv := range p.Env() {
		k, val, _ := strings.Cut(kv, "=")
		fmt.Fprintf(&b, "export %s='%s'\n", k, val)
	}
	return b.String()
}

// proxyApt is ProxyAptPath's content. apt has no no_proxy: the hosts that
// must be direct for apt need Acquire::http::Proxy::<host> "DIRECT" in the
// template's own files (docs/templates.md, "Proxy").
func proxyApt(p *agentconfig.Proxy) string {
	var b strings.Builder
	b.WriteString("// Written by HyperFleet from the template's spec.network.proxy.\n")
	if p.HTTPProxy != "" {
		fmt.Fprintf(&b, "Acquire::http::Proxy %q;\n", p.HTTPProxy)
	}
	if p.HTTPSProxy != "" {
		fmt.Fprintf(&b, "Acquire::https::Proxy %q;\n", p.HTTPSProxy)
	}
	return b.String()
}
