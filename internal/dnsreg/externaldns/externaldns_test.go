package externaldns_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/externaldns"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsregtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/extdns"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

const (
	zone   = "ci.example.test."
	v4Zone = "2.0.192.in-addr.arpa."
	v6Zone = "8.b.d.0.1.0.0.2.ip6.arpa."
)

// newClient is an uncached client of env, as the operator gives the
// back-end (dnsreg.Kubernetes), optionally acting as another user.
func newClient(t *testing.T, env *testenv.Environment, impersonate string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	if impersonate != "" {
		cfg.Impersonate = rest.ImpersonationConfig{UserName: impersonate}
	}
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newRegistrar(t *testing.T, c client.Client, ns string, provider hfv1.DNSProviderType) *externaldns.Registrar {
	t.Helper()
	r, err := externaldns.New(externaldns.Config{Client: c, Namespace: ns, Provider: provider, Zone: zone, ReverseZones: []string{v4Zone, v6Zone}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func createNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
}

// wantErr checks err wraps sentinel, is a Configuration error with
// sentinel's reason, and says each of says.
func wantErr(t *testing.T, what string, err error, sentinel *errclass.Sentinel, says ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) || errclass.Classify(err) != errclass.ClassConfiguration || errclass.ReasonOf(err) != sentinel.Reason() {
		t.Fatalf("%s: %v (reason %q), want %s, a Configuration error", what, err, errclass.ReasonOf(err), sentinel.Reason())
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%s: %q does not say %q", what, err, s)
		}
	}
}

// TestBackend runs against a real API server, first without external-dns's
// DNSEndpoint CRD and then with it installed, in this order.
func TestBackend(t *testing.T) {
	env, err := testenv.StartWithoutCRDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := context.Background()
	admin := newClient(t, env, "")
	createNamespace(t, admin, "hyperfleet-system")
	r := newRegistrar(t, admin, "hyperfleet-system", dnsreg.TypeExternalDNS)
	rec := dnsreg.Record{Name: "vm-1." + zone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.101")}, Owner: dnsreg.Owner{Claim: "claim-1", Install: "op-1"}}

	// Without the CRD every method fails with the reason and the fix, a
	// configuration error (the cluster's DNSReady says so, and claims go on
	// without records).
	t.Run("CRDMissing", func(t *testing.T) {
		fix := "install external-dns's CRD"
		wantErr(t, "Check", r.Check(ctx), externaldns.ErrCRDMissing, fix, "dnsendpoints.externaldns.k8s.io")
		wantErr(t, "Register", r.Register(ctx, rec), externaldns.ErrCRDMissing, fix, "vm-1."+zone)
		wantErr(t, "Remove", r.Remove(ctx, rec), externaldns.ErrCRDMissing, fix)
		_, err := r.List(ctx, dnsreg.Owner{Install: "op-1"})
		wantErr(t, "List", err, externaldns.ErrCRDMissing, fix)
	})

	extdns.InstallCRD(t, env.Config)

	// The registrar built before the CRD was installed finds it: no
	// restart, no rebuild.
	t.Run("CRDInstalledLater", func(t *testing.T) {
		if err := r.Check(ctx); err != nil {
			t.Fatalf("Check after the CRD was installed: %v", err)
		}
		if err := r.Register(ctx, rec); err != nil {
			t.Fatal(err)
		}
		if err := r.Remove(ctx, rec); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Contract", func(t *testing.T) {
		const ns = "hf-contract"
		createNamespace(t, admin, ns)
		dnsregtest.Run(t, dnsregtest.Harness{
			Zone:    zone,
			New:     func(t *testing.T) dnsreg.Registrar { return newRegistrar(t, admin, ns, dnsreg.TypeExternalDNS) },
			Lookup:  func(t *testing.T, name string, qtype uint16) []dns.RR { return lookup(t, admin, ns, name, qtype) },
			Add:     func(t *testing.T, rr string) { add(t, admin, ns, rr) },
			Version: func(t *testing.T) string { return versions(t, admin, ns) },
		})
	})

	t.Run("TheObject", func(t *testing.T) { testObject(t, admin) })
	t.Run("NamespaceMissing", func(t *testing.T) {
		r := newRegistrar(t, admin, "no-such-namespace", dnsreg.TypeExternalDNS)
		wantErr(t, "Check", r.Check(ctx), externaldns.ErrNamespaceMissing, "no-such-namespace", "dns.dnsProvider.externalDNS.namespace")
		wantErr(t, "Register", r.Register(ctx, rec), externaldns.ErrNamespaceMissing, "no-such-namespace")
	})
	t.Run("RBAC", func(t *testing.T) { testRBAC(t, env, admin) })
	t.Run("Factory", func(t *testing.T) { testFactory(t, admin) })
}

// testObject checks what one registration writes: one DNSEndpoint named
// after the name, labelled with its owner and provider type, holding A,
// AAAA and PTR endpoints in external-dns's form (no trailing dots), and
// that names are taken across namespaces.
func testObject(t *testing.T, c client.Client) {
	ctx := context.Background()
	const ns = "hf-object"
	createNamespace(t, c, ns)
	r := newRegistrar(t, c, ns, dnsreg.TypeRoute53)
	rec := dnsreg.Record{Name: "VM-Obj." + zone, TTL: time.Minute, Owner: dnsreg.Owner{Claim: "6f1c9a52-0d3e-4b8e-9f5e-2a7d1c3b4e5f", Install: "op-1"},
		Addrs: []netip.Addr{netip.MustParseAddr("2001:db8::110"), netip.MustParseAddr("192.0.2.110"), netip.MustParseAddr("192.0.2.111"), netip.MustParseAddr("198.51.100.1")}}
	if err := r.Register(ctx, rec); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind))
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "hf-vm-obj.ci.example.test"}, u); err != nil {
		t.Fatalf("the DNSEndpoint named after the name: %v", err)
	}
	wantLabels := map[string]string{
		"hyperfleet.io/managed-by": "hyperfleet", "hyperfleet.io/dns-install": "op-1",
		"hyperfleet.io/dns-claim": "6f1c9a52-0d3e-4b8e-9f5e-2a7d1c3b4e5f", "hyperfleet.io/dns-provider": "route53",
	}
	if got := u.GetLabels(); !mapsEqual(got, wantLabels) {
		t.Errorf("labels %v, want %v", got, wantLabels)
	}
	eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
	got, _ := yaml.Marshal(eps)
	want := `- dnsName: vm-obj.ci.example.test
  recordTTL: 60
  recordType: A
  targets:
  - 192.0.2.110
  - 192.0.2.111
  - 198.51.100.1
- dnsName: vm-obj.ci.example.test
  recordTTL: 60
  recordType: AAAA
  targets:
  - 2001:db8::110
- dnsName: 110.2.0.192.in-addr.arpa
  recordTTL: 60
  recordType: PTR
  targets:
  - vm-obj.ci.example.test
- dnsName: 111.2.0.192.in-addr.arpa
  recordTTL: 60
  recordType: PTR
  targets:
  - vm-obj.ci.example.test
- dnsName: 0.1.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.8.b.d.0.1.0.0.2.ip6.arpa
  recordTTL: 60
  recordType: PTR
  targets:
  - vm-obj.ci.example.test
`
	if string(got) != want {
		t.Errorf("spec.endpoints:\n%s\nwant (198.51.100.1 is in no reverse zone: no PTR):\n%s", got, want)
	}
	msg := r.Registered(rec)
	if !strings.Contains(msg, "DNSEndpoint hf-object/hf-vm-obj.ci.example.test") || !strings.Contains(msg, "external-dns") {
		t.Errorf("Registered = %q", msg)
	}

	// The same name from another claim, or from another namespace (an
	// external-dns watching every namespace would publish both), is taken.
	const other = "hf-object-2"
	createNamespace(t, c, other)
	r2 := newRegistrar(t, c, other, dnsreg.TypeExternalDNS)
	mine := dnsreg.Record{Name: rec.Name, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.120")}, Owner: dnsreg.Owner{Claim: "claim-2", Install: "op-1"}}
	if err := r2.Register(ctx, mine); !errors.Is(err, dnsreg.ErrNameTaken) || !strings.Contains(err.Error(), "hf-object/hf-vm-obj.ci.example.test") {
		t.Fatalf("Register of a name held in another namespace: %v, want ErrNameTaken naming the object", err)
	}
	// An object of that name that HyperFleet did not write is not taken
	// over, nor removed.
	foreign := &unstructured.Unstructured{}
	foreign.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind))
	foreign.SetNamespace(ns)
	foreign.SetName(externaldns.ObjectName("vm-foreign." + zone))
	if err := c.Create(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	frec := dnsreg.Record{Name: "vm-foreign." + zone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.130")}, Owner: rec.Owner}
	if err := r.Register(ctx, frec); !errors.Is(err, dnsreg.ErrNameTaken) {
		t.Fatalf("Register over a foreign object of the name: %v, want ErrNameTaken", err)
	}
	if err := r.Remove(ctx, frec); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(foreign), foreign); err != nil {
		t.Fatalf("the foreign object went: %v", err)
	}

	// A name that is no object name (an underscore) gets a hashed one.
	under := dnsreg.Record{Name: "vm_1." + zone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.140")}, Owner: dnsreg.Owner{Claim: "claim-3", Install: "op-1"}}
	if err := r.Register(ctx, under); err != nil {
		t.Fatal(err)
	}
	if n := externaldns.ObjectName(under.Name); !strings.HasPrefix(n, "hf-") || len(n) != 35 {
		t.Errorf("ObjectName(%s) = %s, want hf- and 32 hex digits", under.Name, n)
	}
	recs, err := r.List(ctx, dnsreg.Owner{Install: "op-1"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range recs {
		names = append(names, l.Name)
	}
	if want := []string{"vm-obj." + zone, "vm_1." + zone}; !slices.Equal(names, want) {
		t.Fatalf("List = %v, want %v", names, want)
	}
	for _, rm := range []dnsreg.Record{rec, under} {
		if err := r.Remove(ctx, rm); err != nil {
			t.Fatal(err)
		}
	}
	if recs, err := r.List(ctx, dnsreg.Owner{Install: "op-1"}); err != nil || len(recs) != 0 {
		t.Fatalf("List after Remove = %v, %v", recs, err)
	}
}

// testRBAC runs the back-end as a ServiceAccount that holds the operator's
// generated ClusterRole (config/rbac/role.yaml, which the chart ships):
// the check passes and every method works. Without it, the check says
// which permission is missing.
func testRBAC(t *testing.T, env *testenv.Environment, admin client.Client) {
	ctx := context.Background()
	const ns = "hf-rbac"
	createNamespace(t, admin, ns)
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	role := &rbacv1.ClusterRole{}
	if err := yaml.Unmarshal(raw, role); err != nil {
		t.Fatal(err)
	}
	role.Name = "hf-rbac-test-manager"
	if err := admin.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	const user = "system:serviceaccount:hyperfleet-system:hyperfleet"
	nobody := newRegistrar(t, newClient(t, env, user), ns, dnsreg.TypeExternalDNS)
	wantErr(t, "Check without the role", nobody.Check(ctx), externaldns.ErrForbidden, "dnsendpoints.externaldns.k8s.io", "ClusterRole")

	if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "hf-rbac-test-manager"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}); err != nil {
		t.Fatal(err)
	}
	r := newRegistrar(t, newClient(t, env, user), ns, dnsreg.TypeExternalDNS)
	var err2 error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		// The authorizer sees a new binding within moments.
		if err2 = r.Check(ctx); err2 == nil {
			break
		}
	}
	if err2 != nil {
		t.Fatalf("Check with the operator's ClusterRole: %v", err2)
	}
	rec := dnsreg.Record{Name: "vm-rbac." + zone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.150")}, Owner: dnsreg.Owner{Claim: "claim-rbac", Install: "op-1"}}
	for _, step := range []func() error{
		func() error { return r.Register(ctx, rec) },
		func() error { rec.TTL = time.Minute; return r.Register(ctx, rec) },
		func() error {
			got, err := r.List(ctx, dnsreg.Owner{Install: "op-1"})
			if err == nil && len(got) != 1 {
				err = fmt.Errorf("List = %v", got)
			}
			return err
		},
		func() error { return r.Remove(ctx, rec) },
	} {
		if err := step(); err != nil {
			t.Fatalf("as the operator's ServiceAccount: %v", err)
		}
	}
}

func testFactory(t *testing.T, c client.Client) {
	kube := &dnsreg.Kubernetes{Client: c, Namespace: "hyperfleet-system"}
	f := externaldns.Factory(dnsreg.TypeCloudflare)
	reg, err := f(dnsreg.Config{Zone: zone, Kubernetes: kube})
	if err != nil {
		t.Fatal(err)
	}
	if ns := reg.(*externaldns.Registrar).Namespace(); ns != "hyperfleet-system" {
		t.Errorf("default namespace %q, want the operator's", ns)
	}
	reg, err = f(dnsreg.Config{Zone: zone, Kubernetes: kube, Options: map[string]string{externaldns.OptionNamespace: "dns"}})
	if err != nil || reg.(*externaldns.Registrar).Namespace() != "dns" {
		t.Errorf("namespace option: %v, %v", reg, err)
	}
	// The label external-dns filters on: the type stored (a cluster
	// written before route53 and cloudflare were refused), unless
	// externalDNS.labelValue names one.
	if d := reg.(dnsreg.Describer).Checked(zone); !strings.Contains(d, externaldns.ProviderLabel+"=cloudflare") {
		t.Errorf("without labelValue: %s", d)
	}
	reg, err = externaldns.Factory(dnsreg.TypeExternalDNS)(dnsreg.Config{Zone: zone, Kubernetes: kube, Options: map[string]string{externaldns.OptionLabelValue: "route53"}})
	if err != nil || !strings.Contains(reg.(dnsreg.Describer).Checked(zone), externaldns.ProviderLabel+"=route53") {
		t.Errorf("labelValue option: %v, %v", reg, err)
	}
	for what, cfg := range map[string]dnsreg.Config{
		"no Kubernetes client": {Zone: zone},
		"credentials":          {Zone: zone, Kubernetes: kube, Credentials: map[string][]byte{"tsigKey": nil}},
		"a bad namespace":      {Zone: zone, Kubernetes: kube, Options: map[string]string{externaldns.OptionNamespace: "Not_A_Namespace"}},
		"a bad reverse zone":   {Zone: zone, Kubernetes: kube, ReverseZones: []string{"example.com"}},
	} {
		if _, err := f(cfg); !errors.Is(err, dnsreg.ErrInvalid) {
			t.Errorf("Factory with %s: %v, want ErrInvalid", what, err)
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// lookup reads the records the DNSEndpoints in ns ask external-dns to
// publish at name, of type qtype: each endpoint at the name, of the type,
// a record per target (the union of every object's, as external-dns
// publishes records that do not conflict). The end-to-end test
// (internal/controller, TestExternalDNSRegistration) checks that a real
// external-dns publishes them.
func lookup(t *testing.T, c client.Client, ns, name string, qtype uint16) []dns.RR {
	t.Helper()
	typ := dns.TypeToString[qtype]
	var out []dns.RR
	for _, o := range listObjects(t, c, ns) {
		eps, _, _ := unstructured.NestedSlice(o.Object, "spec", "endpoints")
		for _, e := range eps {
			ep, _ := e.(map[string]any)
			if !strings.EqualFold(dns.Fqdn(fmt.Sprint(ep["dnsName"])), dns.Fqdn(name)) || ep["recordType"] != typ {
				continue
			}
			ttl, ok := ep["recordTTL"].(int64)
			if !ok || ttl == 0 {
				ttl = 300
			}
			targets, _, _ := unstructured.NestedStringSlice(ep, "targets")
			for _, target := range targets {
				switch qtype {
				case dns.TypeTXT:
					target = fmt.Sprintf("%q", target)
				case dns.TypePTR:
					target = dns.Fqdn(target)
				}
				rr, err := dns.NewRR(fmt.Sprintf("%s %d IN %s %s", dns.Fqdn(name), ttl, typ, target))
				if err != nil {
					t.Fatalf("DNSEndpoint %s: %v", o.GetName(), err)
				}
				out = append(out, rr)
			}
		}
	}
	return out
}

var added atomic.Int64

// add writes a record as another team would: a DNSEndpoint of its own,
// without HyperFleet's labels.
func add(t *testing.T, c client.Client, ns, text string) {
	t.Helper()
	rr, err := dns.NewRR(text)
	if err != nil {
		t.Fatal(err)
	}
	h := rr.Header()
	target := strings.TrimPrefix(rr.String(), h.String())
	switch rr := rr.(type) {
	case *dns.TXT:
		target = strings.Join(rr.Txt, "")
	case *dns.PTR:
		target = strings.TrimSuffix(rr.Ptr, ".")
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"spec": map[string]any{"endpoints": []any{map[string]any{
			"dnsName": strings.TrimSuffix(h.Name, "."), "recordType": dns.TypeToString[h.Rrtype],
			"recordTTL": int64(h.Ttl), "targets": []any{target},
		}}},
	}}
	u.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind))
	u.SetNamespace(ns)
	u.SetName(fmt.Sprintf("manual-%d", added.Add(1)))
	if err := c.Create(context.Background(), u); err != nil {
		t.Fatalf("add %s: %v", text, err)
	}
}

// versions are the names and resource versions of the DNSEndpoints in ns:
// they change whenever one is written.
func versions(t *testing.T, c client.Client, ns string) string {
	var out []string
	for _, o := range listObjects(t, c, ns) {
		out = append(out, o.GetName()+"@"+o.GetResourceVersion())
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func listObjects(t *testing.T, c client.Client, ns string) []unstructured.Unstructured {
	t.Helper()
	l := &unstructured.UnstructuredList{}
	l.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind + "List"))
	if err := c.List(context.Background(), l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return l.Items
}
