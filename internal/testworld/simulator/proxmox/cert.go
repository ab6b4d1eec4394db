package proxmoxsim

import (
	"crypto/tls"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// SelfSignedCertificate generates a fresh self-signed server certificate
// for hosts (DNS names or IPs), like the pve-ssl.pem of a new node, and
// returns it with its SHA-256 fingerprint in Proxmox notation.
func SelfSignedCertificate(hosts ...string) (tls.Certificate, string, error) {
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "proxmox-sim", Organization: []string{"PVE Cluster Node"}, Hosts: hosts, NoCA: true})
	if err != nil {
		return tls.Certificate{}, "", err
	}
	return c.TLS, FormatFingerprint(c.Fingerprint()), nil
}
