package dnsreg

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/registry"
)

// TypeRFC2136 is the dns.dnsProvider.type of dynamic UPDATE (RFC 2136)
// signed with TSIG (RFC 8945).
const TypeRFC2136 hfv1.DNSProviderType = "rfc2136"

// The dns.dnsProvider.types served through external-dns: HyperFleet writes
// DNSEndpoint objects and an external-dns the platform team runs publishes
// them. TypeRoute53 and TypeCloudflare are refused on new writes (they
// named services HyperFleet never talks to); a cluster stored with one
// still works: the same objects, labelled with the type, as
// externalDNS.labelValue now does (package externaldns).
const (
	TypeExternalDNS hfv1.DNSProviderType = "external-dns"
	TypeRoute53     hfv1.DNSProviderType = "route53"
	TypeCloudflare  hfv1.DNSProviderType = "cloudflare"
)

// ExternalDNSTypes are the types served through external-dns.
var ExternalDNSTypes = []hfv1.DNSProviderType{TypeExternalDNS, TypeRoute53, TypeCloudflare}

// TTL bounds. A short TTL lets a recycled address move quickly; below
// MinTTL resolvers are asked to come back faster than is useful for a VM
// that lives minutes to hours, above MaxTTL a stale answer for a deleted
// VM would outlive it by far.
const (
	MinTTL     = 5 * time.Second
	MaxTTL     = 24 * time.Hour
	DefaultTTL = 5 * time.Minute
)

// Record is one VM's registration: its name and addresses, and who owns
// them.
type Record struct {
	// Name is the fully qualified host name, such as vm-1.ci.example.com
	// (the trailing dot is optional).
	Name string
	// Addrs are the VM's IPv4 and IPv6 addresses: an A or AAAA record
	// each, and a PTR each in a configured reverse zone.
	Addrs []netip.Addr
	// TTL of every record written; zero means the Registrar's default.
	TTL time.Duration
	// Owner is the claim the records belong to.
	Owner Owner
}

// Registrar writes and removes the DNS records of VMs in one DNS service.
// Implementations are safe for concurrent use; every method is idempotent.
type Registrar interface {
	// Register makes rec.Name resolve to exactly rec.Addrs, with a PTR
	// back for each address in a configured reverse zone. A name already
	// registered by rec.Owner has its addresses replaced; a name in use
	// by anyone else is refused (ErrNameTaken) and left alone. Each
	// zone is changed atomically, but the forward and reverse zones one
	// after the other: after an error some of the records may be in
	// place, and calling Register again (or Remove) converges.
	Register(ctx context.Context, rec Record) error
	// Remove deletes the records Register wrote for rec.Name: the owner
	// marker, the address records it lists and their PTRs (and the PTRs
	// of rec.Addrs), each only where it still belongs to rec.Owner; other
	// records at the names stay. rec.Addrs may be empty. Records already
	// gone are not an error.
	Remove(ctx context.Context, rec Record) error
	// List returns the records registered by owner, read back from the
	// DNS service: one Record per name, with the addresses its marker
	// lists and those of the PTRs pointing to it. A zero owner.Claim matches every
	// claim of owner.Install (a sweep); Records are sorted by name.
	List(ctx context.Context, owner Owner) ([]Record, error)
}

// Describer is implemented by Registrars that hand the records to another
// program, which publishes them later (external-dns): the conditions then
// say what HyperFleet did, not that the name resolves.
type Describer interface {
	// Checked says what a passing Check showed, for the cluster's
	// DNSReady condition; zones lists the zones.
	Checked(zones string) string
	// Registered says where Register put rec, for the claim's
	// DNSRegistered condition.
	Registered(rec Record) string
}

// Config is what every back-end is built from: the zones, the TTL and the
// service's own settings, resolved from a HypervisorCluster's
// spec.dns.dnsProvider and its Secrets.
type Config struct {
	// Zone is the forward zone names are registered in.
	Zone string
	// ReverseZones are the in-addr.arpa and ip6.arpa zones PTRs are
	// written to; an address in none of them gets no PTR.
	ReverseZones []string
	// TTL is the default TTL; zero means DefaultTTL.
	TTL time.Duration
	// Options are the back-end's settings that are not secret, such as a
	// server address, by name.
	Options map[string]string
	// Credentials are the back-end's secrets, by the name
	// dns.dnsProvider.credentials gives them (such as tsigKey).
	Credentials map[string][]byte
	// Kubernetes is the operator's own access to the API server, for the
	// back-ends that hand records to another program as Kubernetes
	// objects (external-dns) rather than talk to a DNS service; the
	// cluster controller sets it for every back-end, and the others
	// ignore it.
	Kubernetes *Kubernetes
}

// Kubernetes is the API server access of the back-ends that write
// Kubernetes objects.
type Kubernetes struct {
	// Client reads and writes through the API server directly, without a
	// cache: a registration must see the objects as they are now, and a
	// cache would need a watch on a kind whose CRD may not be installed.
	Client client.Client
	// Namespace is the operator's own namespace, where objects go when the
	// cluster's spec names no other.
	Namespace string
}

// Factory builds one DNS service's Registrar.
type Factory func(Config) (Registrar, error)

// services are the factories registered with Register, by type.
var services = registry.New[hfv1.DNSProviderType, Factory]("dns provider type")

// Register makes a back-end available under its dns.dnsProvider.type.
// Registering a type twice, or an empty type or nil factory, is a
// programming error and panics.
func Register(t hfv1.DNSProviderType, f Factory) { services.Register(t, f) }

// Registered returns a copy of the factories registered so far.
func Registered() map[hfv1.DNSProviderType]Factory { return services.Registered() }

// New builds the Registrar of type t from factories (usually
// Registered()).
func New(factories map[hfv1.DNSProviderType]Factory, t hfv1.DNSProviderType, cfg Config) (Registrar, error) {
	f, ok := factories[t]
	if !ok {
		return nil, errclass.Errorf(errclass.ClassConfiguration, "DNSProviderUnsupported",
			"dns.dnsProvider.type %s is not supported by this operator", t)
	}
	r, err := f(cfg)
	if err != nil {
		return nil, fmt.Errorf("dns provider %s: %w", t, err)
	}
	return r, nil
}

// Errors callers test with errors.Is; each carries its class.
var (
	// ErrNameTaken: the name (or reverse name) holds records HyperFleet
	// did not write for this owner.
	ErrNameTaken = errclass.NewSentinel("name is in use by records of another owner", errclass.ClassConfiguration, "DNSNameTaken")
	// ErrOutOfZone: the name is not inside the configured zone.
	ErrOutOfZone = errclass.NewSentinel("name is outside the configured zone", errclass.ClassConfiguration, "DNSNameOutOfZone")
	// ErrRefused: the server refused the update or its signature; the
	// message says what to check.
	ErrRefused = errclass.NewSentinel("DNS server refused the request", errclass.ClassConfiguration, "DNSUpdateRefused")
	// ErrInvalid: a Record or Config is malformed.
	ErrInvalid = errclass.NewSentinel("invalid DNS registration", errclass.ClassConfiguration, "DNSInvalid")
)

// CheckTTL returns ttl, or def when ttl is zero, as whole seconds within
// [MinTTL, MaxTTL].
func CheckTTL(ttl, def time.Duration) (uint32, error) {
	if ttl == 0 {
		ttl = def
	}
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Second != 0 {
		return 0, fmt.Errorf("%w: TTL %s is not whole seconds between %s and %s", ErrInvalid, ttl, MinTTL, MaxTTL)
	}
	return uint32(ttl / time.Second), nil
}

// CheckZones checks a back-end's forward zone and reverse zones (each
// under in-addr.arpa or ip6.arpa) and returns them fully qualified,
// lower-cased: what every back-end is built from (Config.Zone,
// Config.ReverseZones).
func CheckZones(zone string, reverse []string) (string, []string, error) {
	check := func(z string) (string, error) {
		if err := CheckName(z); err != nil {
			return "", fmt.Errorf("zone: %w", err)
		}
		return Fqdn(z), nil
	}
	fwd, err := check(zone)
	if err != nil {
		return "", nil, err
	}
	var out []string
	for _, z := range reverse {
		fz, err := check(z)
		if err != nil {
			return "", nil, err
		}
		if !under(fz, "in-addr.arpa.") && !under(fz, "ip6.arpa.") {
			return "", nil, fmt.Errorf("%w: reverse zone %s is under neither in-addr.arpa nor ip6.arpa", ErrInvalid, z)
		}
		out = append(out, fz)
	}
	return fwd, out, nil
}

// CheckRecord checks a record against its back-end's forward zone (fully
// qualified, as CheckZones returns it) and default TTL: its name is a
// domain name below the zone, its TTL valid, its addresses valid. It
// returns the name fully qualified, the TTL in seconds and the addresses
// unmapped, without zones, de-duplicated and sorted; needAddrs refuses a
// record without any (Register's; Remove's may have none).
func CheckRecord(rec Record, zone string, defTTL time.Duration, needAddrs bool) (name string, ttl uint32, addrs []netip.Addr, err error) {
	name = Fqdn(rec.Name)
	if err := CheckName(rec.Name); err != nil {
		return name, 0, nil, fmt.Errorf("record name: %w", err)
	}
	if name == zone || !under(name, zone) {
		return name, 0, nil, fmt.Errorf("%w: %s is not a name below zone %s", ErrOutOfZone, name, zone)
	}
	if ttl, err = CheckTTL(rec.TTL, defTTL); err != nil {
		return name, 0, nil, err
	}
	for _, a := range rec.Addrs {
		if !a.IsValid() {
			return name, 0, nil, fmt.Errorf("%w: record %s has an invalid address", ErrInvalid, name)
		}
		a = a.Unmap().WithZone("")
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	if needAddrs && len(addrs) == 0 {
		return name, 0, nil, fmt.Errorf("%w: record %s has no address", ErrInvalid, name)
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return name, ttl, addrs, nil
}

// under reports whether the fully qualified name is parent or below it.
func under(name, parent string) bool {
	return name == parent || strings.HasSuffix(name, "."+parent)
}

// Fqdn returns name lower-cased with its trailing dot.
func Fqdn(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

// CheckName checks that name (trailing dot optional) is a domain name of
// letters, digits, '-' and '_' labels of 1 to 63 characters, at most 253
// in all: the names of hosts, zones and keys. DNS itself allows any byte in
// a label; HyperFleet writes and accepts only these.
func CheckName(name string) error {
	n := strings.TrimSuffix(name, ".")
	if n == "" || len(n) > 253 {
		return fmt.Errorf("%w: %q is not a domain name of 1 to 253 characters", ErrInvalid, name)
	}
	for label := range strings.SplitSeq(n, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("%w: %q has an empty label or one over 63 characters", ErrInvalid, name)
		}
		for _, c := range label {
			if !isLabelChar(c) {
				return fmt.Errorf("%w: %q may hold only letters, digits, '-', '_' and dots", ErrInvalid, name)
			}
		}
	}
	return nil
}

func isLabelChar(c rune) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return c == '-' || c == '_'
}
