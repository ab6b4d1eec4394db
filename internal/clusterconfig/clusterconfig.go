// Package clusterconfig resolves a HypervisorCluster into the
// configuration its provider connects with: the cluster's spec and the
// Secrets it references (Resolve), which Secrets those are (SecretRefs),
// and the deprecated fields a cluster still sets (Deprecated). The
// cluster's own hypervisor section (spec.<kind>) is read by its kind
// (provider.Kind.ReadCluster), never here.
package clusterconfig

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Resolve resolves a HypervisorCluster's spec and the Secrets it
// references (read with reader) into a provider.ClusterConfig: the neutral
// fields here, the kind's own section by its registered kind
// (provider.KindOf(spec.provider)). Errors name the field; a missing
// Secret or key wraps secretref.ErrMissing.
func Resolve(ctx context.Context, reader client.Reader, c *hfv1.HypervisorCluster) (provider.ClusterConfig, error) {
	s := c.Spec
	cfg := provider.ClusterConfig{
		Name:             c.Name,
		Endpoint:         s.Endpoint,
		Nodes:            s.Nodes,
		DefaultStorage:   s.DefaultStorage,
		DefaultBridge:    s.DefaultBridge,
		Tags:             s.Tags,
		ClonesPerNode:    hfv1.DefaultClonesPerNode,
		ClonesPerStorage: hfv1.DefaultClonesPerStorage,
		Isolated:         s.Network != nil && s.Network.Isolation != nil,
	}
	// A kind this build does not register reads nothing: its part stays
	// unset. The HypervisorCluster controller refuses such a cluster
	// before it resolves it (UnknownKind).
	kind, known := provider.KindOf(s.Provider)
	if known {
		if err := kind.ReadCluster(c, &cfg); err != nil {
			return cfg, err
		}
		if err := readSectionSecrets(ctx, reader, kind, c, &cfg); err != nil {
			return cfg, err
		}
	}
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

// SectionSecrets is a Kind whose own section (spec.<kind>) references
// Secrets: ReadCluster is pure, so the Secrets are read here, and handed
// back to the kind by field. Proxmox's section references none and does
// not implement it.
type SectionSecrets interface {
	// SectionSecretRefs lists the Secret keys the section references, by
	// the field path that selects each (for messages).
	SectionSecretRefs(cluster *hfv1.HypervisorCluster) map[string]*hfv1.SecretKeySelector
	// ReadSectionSecrets sets in cfg (after ReadCluster) what those keys
	// hold, by field.
	ReadSectionSecrets(cfg *provider.ClusterConfig, values map[string][]byte) error
}

// readSectionSecrets reads the Secrets of kind's section into cfg, when
// the kind has any.
func readSectionSecrets(ctx context.Context, reader client.Reader, kind provider.Kind, c *hfv1.HypervisorCluster, cfg *provider.ClusterConfig) error {
	sk, ok := kind.(SectionSecrets)
	if !ok {
		return nil
	}
	refs := sk.SectionSecretRefs(c)
	values := make(map[string][]byte, len(refs))
	for _, field := range slices.Sorted(maps.Keys(refs)) {
		ref := refs[field]
		v, err := secretref.Value(ctx, reader, field, ref.Namespace, ref.Name, ref.Key)
		if err != nil {
			return err
		}
		values[field] = v
	}
	return sk.ReadSectionSecrets(cfg, values)
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
	if kind, ok := provider.KindOf(c.Spec.Provider); ok {
		if sk, ok := kind.(SectionSecrets); ok {
			refs := sk.SectionSecretRefs(c)
			for _, field := range slices.Sorted(maps.Keys(refs)) {
				out = append(out, refs[field])
			}
		}
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

// UnknownKind is the error of a cluster whose spec.provider names no kind
// this operator build registers.
func UnknownKind(name hfv1.HypervisorProvider) error {
	return provider.Errorf(provider.ClassConfiguration, "UnknownProvider", "spec.provider: no implementation for %q in this operator build", name)
}

// MovedField is a deprecated field a cluster sets, with the path that
// replaces it.
type MovedField = provider.MovedField

// Deprecated lists the deprecated fields cluster sets: first those its
// kind's section replaced (provider.Kind.MovedFields), then the shared
// ones, in the order of the spec. Each still works (its reader falls back
// to it when its replacement is unset); the HypervisorCluster controller
// reports them in a DeprecatedField event.
func Deprecated(cluster *hfv1.HypervisorCluster) []MovedField {
	var out []MovedField
	s := cluster.Spec
	if kind, ok := provider.KindOf(s.Provider); ok {
		out = append(out, kind.MovedFields(cluster)...)
	}
	// Read as tokenID (api/v1alpha1/spelling.go); the API server refuses
	// it on a write that changes spec.credentials.
	if s.Credentials.DeprecatedTokenID != nil { //nolint:staticcheck // reports the deprecated field
		out = append(out, MovedField{Field: "spec.credentials.tokenId", Replacement: "spec.credentials.tokenID"})
	}
	if d := s.DNS; d != nil && d.DNSProvider != nil {
		// Stored before the types were refused; they work as external-dns
		// labelled with the type (internal/dnsreg/externaldns, Factory).
		if t := d.DNSProvider.Type; t == "route53" || t == "cloudflare" {
			out = append(out, MovedField{Field: "spec.dns.dnsProvider.type " + string(t), Replacement: "type external-dns with externalDNS.labelValue " + string(t)})
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
