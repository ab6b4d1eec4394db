package externaldns

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The DNSEndpoint kind of external-dns's CRD source: its API group and
// version, as external-dns's --crd-source-apiversion and --crd-source-kind
// name them by default.
var (
	GroupVersion = schema.GroupVersion{Group: "externaldns.k8s.io", Version: "v1alpha1"}
	Kind         = "DNSEndpoint"
	// Resource is the CRD's plural, as RBAC rules and kubectl name it.
	Resource = "dnsendpoints"
	// CRDName is the name of external-dns's CustomResourceDefinition.
	CRDName = Resource + "." + GroupVersion.Group
)

// Labels of the DNSEndpoints HyperFleet writes. The owner labels are what
// List selects by and what makes an object HyperFleet's to update and
// delete; ProviderLabel lets an external-dns running with one provider
// pick the objects of its type (--label-filter).
const (
	ManagedByLabel = "hyperfleet.io/managed-by"
	ManagedByValue = "hyperfleet"
	InstallLabel   = "hyperfleet.io/dns-install"
	ClaimLabel     = "hyperfleet.io/dns-claim"
	ProviderLabel  = "hyperfleet.io/dns-provider"
)

// Record types HyperFleet writes.
const (
	typeA    = "A"
	typeAAAA = "AAAA"
	typePTR  = "PTR"
)

// endpoint mirrors one item of a DNSEndpoint's spec.endpoints (external-dns's
// endpoint.Endpoint as its CRD serializes it). It is a local copy rather
// than an import of sigs.k8s.io/external-dns, whose module would raise the
// operator's Kubernetes libraries to its own versions. Fields HyperFleet
// never writes are kept so that a foreign object reads back whole.
type endpoint struct {
	DNSName          string             `json:"dnsName,omitempty"`
	Targets          []string           `json:"targets,omitempty"`
	RecordType       string             `json:"recordType,omitempty"`
	SetIdentifier    string             `json:"setIdentifier,omitempty"`
	RecordTTL        int64              `json:"recordTTL,omitempty"`
	Labels           map[string]string  `json:"labels,omitempty"`
	ProviderSpecific []providerSpecific `json:"providerSpecific,omitempty"`
}

type providerSpecific struct {
	Name  string `json:"name,omitempty"`
	Value string `json:"value,omitempty"`
}

// spec mirrors a DNSEndpoint's spec.
type spec struct {
	Endpoints []endpoint `json:"endpoints,omitempty"`
}

// newObject returns an empty DNSEndpoint of the given name and namespace.
func newObject(namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(GroupVersion.WithKind(Kind))
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// newList returns an empty DNSEndpointList.
func newList() *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(GroupVersion.WithKind(Kind + "List"))
	return l
}

// readSpec reads u's spec.endpoints; an object whose spec does not parse
// has none.
func readSpec(u *unstructured.Unstructured) spec {
	var s spec
	raw, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return s
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &s); err != nil {
		return spec{}
	}
	return s
}

// writeSpec sets u's spec to s.
func writeSpec(u *unstructured.Unstructured, s spec) error {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&s)
	if err != nil {
		return fmt.Errorf("encode DNSEndpoint spec: %w", err)
	}
	u.Object["spec"] = raw
	return nil
}

// ObjectName is the name of the DNSEndpoint holding the records of name
// (a fully qualified DNS name, trailing dot optional): hf- and the name in
// lower case, without its trailing dot, when that is a valid object name;
// else hf- and a hash of it (a name with '_', or longer than 250
// characters). One name is one object, so two claims that register the
// same name race on one create, which the API server lets only one win.
func ObjectName(name string) string {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	if o := "hf-" + n; len(validation.IsDNS1123Subdomain(o)) == 0 {
		return o
	}
	sum := sha256.Sum256([]byte(n))
	return "hf-" + hex.EncodeToString(sum[:16])
}

// dnsName is the form external-dns's endpoints take: lower case, no
// trailing dot (its CRD source drops A, AAAA and PTR endpoints whose
// targets end with a dot, and compares names without one).
func dnsName(fqdn string) string { return strings.TrimSuffix(strings.ToLower(fqdn), ".") }

// endpointAddrs parses the targets of the A and AAAA endpoints at name in
// eps; targets that are not addresses are left out.
func endpointAddrs(eps []endpoint, name string) []netip.Addr {
	var out []netip.Addr
	for _, ep := range eps {
		if dnsName(ep.DNSName) != name || (ep.RecordType != typeA && ep.RecordType != typeAAAA) {
			continue
		}
		for _, t := range ep.Targets {
			if a, err := netip.ParseAddr(t); err == nil {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}
