package proxmox

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Mutual TLS: a Proxmox API behind a TLS-terminating proxy (nginx, HAProxy,
// Envoy) that asks for a client certificate. The certificate comes from
// spec.credentials.clientCert and adds to the token or ticket; the proxy
// decides, the API never sees it. A rotated Secret gives a new
// ClusterConfig, so the caller builds a new Provider whose connections
// present the new certificate (internal/hypervisors.Registry.Connect).

// Reasons of the client-certificate errors, as conditions show them.
const (
	// reasonInvalidClientCert: the configured certificate or key cannot be
	// used (found before any connection).
	reasonInvalidClientCert = "InvalidClientCertificate"
	// reasonClientCertRefused: the proxy refused the certificate, or
	// wanted one and got none.
	reasonClientCertRefused = "ClientCertificateRefused"
)

// clientCertificate parses the configured client certificate and key. It
// returns nil when none is configured and a Configuration error
// (reasonInvalidClientCert, naming the field and the fix) when they cannot
// work: one without the other, no PEM certificate, a key that is not the
// certificate's, a certificate outside its validity at now, or one whose
// extended key usage excludes client authentication (every proxy refuses
// those, with less helpful words).
func clientCertificate(cfg provider.ClusterConfig, now time.Time) (*tls.Certificate, error) {
	certPEM, keyPEM := cfg.ClientCertificate, cfg.ClientKey
	if len(certPEM) == 0 && len(keyPEM) == 0 {
		return nil, nil
	}
	invalid := func(format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, reasonInvalidClientCert,
			"hypervisor cluster %q: spec.credentials.clientCert: %w", cfg.Name, fmt.Errorf(format, args...))
	}
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, invalid("the certificate and the private key must both be set; put the PEM certificate under certificateKey and its PEM private key under privateKeyKey")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, invalid("%w; put the PEM certificate (leaf first) under certificateKey and its own unencrypted PEM private key under privateKeyKey", err)
	}
	leaf := pair.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, invalid("parse the certificate: %w", err)
		}
		pair.Leaf = leaf
	}
	switch {
	case now.Before(leaf.NotBefore):
		return nil, invalid("the certificate %q is not valid before %s; wait or issue one valid now", leaf.Subject, leaf.NotBefore.UTC().Format(time.RFC3339))
	case now.After(leaf.NotAfter):
		return nil, invalid("the certificate %q expired at %s; renew it in the Secret", leaf.Subject, leaf.NotAfter.UTC().Format(time.RFC3339))
	case len(leaf.ExtKeyUsage) > 0 && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) && !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny):
		return nil, invalid("the certificate %q does not allow client authentication (its extended key usage lacks clientAuth); issue one for clientAuth", leaf.Subject)
	}
	return &pair, nil
}

// presentAlways makes the client send cert whatever the server's
// certificate request lists as acceptable issuers. Go's default choice
// sends nothing when the certificate's issuer is not in that list, and the
// proxy would then report a missing certificate where the truth is an
// untrusted one.
func presentAlways(cert *tls.Certificate) func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
}

// nginx answers a request whose client certificate it refused with a 400
// and an HTML page that carries one of these texts (ngx_http_special_response.c);
// the status line only says "Bad Request".
var proxyRefusals = []string{
	"No required SSL certificate was sent",
	"The SSL certificate error",
}

// proxyRefusal returns the proxy's words if an answer with status code
// and body is a proxy's refusal of the client certificate, "" otherwise.
func proxyRefusal(code int, body []byte) string {
	if code != http.StatusBadRequest {
		return ""
	}
	for _, text := range proxyRefusals {
		if strings.Contains(string(body), text) {
			return text
		}
	}
	return ""
}

// clientCertRefused is the error of a request the proxy answered with a
// refusal of the client certificate.
func clientCertRefused(method, endpoint, refusal string) error {
	hint := "the proxy requires a client certificate: set spec.credentials.clientCert to a Secret holding one it trusts (tls.crt and tls.key)"
	if refusal == proxyRefusals[1] {
		hint = "the certificate of spec.credentials.clientCert must be signed by a CA the proxy trusts (nginx: ssl_client_certificate), be valid now and allow clientAuth"
	}
	return provider.Errorf(provider.ClassConfiguration, reasonClientCertRefused,
		"%s %s: the TLS proxy in front of the Proxmox API refused the client certificate (400 %q); %s", method, endpoint, refusal, hint)
}

// tlsRefusalAlerts are the TLS alerts a server sends when it refuses the
// client's certificate or gets none (RFC 8446 section 6.2), by their text
// in crypto/tls.
var tlsRefusalAlerts = []string{
	"tls: bad certificate",
	"tls: unsupported certificate",
	"tls: revoked certificate",
	"tls: expired certificate",
	"tls: unknown certificate",
	"tls: unknown certificate authority",
	"tls: access denied",
	"tls: certificate required",
}

// peerRefusedCertificate reports whether err is the server's TLS alert
// refusing the client certificate: the way proxies other than nginx (HAProxy,
// Envoy) refuse one, during or right after the handshake.
func peerRefusedCertificate(err error) (string, bool) {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return "", false
	}
	msg := op.Err.Error()
	return msg, slices.Contains(tlsRefusalAlerts, msg)
}
