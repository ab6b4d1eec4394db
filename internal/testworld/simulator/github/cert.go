package githubsim

import (
	"crypto/tls"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// SelfSignedCertificate generates a throw-away certificate authority and a
// server certificate it signs for hosts (DNS names or IPs). It returns the
// server certificate (chain included) and the CA certificate in PEM, which
// clients (curl --cacert in the runner scripts, Go's x509.CertPool) trust.
func SelfSignedCertificate(hosts ...string) (tls.Certificate, []byte, error) {
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "github-sim", Organization: []string{"HyperFleet GitHub simulator"}, Hosts: hosts})
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return c.TLS, c.CAPEM, nil
}
