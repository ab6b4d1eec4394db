// Package clusterconfig resolves a HypervisorCluster into the
// configuration its provider connects with: the cluster's spec and the
// Secrets it references (Resolve), which Secrets those are (SecretRefs),
// and the one reader of each provider setting that also has a deprecated
// top-level field (VMIDRange, ISOStorage, Deprecated).
package clusterconfig

import (
	"cmp"
	"context"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Resolve resolves a HypervisorCluster's spec and the Secrets it
// references (read with reader) into a provider.ClusterConfig. Errors name
// the field; a missing Secret or key wraps secretref.ErrMissing.
func Resolve(ctx context.Context, reader client.Reader, c *hfv1.HypervisorCluster) (provider.ClusterConfig, error) {
	s := c.Spec
	cfg := provider.ClusterConfig{
		Name:             c.Name,
		Endpoint:         s.Endpoint,
		Nodes:            s.Nodes,
		DefaultStorage:   s.DefaultStorage,
		ISOStorage:       ISOStorage(c),
		DefaultBridge:    s.DefaultBridge,
		Tags:             s.Tags,
		ClonesPerNode:    hfv1.DefaultClonesPerNode,
		ClonesPerStorage: hfv1.DefaultClonesPerStorage,
	}
	cfg.VMIDStart, cfg.VMIDEnd = VMIDRange(c)
	if l := s.Limits; l != nil {
		if l.ClonesPerNode > 0 {
			cfg.ClonesPerNode = int(l.ClonesPerNode)
		}
		if l.ClonesPerStorage > 0 {
			cfg.ClonesPerStorage = int(l.ClonesPerStorage)
		}
		if l.MaxMachines != nil {
			cfg.MaxMachines = int(*l.MaxMachines)
		}
	}
	read := func(field string, ref *hfv1.SecretKeySelector) (string, error) {
		if ref == nil {
			return "", nil
		}
		v, err := secretref.Value(ctx, reader, field, ref.Namespace, ref.Name, ref.Key)
		return string(v), err
	}
	var err error
	cr := s.Credentials
	if cfg.TokenID, err = read("spec.credentials.tokenID", cr.TokenID); err != nil {
		return cfg, err
	}
	if cfg.TokenSecret, err = read("spec.credentials.tokenSecret", cr.TokenSecret); err != nil {
		return cfg, err
	}
	if cfg.Username, err = read("spec.credentials.username", cr.Username); err != nil {
		return cfg, err
	}
	if cfg.Password, err = read("spec.credentials.password", cr.Password); err != nil {
		return cfg, err
	}
	if cc := cr.ClientCert; cc != nil {
		certRef, keyRef := ClientCertRefs(cc)
		if cfg.ClientCertificate, err = secretref.Value(ctx, reader, "spec.credentials.clientCert.certificateKey", certRef.Namespace, certRef.Name, certRef.Key); err != nil {
			return cfg, err
		}
		if cfg.ClientKey, err = secretref.Value(ctx, reader, "spec.credentials.clientCert.privateKeyKey", keyRef.Namespace, keyRef.Name, keyRef.Key); err != nil {
			return cfg, err
		}
	}
	if t := s.TLS; t != nil {
		cfg.FingerprintSHA256 = t.FingerprintSHA256
		cfg.InsecureSkipVerify = t.InsecureSkipVerify
		if t.CABundleRef != nil {
			ca, err := read("spec.tls.caBundleRef", t.CABundleRef)
			if err != nil {
				return cfg, err
			}
			cfg.CABundle = []byte(ca)
		}
	}
	return cfg, nil
}

// ClientCertRefs are the two Secret keys spec.credentials.clientCert
// selects, the certificate's and the private key's, with the defaults of a
// kubernetes.io/tls Secret for keys left unset.
func ClientCertRefs(cc *hfv1.ClientCertificateSelector) (cert, key *hfv1.SecretKeySelector) {
	cert = &hfv1.SecretKeySelector{Namespace: cc.Namespace, Name: cc.Name, Key: cmp.Or(cc.CertificateKey, hfv1.DefaultClientCertificateKey)}
	key = &hfv1.SecretKeySelector{Namespace: cc.Namespace, Name: cc.Name, Key: cmp.Or(cc.PrivateKeyKey, hfv1.DefaultClientPrivateKeyKey)}
	return cert, key
}

// SecretRefs lists every Secret a cluster reads.
func SecretRefs(c *hfv1.HypervisorCluster) []*hfv1.SecretKeySelector {
	var out []*hfv1.SecretKeySelector
	cr := c.Spec.Credentials
	for _, r := range []*hfv1.SecretKeySelector{cr.TokenID, cr.TokenSecret, cr.Username, cr.Password} {
		if r != nil {
			out = append(out, r)
		}
	}
	if cr.ClientCert != nil {
		cert, key := ClientCertRefs(cr.ClientCert)
		out = append(out, cert, key)
	}
	if c.Spec.TLS != nil && c.Spec.TLS.CABundleRef != nil {
		out = append(out, c.Spec.TLS.CABundleRef)
	}
	if store := SecretStoreOf(c); store != nil {
		out = append(out, &store.TokenRef)
		if store.CABundleRef != nil {
			out = append(out, store.CABundleRef)
		}
	}
	return out
}

// SecretStoreOf is the cluster's spec.spire.secretStore, nil when its VMs
// use the broker.
func SecretStoreOf(cluster *hfv1.HypervisorCluster) *hfv1.SecretStoreConfig {
	if c := cluster.Spec.SPIRE; c != nil {
		return c.SecretStore
	}
	return nil
}

// VMIDRange is the block of VM ids placement allocates from on cluster:
// spec.proxmox.vmidRange, else the deprecated spec.vmidRange, else every id
// Proxmox allows.
func VMIDRange(cluster *hfv1.HypervisorCluster) (start, end int) {
	rg := cluster.Spec.VMIDRange //nolint:staticcheck // the one reader of the deprecated field
	if p := cluster.Spec.Proxmox; p != nil && p.VMIDRange != nil {
		rg = p.VMIDRange
	}
	if rg != nil {
		return int(rg.Start), int(rg.End)
	}
	return defaultVMIDStart, defaultVMIDEnd
}

// The VM id range placement uses when a cluster sets none: every id
// Proxmox allows.
const (
	defaultVMIDStart = 100
	defaultVMIDEnd   = 999999999
)

// ISOStorage is the storage that receives cluster's cloud-init ISOs:
// spec.proxmox.isoStorage, else the deprecated spec.isoStorage, else
// hfv1.DefaultISOStorage.
func ISOStorage(cluster *hfv1.HypervisorCluster) string {
	var fromSection string
	if p := cluster.Spec.Proxmox; p != nil {
		fromSection = p.ISOStorage
	}
	return cmp.Or(fromSection, cluster.Spec.ISOStorage, hfv1.DefaultISOStorage) //nolint:staticcheck // the one reader of the deprecated field
}

// MovedField is a deprecated field a cluster sets, with the path that
// replaces it.
type MovedField struct {
	Field, Replacement string
}

// Deprecated lists the deprecated fields cluster sets, in the order of the
// spec. Each still works (VMIDRange, ISOStorage read it when its
// replacement is unset); the HypervisorCluster controller reports them in
// a DeprecatedField event.
func Deprecated(cluster *hfv1.HypervisorCluster) []MovedField {
	var out []MovedField
	s := cluster.Spec
	if s.VMIDRange != nil { //nolint:staticcheck // reports the deprecated field
		out = append(out, MovedField{"spec.vmidRange", "spec.proxmox.vmidRange"})
	}
	if s.ISOStorage != "" { //nolint:staticcheck // reports the deprecated field
		out = append(out, MovedField{"spec.isoStorage", "spec.proxmox.isoStorage"})
	}
	// Read as tokenID (api/v1alpha1/spelling.go); the API server refuses
	// it on a write that changes spec.credentials.
	if s.Credentials.DeprecatedTokenID != nil { //nolint:staticcheck // reports the deprecated field
		out = append(out, MovedField{"spec.credentials.tokenId", "spec.credentials.tokenID"})
	}
	if d := s.DNS; d != nil && d.DNSProvider != nil {
		// Stored before the types were refused; they work as external-dns
		// labelled with the type (internal/dnsreg/externaldns, Factory).
		if t := d.DNSProvider.Type; t == "route53" || t == "cloudflare" {
			out = append(out, MovedField{"spec.dns.dnsProvider.type " + string(t), "type external-dns with externalDNS.labelValue " + string(t)})
		}
	}
	return out
}

// DNSSecretRefs lists the Secrets a cluster's spec.dns.dnsProvider reads
// (its credentials). They are not among SecretRefs: a changed TSIG key
// rebuilds the cluster's DNS registrar, not its hypervisor connection.
func DNSSecretRefs(c *hfv1.HypervisorCluster) []*hfv1.SecretKeySelector {
	d := c.Spec.DNS
	if d == nil || d.DNSProvider == nil {
		return nil
	}
	out := make([]*hfv1.SecretKeySelector, 0, len(d.DNSProvider.Credentials))
	for i := range d.DNSProvider.Credentials {
		out = append(out, &d.DNSProvider.Credentials[i].SecretKeyRef)
	}
	return out
}

// DNSZone is the zone a cluster's VMs are registered in:
// spec.dns.dnsProvider.zone, else spec.dns.domain.
func DNSZone(c *hfv1.HypervisorCluster) string {
	d := c.Spec.DNS
	if d == nil {
		return ""
	}
	if p := d.DNSProvider; p != nil && p.Zone != "" {
		return p.Zone
	}
	return d.Domain
}

// DNS resolves a cluster's spec.dns.dnsProvider and the Secrets its
// credentials reference (read with reader) into the configuration its DNS
// back-end is built from (dnsreg.New). The rfc2136 settings become the
// options server and transport, the externalDNS settings the option
// namespace. Errors name the field; a missing Secret or key wraps
// secretref.ErrMissing. The cluster must have a dnsProvider.
func DNS(ctx context.Context, reader client.Reader, c *hfv1.HypervisorCluster) (dnsreg.Config, error) {
	p := c.Spec.DNS.DNSProvider
	ttl := p.TTLSeconds
	if ttl == 0 {
		ttl = hfv1.DefaultDNSTTLSeconds
	}
	cfg := dnsreg.Config{
		Zone:         DNSZone(c),
		ReverseZones: p.ReverseZones,
		TTL:          time.Duration(ttl) * time.Second,
		Options:      map[string]string{},
		Credentials:  map[string][]byte{},
	}
	if r := p.RFC2136; r != nil {
		cfg.Options["server"] = r.Server
		cfg.Options["transport"] = cmp.Or(r.Transport, hfv1.DNSTransportTCP)
	}
	if e := p.ExternalDNS; e != nil && e.Namespace != "" {
		cfg.Options["namespace"] = e.Namespace
	}
	if e := p.ExternalDNS; e != nil && e.LabelValue != "" {
		cfg.Options["labelValue"] = e.LabelValue
	}
	for _, cred := range p.Credentials {
		ref := cred.SecretKeyRef
		v, err := secretref.Value(ctx, reader, "spec.dns.dnsProvider.credentials["+cred.Name+"]", ref.Namespace, ref.Name, ref.Key)
		if err != nil {
			return cfg, err
		}
		cfg.Credentials[cred.Name] = v
	}
	return cfg, nil
}
