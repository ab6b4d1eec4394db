package agentconfig

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestProxy checks the proxy section: what Validate refuses, the
// environment it gives the runner and the transport's choice per URL.
func TestProxy(t *testing.T) {
	for _, tc := range []struct {
		p    Proxy
		want string
	}{
		{Proxy{NoProxy: []string{"x"}}, "names neither httpProxy nor httpsProxy"},
		{Proxy{HTTPSProxy: "http://u:p@proxy:3128"}, "proxy.httpsProxy: holds credentials"},
		{Proxy{HTTPProxy: "socks5://proxy:1080"}, `proxy.httpProxy: scheme "socks5"`},
		{Proxy{HTTPProxy: "http://proxy:3128/x"}, "proxy.httpProxy: has a path"},
		{Proxy{HTTPProxy: "http://proxy:3128", NoProxy: []string{"a b"}}, "proxy.noProxy[0]"},
	} {
		var errs []string
		tc.p.validate(func(field, format string, args ...any) {
			errs = append(errs, field+": "+strings.TrimSpace(fmt.Sprintf(format, args...)))
		})
		if !strings.Contains(strings.Join(errs, "; "), tc.want) {
			t.Errorf("%+v: errors %q, want %q", tc.p, errs, tc.want)
		}
	}

	p := &Proxy{HTTPProxy: "http://proxy:3128", HTTPSProxy: "http://proxy:3129", NoProxy: []string{".svc", "10.0.0.0/8"}}
	env := strings.Join(p.Env(), " ")
	for _, want := range []string{"http_proxy=http://proxy:3128", "HTTPS_PROXY=http://proxy:3129", "no_proxy=.svc,10.0.0.0/8", "NO_PROXY=.svc,10.0.0.0/8"} {
		if !strings.Contains(env, want) {
			t.Errorf("Env() = %s, lacks %s", env, want)
		}
	}
	f := p.Func()
	for raw, want := range map[string]string{
		"https://github.com/x":              "http://proxy:3129",
		"http://deb.debian.org/":            "http://proxy:3128",
		"https://agent.hyperfleet.svc:9443": "",
		"https://10.1.2.3/":                 "",
	} {
		got, err := f(&http.Request{URL: mustURL(t, raw)})
		if err != nil {
			t.Fatal(err)
		}
		if s := urlString(got); s != want {
			t.Errorf("proxy of %s = %q, want %q", raw, s, want)
		}
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func urlString(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.String()
}
