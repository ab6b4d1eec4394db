// Package externaldns is the dnsreg back-end of dns.dnsProvider type
// external-dns (and of the refused route53 and cloudflare a cluster may
// still be stored with, the same under another label): it writes
// each VM's records as a DNSEndpoint object (externaldns.k8s.io/v1alpha1,
// the kind of external-dns's CRD source) through the Kubernetes API, and an
// external-dns that the platform team runs, with the DNS provider of its
// choice, publishes them. HyperFleet holds no DNS credentials in this mode.
//
// # The objects
//
// One DNSEndpoint per registered name (a claim registers one, its FQDN),
// named after the name (ObjectName), in the namespace
// dnsProvider.externalDNS.namespace names, else the operator's own:
//
//	apiVersion: externaldns.k8s.io/v1alpha1
//	kind: DNSEndpoint
//	metadata:
//	  name: hf-vm-1.ci.example.com
//	  namespace: hyperfleet-system
//	  labels:
//	    hyperfleet.io/managed-by: hyperfleet
//	    hyperfleet.io/dns-install: <operator id>
//	    hyperfleet.io/dns-claim: <claim UID>
//	    hyperfleet.io/dns-provider: external-dns   # or externalDNS.labelValue
//	spec:
//	  endpoints:
//	  - {dnsName: vm-1.ci.example.com, recordType: A, targets: [192.0.2.10], recordTTL: 300}
//	  - {dnsName: vm-1.ci.example.com, recordType: AAAA, targets: ["2001:db8::10"], recordTTL: 300}
//	  - {dnsName: 10.2.0.192.in-addr.arpa, recordType: PTR, targets: [vm-1.ci.example.com], recordTTL: 300}
//
// # Ownership
//
// The owner is in the object's labels, not in DNS (external-dns keeps its
// own ownership records there): List selects the install's objects by
// label, and an object is updated or deleted only while its labels name the
// same claim of the same install. The rules of package dnsreg hold with
// objects for names:
//
//   - a name is registered only when no DNSEndpoint in any namespace has a
//     record at it or at one of its reverse names, or the name's own object
//     is already this claim's; anything else (another claim's, another
//     install's, a DNSEndpoint someone wrote by hand) is refused with
//     ErrNameTaken and left alone. Records that exist in DNS without a
//     DNSEndpoint are not seen here: external-dns, with its TXT registry,
//     leaves records it does not own alone and publishes nothing over them;
//   - the object's name is derived from the DNS name, so that two claims
//     registering one name race on one create, which the API server lets
//     only one win; updates and deletes carry the resource version read,
//     so a change made in between is read again, never overwritten;
//   - a record someone else writes at the same name lives in their own
//     DNSEndpoint, which HyperFleet never changes.
//
// Objects go to one namespace (per cluster) that only the platform team
// writes to, not the claims' namespaces: external-dns publishes whatever
// DNSEndpoint it finds, so a tenant who could write one there could publish
// any name, and the install's objects are found with one list.
//
// # Checks
//
// Check (the cluster's DNSReady condition) lists DNSEndpoints in the
// namespace (the CRD is installed), creates one there with dry run (the
// namespace exists, the operator may create, and admission accepts the
// shape HyperFleet writes), and asks the API server (SelfSubjectAccessReview)
// whether the operator may also update and delete them there and list them
// in every namespace. Whether external-dns runs, and publishes, is not
// checked: it is another program, watched by its own means (its metrics,
// and status.observedGeneration on each DNSEndpoint).
package externaldns

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// OptionNamespace is the option Factory reads the namespace from
// (dnsProvider.externalDNS.namespace).
const OptionNamespace = "namespace"

// OptionLabelValue is the option Factory reads the objects' ProviderLabel
// value from (dns.dnsProvider.externalDNS.labelValue); without it the
// label is the provider type.
const OptionLabelValue = "labelValue"

// Errors of the Kubernetes side, each with its condition reason
// (docs/troubleshooting.md).
var (
	// ErrCRDMissing: the API server does not serve DNSEndpoints.
	ErrCRDMissing = errclass.NewSentinel("the DNSEndpoint CRD (dnsendpoints.externaldns.k8s.io, version v1alpha1) is not installed: install external-dns's CRD (config/crd/standard/dnsendpoints.externaldns.k8s.io.yaml of the external-dns release you run, or its Helm chart's); see docs/networking.md",
		errclass.ClassConfiguration, "DNSEndpointCRDMissing")
	// ErrForbidden: the operator may not do what registration needs with
	// DNSEndpoints, or an admission policy refused one.
	ErrForbidden = errclass.NewSentinel("the operator may not write DNSEndpoints there", errclass.ClassConfiguration, "DNSEndpointForbidden")
	// ErrNamespaceMissing: the namespace the DNSEndpoints go to does not
	// exist.
	ErrNamespaceMissing = errclass.NewSentinel("the DNSEndpoints' namespace does not exist", errclass.ClassConfiguration, "DNSEndpointNamespaceMissing")
)

// reasonWriteFailed is the reason of the API server's other failures
// (timeouts, 5xx, conflicts that kept coming): transient, retried.
const reasonWriteFailed = "DNSEndpointWriteFailed"

// attempts bounds the reads and writes of one change that meet a
// concurrent change (a conflict, an object created or deleted in between).
const attempts = 3

// Config is one cluster's DNSEndpoints: where they go and which zones
// their names are in.
type Config struct {
	// Client writes the objects, uncached (dnsreg.Kubernetes).
	Client client.Client
	// Namespace is where the objects go.
	Namespace string
	// Provider is the objects' ProviderLabel value: externalDNS.labelValue,
	// else the dns.dnsProvider.type.
	Provider hfv1.DNSProviderType
	// Zone is the forward zone; ReverseZones the in-addr.arpa and
	// ip6.arpa zones PTRs are written for.
	Zone         string
	ReverseZones []string
	// TTL is the default TTL; zero means dnsreg.DefaultTTL.
	TTL time.Duration
}

// Registrar is the external-dns dnsreg.Registrar.
type Registrar struct {
	client    client.Client
	namespace string
	provider  hfv1.DNSProviderType
	zone      string
	reverse   []string
	ttl       time.Duration
}

var (
	_ dnsreg.Registrar = (*Registrar)(nil)
	_ dnsreg.Checker   = (*Registrar)(nil)
	_ dnsreg.Describer = (*Registrar)(nil)
)

// Factory returns the dnsreg.Factory of provider type t (one of
// dnsreg.ExternalDNSTypes): the objects go to the option namespace, else
// the operator's namespace (cfg.Kubernetes.Namespace). It takes no
// credentials: external-dns holds the DNS service's.
func Factory(t hfv1.DNSProviderType) dnsreg.Factory {
	return func(cfg dnsreg.Config) (dnsreg.Registrar, error) {
		if cfg.Kubernetes == nil || cfg.Kubernetes.Client == nil {
			return nil, fmt.Errorf("%w: type %s needs the operator's Kubernetes client, and none was given", dnsreg.ErrInvalid, t)
		}
		if len(cfg.Credentials) > 0 {
			return nil, fmt.Errorf("%w: type %s takes no credentials (external-dns holds the DNS service's); remove dns.dnsProvider.credentials", dnsreg.ErrInvalid, t)
		}
		ns := cfg.Options[OptionNamespace]
		if ns == "" {
			ns = cfg.Kubernetes.Namespace
		}
		return New(Config{
			Client: cfg.Kubernetes.Client, Namespace: ns, Provider: cmp.Or(hfv1.DNSProviderType(cfg.Options[OptionLabelValue]), t),
			Zone: cfg.Zone, ReverseZones: cfg.ReverseZones, TTL: cfg.TTL,
		})
	}
}

// New checks cfg and returns its Registrar.
func New(cfg Config) (*Registrar, error) {
	r := &Registrar{client: cfg.Client, namespace: cfg.Namespace, provider: cfg.Provider, ttl: cfg.TTL}
	if cfg.Client == nil {
		return nil, fmt.Errorf("%w: no Kubernetes client", dnsreg.ErrInvalid)
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return nil, fmt.Errorf("%w: namespace %q: %s", dnsreg.ErrInvalid, cfg.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(string(cfg.Provider)); cfg.Provider == "" || len(errs) > 0 {
		return nil, fmt.Errorf("%w: provider type %q is not a label value", dnsreg.ErrInvalid, cfg.Provider)
	}
	if r.ttl == 0 {
		r.ttl = dnsreg.DefaultTTL
	}
	if _, err := dnsreg.CheckTTL(r.ttl, 0); err != nil {
		return nil, err
	}
	var err error
	if r.zone, r.reverse, err = dnsreg.CheckZones(cfg.Zone, cfg.ReverseZones); err != nil {
		return nil, err
	}
	return r, nil
}

// Namespace is where the Registrar writes its objects.
func (r *Registrar) Namespace() string { return r.namespace }

// Checked implements dnsreg.Describer.
func (r *Registrar) Checked(zones string) string {
	return fmt.Sprintf("DNSEndpoints (externaldns.k8s.io/v1alpha1) can be written in namespace %s, labelled %s=%s, for zones %s; external-dns publishes them (it is not checked here)",
		r.namespace, ProviderLabel, r.provider, zones)
}

// Registered implements dnsreg.Describer.
func (r *Registrar) Registered(rec dnsreg.Record) string {
	return fmt.Sprintf("DNSEndpoint %s/%s holds %s with addresses %s, for external-dns to publish",
		r.namespace, ObjectName(rec.Name), dnsreg.Fqdn(rec.Name), addrList(rec.Addrs))
}

func addrList(addrs []netip.Addr) string {
	parts := make([]string, len(addrs))
	for i, a := range addrs {
		parts[i] = a.String()
	}
	return strings.Join(parts, ", ")
}

// checked is a Record validated and normalized.
type checked struct {
	fqdn  string
	name  string // the object's name
	addrs []netip.Addr
	ttl   uint32
	owner dnsreg.Owner
}

func (r *Registrar) check(rec dnsreg.Record, needAddrs bool) (checked, error) {
	c := checked{fqdn: dnsreg.Fqdn(rec.Name), owner: rec.Owner}
	if err := rec.Owner.Validate(); err != nil {
		return c, err
	}
	for what, v := range map[string]string{"owner claim": rec.Owner.Claim, "owner install": rec.Owner.Install} {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return c, fmt.Errorf("%w: %s %q is not a label value: %s", dnsreg.ErrInvalid, what, v, strings.Join(errs, "; "))
		}
	}
	var err error
	if c.fqdn, c.ttl, c.addrs, err = dnsreg.CheckRecord(rec, r.zone, r.ttl, needAddrs); err != nil {
		return c, err
	}
	c.name = ObjectName(c.fqdn)
	return c, nil
}

// reverseName returns addr's reverse name (fully qualified) when a
// configured reverse zone holds it.
func (r *Registrar) reverseName(addr netip.Addr) (string, bool) {
	name, err := dns.ReverseAddr(addr.String())
	if err != nil {
		return "", false
	}
	for _, z := range r.reverse {
		if dns.IsSubDomain(z, name) {
			return name, true
		}
	}
	return "", false
}

// endpoints are c's records as DNSEndpoint items, in a fixed order: one A
// and one AAAA endpoint with all the addresses of the family (as
// external-dns groups a name's targets), then a PTR per address in a
// reverse zone.
func (r *Registrar) endpoints(c checked) []endpoint {
	ttl := int64(c.ttl)
	name := dnsName(c.fqdn)
	var v4, v6 []string
	for _, a := range c.addrs {
		if a.Is4() {
			v4 = append(v4, a.String())
		} else {
			v6 = append(v6, a.String())
		}
	}
	var eps []endpoint
	if len(v4) > 0 {
		eps = append(eps, endpoint{DNSName: name, RecordType: typeA, Targets: v4, RecordTTL: ttl})
	}
	if len(v6) > 0 {
		eps = append(eps, endpoint{DNSName: name, RecordType: typeAAAA, Targets: v6, RecordTTL: ttl})
	}
	for _, a := range c.addrs {
		if rev, ok := r.reverseName(a); ok {
			eps = append(eps, endpoint{DNSName: dnsName(rev), RecordType: typePTR, Targets: []string{name}, RecordTTL: ttl})
		}
	}
	return eps
}

// labels are the labels of c's object.
func (r *Registrar) labels(o dnsreg.Owner) map[string]string {
	return map[string]string{
		ManagedByLabel: ManagedByValue,
		InstallLabel:   o.Install,
		ClaimLabel:     o.Claim,
		ProviderLabel:  string(r.provider),
	}
}

// ownedBy reports whether u is o's: HyperFleet's, of o's install and
// claim.
func ownedBy(u metav1.Object, o dnsreg.Owner) bool {
	l := u.GetLabels()
	return l[ManagedByLabel] == ManagedByValue && l[InstallLabel] == o.Install && l[ClaimLabel] == o.Claim
}

// ownerOf is the owner u's labels name; false for an object that is not
// HyperFleet's.
func ownerOf(u metav1.Object) (dnsreg.Owner, bool) {
	l := u.GetLabels()
	o := dnsreg.Owner{Install: l[InstallLabel], Claim: l[ClaimLabel]}
	if l[ManagedByLabel] != ManagedByValue || o.Validate() != nil {
		return dnsreg.Owner{}, false
	}
	return o, true
}

// Register implements dnsreg.Registrar: it creates the name's DNSEndpoint,
// or updates it when it is already this claim's and differs; a Register
// that changes nothing writes nothing.
func (r *Registrar) Register(ctx context.Context, rec dnsreg.Record) error {
	c, err := r.check(rec, true)
	if err != nil {
		return err
	}
	want := r.endpoints(c)
	for range attempts {
		obj := newObject(r.namespace, c.name)
		err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		switch {
		case apierrors.IsNotFound(err) && !isNoMatch(err):
			// A new name: free only if no DNSEndpoint has records at it or
			// at its reverse names.
			if err := r.checkUnused(ctx, c, want, nil); err != nil {
				return err
			}
			obj = newObject(r.namespace, c.name)
			obj.SetLabels(r.labels(c.owner))
			if err := writeSpec(obj, spec{Endpoints: want}); err != nil {
				return err
			}
			err = r.client.Create(ctx, obj)
			if apierrors.IsAlreadyExists(err) {
				// Created in between (a concurrent claim of the name, or
				// this claim's own earlier call): look again.
				continue
			}
			if err != nil {
				return r.apiError("create", c.name, c.fqdn, err)
			}
			return nil
		case err != nil:
			return r.apiError("read", c.name, c.fqdn, err)
		}
		if !ownedBy(obj, c.owner) {
			return fmt.Errorf("%s: %w (DNSEndpoint %s/%s holds it, and its labels name no %s)", c.fqdn, dnsreg.ErrNameTaken, r.namespace, c.name, c.owner)
		}
		have := readSpec(obj)
		if reflect.DeepEqual(have.Endpoints, want) && reflect.DeepEqual(obj.GetLabels(), r.labels(c.owner)) {
			return nil
		}
		// Reverse names this object does not hold yet must be free too.
		if err := r.checkUnused(ctx, c, want, have.Endpoints); err != nil {
			return err
		}
		obj.SetLabels(r.labels(c.owner))
		if err := writeSpec(obj, spec{Endpoints: want}); err != nil {
			return err
		}
		// The update carries the resource version read: a change made in
		// between makes it fail with a conflict, and the object is read
		// again.
		err = r.client.Update(ctx, obj)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) && !isNoMatch(err) {
			continue
		}
		if err != nil {
			return r.apiError("update", c.name, c.fqdn, err)
		}
		return nil
	}
	return errclass.Errorf(errclass.ClassTransient, reasonWriteFailed,
		"%s: DNSEndpoint %s/%s kept changing while HyperFleet wrote it; retried", c.fqdn, r.namespace, c.name)
}

// checkUnused refuses c when a DNSEndpoint other than c's own object has a
// record at a name of want that held does not have yet: c's name or one of
// its reverse names. Every namespace is searched: an external-dns that
// watches them all would publish a conflicting record from any.
func (r *Registrar) checkUnused(ctx context.Context, c checked, want, held []endpoint) error {
	names := map[string]bool{}
	for _, ep := range want {
		if !slices.ContainsFunc(held, func(h endpoint) bool { return dnsName(h.DNSName) == ep.DNSName }) {
			names[ep.DNSName] = true
		}
	}
	if len(names) == 0 {
		return nil
	}
	list := newList()
	if err := r.client.List(ctx, list); err != nil {
		return r.apiError("list (every namespace)", "", c.fqdn, err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.GetNamespace() == r.namespace && o.GetName() == c.name {
			continue
		}
		for _, ep := range readSpec(o).Endpoints {
			if n := dnsName(ep.DNSName); names[n] {
				return fmt.Errorf("%s: %w (DNSEndpoint %s/%s has a %s record there)", dnsreg.Fqdn(n), dnsreg.ErrNameTaken, o.GetNamespace(), o.GetName(), ep.RecordType)
			}
		}
	}
	return nil
}

// Remove implements dnsreg.Registrar: it deletes the name's DNSEndpoint
// while its labels name rec's owner, and leaves anyone else's alone.
// rec.Addrs play no part: the object holds every record of the name.
func (r *Registrar) Remove(ctx context.Context, rec dnsreg.Record) error {
	c, err := r.check(rec, false)
	if err != nil {
		return err
	}
	for range attempts {
		obj := newObject(r.namespace, c.name)
		err := r.client.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) && !isNoMatch(err) {
			return nil
		}
		if err != nil {
			return r.apiError("read", c.name, c.fqdn, err)
		}
		if !ownedBy(obj, c.owner) {
			return nil
		}
		uid, rv := obj.GetUID(), obj.GetResourceVersion()
		err = r.client.Delete(ctx, obj, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		switch {
		case err == nil, apierrors.IsNotFound(err) && !isNoMatch(err):
			return nil
		case apierrors.IsConflict(err):
			continue
		}
		return r.apiError("delete", c.name, c.fqdn, err)
	}
	return errclass.Errorf(errclass.ClassTransient, reasonWriteFailed,
		"%s: DNSEndpoint %s/%s kept changing while HyperFleet deleted it; retried", c.fqdn, r.namespace, c.name)
}

// List implements dnsreg.Registrar: the DNSEndpoints in the namespace
// whose labels name owner, read back as Records (the name and addresses of
// their A and AAAA endpoints, in the configured zone).
func (r *Registrar) List(ctx context.Context, owner dnsreg.Owner) ([]dnsreg.Record, error) {
	if owner.Install == "" || len(validation.IsValidLabelValue(owner.Install)) > 0 || len(validation.IsValidLabelValue(owner.Claim)) > 0 {
		return nil, fmt.Errorf("%w: List needs an owner install, and ids that are label values (%s)", dnsreg.ErrInvalid, owner)
	}
	sel := client.MatchingLabels{ManagedByLabel: ManagedByValue, InstallLabel: owner.Install}
	if owner.Claim != "" {
		sel[ClaimLabel] = owner.Claim
	}
	list := newList()
	if err := r.client.List(ctx, list, client.InNamespace(r.namespace), sel); err != nil {
		return nil, r.apiError("list", "", "", err)
	}
	var out []dnsreg.Record
	for i := range list.Items {
		o := &list.Items[i]
		m, ok := ownerOf(o)
		if !ok || !owner.Matches(m) {
			continue
		}
		eps := readSpec(o).Endpoints
		name := ""
		var ttl int64
		for _, ep := range eps {
			if ep.RecordType == typeA || ep.RecordType == typeAAAA {
				name, ttl = dnsName(ep.DNSName), ep.RecordTTL
				break
			}
		}
		fqdn := dnsreg.Fqdn(name)
		if name == "" || !dns.IsSubDomain(r.zone, fqdn) || fqdn == r.zone || ObjectName(fqdn) != o.GetName() {
			// Not a name of this zone (another cluster's objects may
			// share the namespace), or not an object Register wrote.
			continue
		}
		addrs := endpointAddrs(eps, name)
		slices.SortFunc(addrs, netip.Addr.Compare)
		out = append(out, dnsreg.Record{Name: fqdn, Addrs: slices.Compact(addrs), TTL: time.Duration(ttl) * time.Second, Owner: m})
	}
	slices.SortFunc(out, func(a, b dnsreg.Record) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// isNoMatch reports whether err says the API server serves no DNSEndpoint
// kind: the RESTMapper found none, or the server answered 404 for the
// resource itself (the CRD was removed after the mapper saw it).
func isNoMatch(err error) bool {
	if meta.IsNoMatchError(err) {
		return true
	}
	var se apierrors.APIStatus
	if errors.As(err, &se) && apierrors.IsNotFound(err) {
		d := se.Status().Details
		// A missing object names its kind and name; a missing resource
		// (no such CRD) names neither.
		return d == nil || d.Name == ""
	}
	return false
}

// apiError classifies an error of the API server: a missing CRD or
// namespace, a refusal (RBAC or admission), an invalid object, else a
// transient failure that is retried. what is the operation, object the
// object's name, and name the DNS name, when there are any.
func (r *Registrar) apiError(what, object, name string, err error) error {
	at := "DNSEndpoints in namespace " + r.namespace
	if object != "" {
		at = "DNSEndpoint " + r.namespace + "/" + object
	}
	if name != "" {
		at = name + ": " + at
	}
	switch {
	case isNoMatch(err):
		return fmt.Errorf("%s: %s: %w", at, what, ErrCRDMissing)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: %s: %w: namespace %s does not exist: create it, or set dns.dnsProvider.externalDNS.namespace to one that does (API server: %w)", at, what, ErrNamespaceMissing, r.namespace, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %s: %w (API server: %w): the operator's ClusterRole needs get, list, create, update and delete on dnsendpoints.externaldns.k8s.io (the chart's has them; docs/networking.md), and no admission policy may refuse them", at, what, ErrForbidden, err)
	case apierrors.IsInvalid(err) || apierrors.IsBadRequest(err):
		return fmt.Errorf("%s: %s: %w: the API server refused the object (%w); is the installed DNSEndpoint CRD external-dns's?", at, what, dnsreg.ErrInvalid, err)
	}
	return errclass.Errorf(errclass.ClassTransient, reasonWriteFailed, "%s: %s: %w", at, what, err)
}
