package selfsigned

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

func TestNew(t *testing.T) {
	for _, noCA := range []bool{false, true} {
		c, err := NewWith(Options{CommonName: "x", Hosts: []string{"127.0.0.1", "localhost", ""}, NoCA: noCA})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Leaf.Verify(x509.VerifyOptions{Roots: c.Pool(), DNSName: "localhost"}); err != nil {
			t.Errorf("noCA=%v: %v", noCA, err)
		}
		if err := c.Leaf.VerifyHostname("127.0.0.1"); err != nil {
			t.Error(err)
		}
		if want := 2; !noCA && len(c.TLS.Certificate) != want {
			t.Errorf("chain of %d", len(c.TLS.Certificate))
		}
		dir := t.TempDir()
		certFile, keyFile, _, err := c.WriteDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			t.Error(err)
		}
	}
}
