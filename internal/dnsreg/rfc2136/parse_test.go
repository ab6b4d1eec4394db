package rfc2136_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
)

const secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQ=" // base64 of a test secret

func TestParseTSIGKey(t *testing.T) {
	want := func(name, alg string) rfc2136.TSIGKey {
		return rfc2136.TSIGKey{Name: name, Algorithm: alg, Secret: secret}
	}
	for _, c := range []struct {
		in   string
		want rfc2136.TSIGKey
	}{
		{"hf-update:" + secret, want("hf-update.", dns.HmacSHA256)},
		{"hmac-sha512:hf-update.:" + secret, want("hf-update.", dns.HmacSHA512)},
		{"HMAC-SHA1:HF.Update:" + secret + "\n", want("hf.update.", dns.HmacSHA1)},
		{`key "hf-update" {
	algorithm hmac-sha384;
	secret "` + secret + `";
};`, want("hf-update.", dns.HmacSHA384)},
		{"# made by tsig-keygen\nkey hf-update { secret \"" + secret + "\"; };\n", want("hf-update.", dns.HmacSHA256)},
	} {
		got, err := rfc2136.ParseTSIGKey(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseTSIGKey(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{
		"", "hf-update", "hf-update:", ":" + secret, "hmac-md5:hf:" + secret, "hf:not base64!",
		"a:b:c:d", `key "hf" { algorithm hmac-sha256; secret "` + secret + `"; }; extra`,
		`key "hf" { algorithm; secret "` + secret + `"; };`, `key "hf" { owner x; secret "` + secret + `"; };`,
		`key "bad name!" { secret "` + secret + `"; };`,
	} {
		if got, err := rfc2136.ParseTSIGKey(in); err == nil || !errors.Is(err, dnsreg.ErrInvalid) {
			t.Errorf("ParseTSIGKey(%q) = %+v, %v; want ErrInvalid", in, got, err)
		}
	}
}

func FuzzParseTSIGKey(f *testing.F) {
	for _, s := range []string{
		"hf-update:" + secret, "hmac-sha512:hf:" + secret, `key "hf" { algorithm hmac-sha256; secret "` + secret + `"; };`,
		"key {}", "key \"x\" { secret \"\"; };", "#\n:", "a:b:c",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := rfc2136.ParseTSIGKey(s)
		if err != nil {
			if !errors.Is(err, dnsreg.ErrInvalid) {
				t.Fatalf("ParseTSIGKey(%q): %v is not ErrInvalid", s, err)
			}
			return
		}
		// A parsed key is normalized: writing it back in the colon form
		// and parsing again gives the same key.
		if !strings.HasSuffix(k.Name, ".") || !strings.HasSuffix(k.Algorithm, ".") || k.Secret == "" {
			t.Fatalf("ParseTSIGKey(%q) = %+v, not normalized", s, k)
		}
		again, err := rfc2136.ParseTSIGKey(strings.TrimSuffix(k.Algorithm, ".") + ":" + k.Name + ":" + k.Secret)
		if err != nil || again != k {
			t.Fatalf("ParseTSIGKey(%q) = %+v, which reads back as %+v, %v", s, k, again, err)
		}
	})
}

func TestParseReverseName(t *testing.T) {
	for _, a := range []string{"192.0.2.1", "0.0.0.0", "255.255.255.255", "2001:db8::1", "::", "fe80::1:2:3:4"} {
		addr := netip.MustParseAddr(a)
		rev, err := dns.ReverseAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := rfc2136.ParseReverseName(strings.ToUpper(rev))
		if !ok || got != addr {
			t.Errorf("ParseReverseName(%s) = %s, %v; want %s", rev, got, ok, addr)
		}
	}
	for _, n := range []string{
		"2.0.192.in-addr.arpa.", "1.2.0.192.in-addr.arpa.example.", "01.2.0.192.in-addr.arpa.", "256.2.0.192.in-addr.arpa.",
		"8.b.d.0.1.0.0.2.ip6.arpa.", "vm.ci.example.test.",
		"4.0.3.0.2.0.1.0.f.f.f.f.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.", // ::ffff:1.2.3.4
	} {
		if got, ok := rfc2136.ParseReverseName(n); ok {
			t.Errorf("ParseReverseName(%s) = %s, want none", n, got)
		}
	}
}

func FuzzParseReverseName(f *testing.F) {
	for _, s := range []string{"1.2.0.192.in-addr.arpa.", "1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa.", "x.in-addr.arpa", ".ip6.arpa"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, ok := rfc2136.ParseReverseName(s)
		if !ok {
			return
		}
		// Only an address's own reverse name parses.
		rev, err := dns.ReverseAddr(a.String())
		if err != nil || !strings.EqualFold(rev, dns.Fqdn(s)) {
			t.Fatalf("ParseReverseName(%q) = %s, whose reverse name is %q (%v)", s, a, rev, err)
		}
	})
}

func TestNewChecksConfig(t *testing.T) {
	good := rfc2136.Config{Server: "127.0.0.1:53", Key: rfc2136.TSIGKey{Name: "k", Secret: secret}, Zone: "ci.example.test", ReverseZones: []string{"2.0.192.in-addr.arpa"}}
	if _, err := rfc2136.New(good); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*rfc2136.Config){
		"server without port": func(c *rfc2136.Config) { c.Server = "127.0.0.1" },
		"transport":           func(c *rfc2136.Config) { c.Transport = "tls" },
		"timeout":             func(c *rfc2136.Config) { c.Timeout = time.Hour },
		"ttl":                 func(c *rfc2136.Config) { c.TTL = time.Second },
		"key algorithm":       func(c *rfc2136.Config) { c.Key.Algorithm = "hmac-md5" },
		"key secret":          func(c *rfc2136.Config) { c.Key.Secret = "%%%" },
		"zone":                func(c *rfc2136.Config) { c.Zone = "" },
		"reverse zone":        func(c *rfc2136.Config) { c.ReverseZones = []string{"example.test"} },
	} {
		c := good
		mutate(&c)
		if _, err := rfc2136.New(c); !errors.Is(err, dnsreg.ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", name, err)
		}
	}
}

func TestFactory(t *testing.T) {
	cfg := dnsreg.Config{
		Zone:        "ci.example.test",
		Options:     map[string]string{rfc2136.OptionServer: "127.0.0.1:5353", rfc2136.OptionTransport: "udp", rfc2136.OptionTimeout: "3s"},
		Credentials: map[string][]byte{rfc2136.CredentialKey: []byte("hmac-sha256:hf:" + secret)},
	}
	if _, err := dnsreg.New(map[hfv1.DNSProviderType]dnsreg.Factory{dnsreg.TypeRFC2136: rfc2136.Factory}, dnsreg.TypeRFC2136, cfg); err != nil {
		t.Fatal(err)
	}
	noKey := cfg
	noKey.Credentials = nil
	if _, err := rfc2136.Factory(noKey); !errors.Is(err, dnsreg.ErrInvalid) || !strings.Contains(err.Error(), "tsigKey") {
		t.Fatalf("Factory without tsigKey: %v", err)
	}
	badTimeout := cfg
	badTimeout.Options = map[string]string{rfc2136.OptionServer: "127.0.0.1:5353", rfc2136.OptionTimeout: "soon"}
	if _, err := rfc2136.Factory(badTimeout); !errors.Is(err, dnsreg.ErrInvalid) {
		t.Fatalf("Factory with a bad timeout: %v", err)
	}
}
