package agentconfig

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpproxy"
)

// Proxy is the HTTP proxy the VM reaches the outside through (the
// template's spec.network.proxy). The agent uses it for everything it
// fetches over HTTP (the runner download, the broker, the secret store, the
// operator's hints) and hands it to the runner as http_proxy, https_proxy
// and no_proxy (both cases), whatever the agent's own environment says.
type Proxy struct {
	// httpProxy is the proxy of http:// URLs, an http:// or https:// URL
	// without credentials; empty: http:// URLs go direct.
	HTTPProxy string `json:"httpProxy,omitempty"`
	// httpsProxy is the proxy of https:// URLs (CONNECT), as httpProxy.
	HTTPSProxy string `json:"httpsProxy,omitempty"`
	// noProxy are the hosts reached directly, in NO_PROXY's syntax: a host
	// name (with its subdomains; a leading dot is allowed), an IP address,
	// a CIDR network, each optionally with :port, or "*" for every host.
	// The operator adds its own endpoints (docs/templates.md, "Proxy").
	NoProxy []string `json:"noProxy,omitempty"`
}

// MaxNoProxyEntries bounds noProxy.
const MaxNoProxyEntries = 64

// Env is the proxy as environment variables, lower- and upper-case (curl
// reads http_proxy only in lower case; Go, gitlab-runner and
// buildkite-agent read either), the unset ones left out.
func (p *Proxy) Env() []string {
	if p == nil {
		return nil
	}
	var env []string
	add := func(name, value string) {
		if value != "" {
			env = append(env, name+"="+value, strings.ToUpper(name)+"="+value)
		}
	}
	add("http_proxy", p.HTTPProxy)
	add("https_proxy", p.HTTPSProxy)
	add("no_proxy", strings.Join(p.NoProxy, ","))
	return env
}

// Func is the proxy as an http.Transport's Proxy function: nil p is the
// process's environment (http.ProxyFromEnvironment). Unlike
// ProxyFromEnvironment it is not cached for the process, so two agents'
// configs in one process (tests) each get their own.
func (p *Proxy) Func() func(*http.Request) (*url.URL, error) {
	if p == nil {
		return http.ProxyFromEnvironment
	}
	f := (&httpproxy.Config{HTTPProxy: p.HTTPProxy, HTTPSProxy: p.HTTPSProxy, NoProxy: strings.Join(p.NoProxy, ",")}).ProxyFunc()
	return func(r *http.Request) (*url.URL, error) { return f(r.URL) }
}

// IsProxyEnv says whether the environment entry kv is a proxy variable
// that Env sets (either case), so that a runner's environment holds the
// config's proxy alone.
func IsProxyEnv(kv string) bool {
	k, _, _ := strings.Cut(kv, "=")
	switch strings.ToLower(k) {
	case "http_proxy", "https_proxy", "no_proxy":
		return true
	}
	return false
}

// CheckProxyURL checks a proxy URL: http or https, a host, no
// credentials (they would rest in the VM's seed), no path, query or
// fragment. The error names field.
func CheckProxyURL(field, raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%s: is not a URL: %w", field, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s: scheme %q; a proxy URL is http:// or https://, such as http://proxy.example.com:3128", field, u.Scheme)
	case u.User != nil:
		return fmt.Errorf("%s: holds credentials; they would rest in the VM's seed: use a proxy that authorizes the VMs' network instead", field)
	case u.Hostname() == "":
		return fmt.Errorf("%s: has no host", field)
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("%s: has a path, query or fragment; a proxy URL is scheme://host[:port]", field)
	}
	return nil
}

// CheckNoProxyEntry checks one noProxy entry: a host name, an IP address
// or a CIDR network, optionally with :port, or "*".
func CheckNoProxyEntry(field, e string) error {
	if e == "*" {
		return nil
	}
	host := strings.TrimPrefix(e, ".")
	if _, _, err := net.ParseCIDR(host); err == nil {
		return nil
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if net.ParseIP(host) != nil {
		return nil
	}
	if host == "" || len(host) > 253 || strings.ContainsAny(host, " ,/@*") {
		return fmt.Errorf("%s: %q is not a host name, IP address or CIDR network (with an optional :port), nor *", field, e)
	}
	return nil
}

// validate checks p.
func (p *Proxy) validate(bad func(field, format string, args ...any)) {
	if p.HTTPProxy == "" && p.HTTPSProxy == "" {
		bad("proxy", "names neither httpProxy nor httpsProxy; remove it or set one")
	}
	for _, f := range []struct{ field, v string }{{"proxy.httpProxy", p.HTTPProxy}, {"proxy.httpsProxy", p.HTTPSProxy}} {
		field, v := f.field, f.v
		if v == "" {
			continue
		}
		if err := CheckProxyURL(field, v); err != nil {
			bad(field, "%s", strings.TrimPrefix(err.Error(), field+": "))
		}
	}
	if len(p.NoProxy) > MaxNoProxyEntries {
		bad("proxy.noProxy", "has %d entries; at most %d", len(p.NoProxy), MaxNoProxyEntries)
	}
	for i, e := range p.NoProxy {
		field := fmt.Sprintf("proxy.noProxy[%d]", i)
		if err := CheckNoProxyEntry(field, e); err != nil {
			bad(field, "%s", strings.TrimPrefix(err.Error(), field+": "))
		}
	}
}
