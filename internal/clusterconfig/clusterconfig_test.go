package clusterconfig

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// TestResolveCloneLimits: the operator's clone limits for a cluster
// without spec.limits are the API's defaults (which the CRD applies to a
// field left out of limits; api/v1alpha1's TestCloneLimitDefaults checks
// that side).
func TestResolveCloneLimits(t *testing.T) {
	for name, limits := range map[string]*hfv1.HypervisorLimits{"unset": nil, "empty": {}} {
		cfg, err := Resolve(context.Background(), nil, &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Limits: limits}})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ClonesPerNode != hfv1.DefaultClonesPerNode || cfg.ClonesPerStorage != hfv1.DefaultClonesPerStorage {
			t.Errorf("limits %s: clones per node %d, per storage %d; want the API defaults %d and %d",
				name, cfg.ClonesPerNode, cfg.ClonesPerStorage, hfv1.DefaultClonesPerNode, hfv1.DefaultClonesPerStorage)
		}
	}
	cfg, err := Resolve(context.Background(), nil, &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Limits: &hfv1.HypervisorLimits{ClonesPerNode: 1, ClonesPerStorage: 7}}})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ClonesPerNode != 1 || cfg.ClonesPerStorage != 7 {
		t.Errorf("explicit limits 1 and 7 became %d and %d", cfg.ClonesPerNode, cfg.ClonesPerStorage)
	}
}

// TestProxmoxSettings: each Proxmox setting is read, by the registered
// kind, from spec.proxmox, else from its deprecated top-level field
// (clusters written before spec.proxmox keep working), else its default; a
// cluster is told about each deprecated field it sets and about no other.
func TestProxmoxSettings(t *testing.T) {
	legacyRange, newRange := &hfv1.VMIDRange{Start: 1000, End: 1999}, &hfv1.VMIDRange{Start: 5000, End: 5999}
	for _, tc := range []struct {
		name       string
		spec       hfv1.HypervisorClusterSpec
		start, end int
		iso        string
		deprecated []MovedField
	}{
		{name: "neither: the defaults", start: 100, end: 999999999, iso: hfv1.DefaultISOStorage},
		{name: "an empty proxmox section: the defaults", spec: hfv1.HypervisorClusterSpec{Proxmox: &hfv1.ProxmoxClusterSettings{}},
			start: 100, end: 999999999, iso: hfv1.DefaultISOStorage},
		{name: "the deprecated fields alone still work", spec: hfv1.HypervisorClusterSpec{VMIDRange: legacyRange, ISOStorage: "isos"}, //nolint:staticcheck // the deprecated fields under test
			start: 1000, end: 1999, iso: "isos",
			deprecated: []MovedField{{Field: "spec.vmidRange", Replacement: "spec.proxmox.vmidRange"}, {Field: "spec.isoStorage", Replacement: "spec.proxmox.isoStorage"}}},
		{name: "the proxmox section alone", spec: hfv1.HypervisorClusterSpec{Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange, ISOStorage: "cephfs"}},
			start: 5000, end: 5999, iso: "cephfs"},
		{name: "the section wins over a deprecated field (admission refuses both; the reader still picks one)",
			spec:  hfv1.HypervisorClusterSpec{VMIDRange: legacyRange, ISOStorage: "isos", Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange, ISOStorage: "cephfs"}}, //nolint:staticcheck // the deprecated fields under test
			start: 5000, end: 5999, iso: "cephfs",
			deprecated: []MovedField{{Field: "spec.vmidRange", Replacement: "spec.proxmox.vmidRange"}, {Field: "spec.isoStorage", Replacement: "spec.proxmox.isoStorage"}}},
		{name: "one setting moved, the other still deprecated", spec: hfv1.HypervisorClusterSpec{ISOStorage: "isos", Proxmox: &hfv1.ProxmoxClusterSettings{VMIDRange: newRange}}, //nolint:staticcheck // the deprecated fields under test
			start: 5000, end: 5999, iso: "isos", deprecated: []MovedField{{Field: "spec.isoStorage", Replacement: "spec.proxmox.isoStorage"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.spec.Provider = hfv1.ProviderProxmox
			c := &hfv1.HypervisorCluster{Spec: tc.spec}
			cfg, err := Resolve(context.Background(), nil, c)
			if err != nil {
				t.Fatal(err)
			}
			if want := (proxmox.ClusterSettings{ISOStorage: tc.iso}); cfg.VMIDStart != tc.start || cfg.VMIDEnd != tc.end || cfg.Settings != want {
				t.Errorf("the provider is configured with VM ids %d-%d and settings %+v, want %d-%d and %+v",
					cfg.VMIDStart, cfg.VMIDEnd, cfg.Settings, tc.start, tc.end, want)
			}
			if got := Deprecated(c); !slices.Equal(got, tc.deprecated) {
				t.Errorf("Deprecated = %v, want %v", got, tc.deprecated)
			}
		})
	}
}

// TestClientCert: spec.credentials.clientCert is read from the keys of a
// kubernetes.io/tls Secret unless it names others, both keys are among the
// Secrets the cluster reads (so a rotated Secret is noticed), and a
// missing Secret or key is secretref.ErrMissing naming the field.
func TestClientCert(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hf", Name: "pve-token"}, Data: map[string][]byte{"id": []byte("op@pve!t"), "secret": []byte("s")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hf", Name: "tls"}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": []byte("CERT"), "tls.key": []byte("KEY")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hf", Name: "opaque"}, Data: map[string][]byte{"client.pem": []byte("CERT2"), "client-key.pem": []byte("KEY2")}},
	).Build()
	cluster := func(cc *hfv1.ClientCertificateSelector) *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Credentials: hfv1.HypervisorCredentials{
			TokenID:     &hfv1.SecretKeySelector{Namespace: "hf", Name: "pve-token", Key: "id"},
			TokenSecret: &hfv1.SecretKeySelector{Namespace: "hf", Name: "pve-token", Key: "secret"},
			ClientCert:  cc,
		}}}
	}
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		cc        *hfv1.ClientCertificateSelector
		cert, key string
		missing   string
	}{
		{name: "none", cc: nil},
		{name: "kubernetes.io/tls defaults", cc: &hfv1.ClientCertificateSelector{Namespace: "hf", Name: "tls"}, cert: "CERT", key: "KEY"},
		{name: "named keys", cc: &hfv1.ClientCertificateSelector{Namespace: "hf", Name: "opaque", CertificateKey: "client.pem", PrivateKeyKey: "client-key.pem"}, cert: "CERT2", key: "KEY2"},
		{name: "missing Secret", cc: &hfv1.ClientCertificateSelector{Namespace: "hf", Name: "nope"}, missing: "spec.credentials.clientCert.certificateKey: Secret hf/nope does not exist"},
		{name: "missing key", cc: &hfv1.ClientCertificateSelector{Namespace: "hf", Name: "opaque", CertificateKey: "client.pem"}, missing: `spec.credentials.clientCert.privateKeyKey: Secret hf/opaque has no key "tls.key"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := cluster(tc.cc)
			cfg, err := Resolve(ctx, reader, c)
			if tc.missing != "" {
				if !errors.Is(err, secretref.ErrMissing) || !strings.Contains(err.Error(), tc.missing) {
					t.Fatalf("Resolve: %v, want ErrMissing saying %q", err, tc.missing)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(cfg.ClientCertificate) != tc.cert || string(cfg.ClientKey) != tc.key {
				t.Fatalf("client certificate %q, key %q; want %q and %q", cfg.ClientCertificate, cfg.ClientKey, tc.cert, tc.key)
			}
			refs := map[string]bool{}
			for _, r := range SecretRefs(c) {
				refs[r.Namespace+"/"+r.Name+"/"+r.Key] = true
			}
			if tc.cc != nil {
				cert, key := ClientCertRefs(tc.cc)
				for _, r := range []*hfv1.SecretKeySelector{cert, key} {
					if !refs[r.Namespace+"/"+r.Name+"/"+r.Key] {
						t.Errorf("SecretRefs %v lacks %s/%s/%s", refs, r.Namespace, r.Name, r.Key)
					}
				}
			}
		})
	}
}

// TestExternalDNSLabel: externalDNS.labelValue reaches the back-end as an
// option; a cluster stored with the refused types route53 or cloudflare is
// told to move to external-dns with that label (it keeps working: the
// type is the label, internal/dnsreg/externaldns's Factory), one of type
// external-dns is told nothing.
func TestExternalDNSLabel(t *testing.T) {
	cluster := func(typ hfv1.DNSProviderType, ext *hfv1.ExternalDNSSettings) *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{DNS: &hfv1.ClusterDNSSettings{
			DNSSettings: hfv1.DNSSettings{Domain: "ci.example.com"},
			DNSProvider: &hfv1.DNSProvider{Type: typ, ExternalDNS: ext},
		}}}
	}
	c := cluster("external-dns", &hfv1.ExternalDNSSettings{LabelValue: "route53"})
	cfg, err := DNS(context.Background(), nil, c)
	if err != nil || cfg.Options["labelValue"] != "route53" {
		t.Errorf("DNS options %v (%v), want labelValue route53", cfg.Options, err)
	}
	if got := Deprecated(c); len(got) != 0 {
		t.Errorf("type external-dns is deprecated: %v", got)
	}
	want := []MovedField{{Field: "spec.dns.dnsProvider.type cloudflare", Replacement: "type external-dns with externalDNS.labelValue cloudflare"}}
	if got := Deprecated(cluster("cloudflare", nil)); !slices.Equal(got, want) {
		t.Errorf("Deprecated of type cloudflare = %v, want %v", got, want)
	}
}
