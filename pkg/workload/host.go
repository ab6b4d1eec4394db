package workload

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// APIHost is one host the operator calls with a template's platform
// credentials, and the template field whose URL names it. A platform's
// public service (such as api.github.com) is allowed everywhere; any other
// host must be allowed by the platform team, in the tenancy rules of the
// template's HypervisorCluster (spec.tenancy[].apiHosts): a tenant that
// could name any host would have the operator call, and trust the answers
// of, a server it runs (docs/security.md, "The API host is part of the
// scope").
type APIHost struct {
	// Field is the template field whose URL names the host, such as
	// spec.bootstrap.github.apiBaseURL.
	Field string
	// Host is the URL's host as CanonicalHost writes it.
	Host string
	// Public is true for a host of the platform's public service.
	Public bool
}

// CanonicalHost is how a URL's host is compared everywhere: the host name
// in lower case, with its port unless it is the scheme's default (443 for
// https, 80 for http), an IPv6 address in brackets when a port follows.
// Two URLs reach the same API exactly when their canonical hosts are equal.
func CanonicalHost(u *url.URL) string {
	host, port := strings.ToLower(u.Hostname()), u.Port()
	if (u.Scheme == "https" && port == "443") || (u.Scheme == "http" && port == "80") {
		port = ""
	}
	if port == "" {
		return host
	}
	return net.JoinHostPort(host, port)
}

// HostOf is CanonicalHost of the absolute URL raw; an error names what is
// wrong with it.
func HostOf(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("%q is not a URL: %w", raw, err)
	}
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return "", fmt.Errorf("%q is not an absolute http(s) URL", raw)
	}
	return CanonicalHost(u), nil
}

// NormalizeHost writes a host given as text (host or host:port, as a
// platform's webhook header or a tenancy rule names it) the way
// CanonicalHost writes a URL's host, for https: lower case, port 443
// dropped.
func NormalizeHost(host string) string {
	return CanonicalHost(&url.URL{Scheme: "https", Host: host})
}

// ScopeHostOf is the Scope.Host of scopes whose API is at raw: empty when
// its host is public (the platform's public API host), else its
// CanonicalHost. A URL that does not parse (the API server's validation
// lets none through) gives a host no job comes from.
func ScopeHostOf(raw, public string) string {
	host, err := HostOf(raw)
	switch {
	case err != nil:
		return "invalid host"
	case host == public:
		return ""
	}
	return host
}

// APIHostOf is the APIHost of the URL raw, named by field, of a platform
// whose public service answers at the hosts public.
func APIHostOf(field, raw string, public ...string) APIHost {
	host, err := HostOf(raw)
	if err != nil {
		// Shown as written, and never public: refused unless listed.
		return APIHost{Field: field, Host: raw}
	}
	for _, p := range public {
		if host == p {
			return APIHost{Field: field, Host: host, Public: true}
		}
	}
	return APIHost{Field: field, Host: host}
}
