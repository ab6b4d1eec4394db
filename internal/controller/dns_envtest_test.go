package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/externaldns"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/extdns"
)

// The DNS set-up of the registration tests: the cluster's domain is the
// forward zone, and its static pools (one IPv4, one IPv6: the template is
// dual-stack) are in the reverse zones' prefixes.
const (
	dnsTestZone     = "ci.example.test"
	dnsTestReverse  = "2.0.192.in-addr.arpa"
	dnsTestReverse6 = "8.b.d.0.1.0.0.2.ip6.arpa"
)

// startDNS runs a BIND holding the test zones, updatable with
// dnsserver.UpdateKey.
func startDNS(t *testing.T) *dnsserver.Server {
	t.Helper()
	return dnsserver.StartBIND(t, dnsserver.Options{Zones: []string{dnsTestZone, dnsTestReverse, dnsTestReverse6}})
}

// registeringCluster makes the fixture's cluster register its VMs on the
// DNS server at addr, with the TSIG key in Secret secretName (key
// tsig.key) of secretNamespace.
func registeringCluster(addr, secretName string) func(*hfv1.HypervisorCluster) {
	return func(c *hfv1.HypervisorCluster) {
		c.Spec.DNS = &hfv1.ClusterDNSSettings{
			DNSSettings: hfv1.DNSSettings{Domain: dnsTestZone},
			RegisterVMs: true,
			DNSProvider: &hfv1.DNSProvider{
				Type:         dnsreg.TypeRFC2136,
				ReverseZones: []string{dnsTestReverse, dnsTestReverse6},
				TTLSeconds:   60,
				RFC2136:      &hfv1.RFC2136Settings{Server: addr},
				Credentials: []hfv1.NamedSecretKeySelector{{Name: rfc2136.CredentialKey,
					SecretKeyRef: hfv1.SecretKeySelector{Namespace: secretNamespace, Name: secretName, Key: "tsig.key"}}},
			},
		}
	}
}

// dnsFixture starts the operator's world for a registration test: a
// simulator, the operator (sweeping every 200 ms with a one-second grace
// period), a cluster registering on addr, its TSIG Secret, and a
// dual-stack template with the static pools 192.0.2.0/29 and
// 2001:db8::/64.
func dnsFixture(t *testing.T, addr string) (*fixture, *hfv1.HypervisorMachineTemplate, *simulator) {
	t.Helper()
	secretName := "tsig-" + strconv.Itoa(fixtureSeq+1)
	f, tmpl, sim := dnsFixtureOf(t, registeringCluster(addr, secretName))
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: secretName},
		StringData: map[string]string{"tsig.key": dnsserver.UpdateKey.Clause()},
	})
	return f, tmpl, sim
}

// dnsFixtureOf is dnsFixture with the cluster's DNS settings made by
// mutate, and no Secret.
func dnsFixtureOf(t *testing.T, mutate func(*hfv1.HypervisorCluster)) (*fixture, *hfv1.HypervisorMachineTemplate, *simulator) {
	t.Helper()
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{sweepInterval: 200 * time.Millisecond, orphanGrace: time.Second})
	f := newFixture(t, sim, mutate)
	pool := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool-" + f.namespace},
		Spec:       hfv1.IPPoolSpec{Addresses: []string{"192.0.2.0/29"}, Prefix: 29, Gateways: []string{"192.0.2.1"}},
	}
	pool6 := &hfv1.IPPool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool6-" + f.namespace},
		Spec:       hfv1.IPPoolSpec{Addresses: []string{"2001:db8::/64"}, Prefix: 64, Gateways: []string{"2001:db8::1"}},
	}
	for _, p := range []*hfv1.IPPool{pool, pool6} {
		f.create(p)
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p) })
	}
	return f, f.staticTemplate(t, pool, pool6), sim
}

func newClaimOf(f *fixture, tmpl *hfv1.HypervisorMachineTemplate, name string) *hfv1.MachineClaim {
	c := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
	}
	f.create(c)
	return c
}

// waitClaimCondition waits until the claim's condition typ has status and
// reason.
func waitClaimCondition(t *testing.T, c *hfv1.MachineClaim, typ hfv1.ConditionType, status metav1.ConditionStatus, reason hfv1.ConditionReason) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	eventually(t, 60*time.Second, fmt.Sprintf("claim %s %s=%s/%s", c.Name, typ, status, reason), func() error {
		got, err := getClaim(t, c)
		if err != nil {
			return err
		}
		cond = hfv1.FindCondition(got.Status.Conditions, typ)
		if cond == nil || cond.Status != status || cond.Reason != string(reason) {
			return fmt.Errorf("%s = %+v", typ, cond)
		}
		return nil
	})
	return cond
}

// addrsOf are the A and AAAA records' addresses of rrs, sorted.
func addrsOf(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		switch a := rr.(type) {
		case *dns.A:
			out = append(out, a.A.String())
		case *dns.AAAA:
			out = append(out, a.AAAA.String())
		}
	}
	slices.Sort(out)
	return out
}

// ptrsOf are the PTR records' targets of rrs.
func ptrsOf(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		if p, ok := rr.(*dns.PTR); ok {
			out = append(out, p.Ptr)
		}
	}
	return out
}

// TestDNSRegistration: on a cluster with dns.registerVMs and an rfc2136
// provider (a real BIND on loopback), the cluster reports DNSReady; a
// dual-stack claim with a static address from an IPv4 and from an IPv6
// IPPool records both in its status and gets an A and an AAAA record under
// its FQDN and a PTR back for each, in the in-addr.arpa and the ip6.arpa
// zone (read with real queries), and its DNSRegistered condition says so;
// the records go when the claim is deleted; and a name the install
// registered for a claim that no longer exists is swept.
func TestDNSRegistration(t *testing.T) {
	bind := startDNS(t)
	f, static, _ := dnsFixture(t, bind.Addr)
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionTrue, string(hfv1.ReadyReason))

	claim := newClaimOf(f, static, "dns-vm")
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	cond := waitClaimCondition(t, claim, hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionTrue, hfv1.ReadyReason)
	got, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, why := machineclaim.DNSRecord(got, testSigner.OperatorID(), nil)
	if why != "" {
		t.Fatalf("claim has nothing to register: %s", why)
	}
	alloc := got.Status.Network.IPAllocations
	if len(alloc) != 2 || alloc[0].Address != "192.0.2.2/29" || alloc[0].Gateway != "192.0.2.1" || alloc[1].Address != "2001:db8::2/64" || alloc[1].Gateway != "2001:db8::1" {
		t.Fatalf("allocations %+v, want 192.0.2.2/29 via 192.0.2.1 and 2001:db8::2/64 via 2001:db8::1", alloc)
	}
	static4 := netip.MustParsePrefix(alloc[0].Address).Addr()
	static6 := netip.MustParsePrefix(alloc[1].Address).Addr()
	if !slices.Equal(rec.Addrs, []netip.Addr{static4, static6}) {
		t.Fatalf("the VM's addresses %v are not its static addresses %s and %s", rec.Addrs, static4, static6)
	}
	fqdn := "dns-vm." + dnsTestZone + "."
	if rec.Name != "dns-vm."+dnsTestZone || !strings.Contains(cond.Message, fqdn) {
		t.Fatalf("record name %q, condition %q", rec.Name, cond.Message)
	}
	var want []string
	for _, a := range rec.Addrs {
		want = append(want, a.String())
	}
	slices.Sort(want)
	if got := addrsOf(append(bind.Lookup(t, fqdn, dns.TypeA), bind.Lookup(t, fqdn, dns.TypeAAAA)...)); !slices.Equal(got, want) {
		t.Fatalf("A and AAAA %s = %v, want %v", fqdn, got, want)
	}
	rev, _ := dns.ReverseAddr(static4.String())
	rev6, _ := dns.ReverseAddr(static6.String())
	for _, r := range []string{rev, rev6} {
		if got := ptrsOf(bind.Lookup(t, r, dns.TypePTR)); !slices.Equal(got, []string{fqdn}) {
			t.Fatalf("PTR %s = %v, want %s", r, got, fqdn)
		}
	}

	// A name registered by this install for a claim that is gone (as if
	// the operator had been down when it was deleted) is swept; the live
	// claim's records stay.
	reg, err := rfc2136.New(rfc2136.Config{
		Server: bind.Addr, Timeout: 2 * time.Second,
		Key:  rfc2136.TSIGKey{Name: dnsserver.UpdateKey.Name, Secret: dnsserver.UpdateKey.Secret},
		Zone: dnsTestZone, ReverseZones: []string{dnsTestReverse, dnsTestReverse6},
	})
	if err != nil {
		t.Fatal(err)
	}
	ghost := dnsreg.Record{Name: "ghost." + dnsTestZone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.99")},
		Owner: dnsreg.Owner{Claim: "0d5c1f3e-gone", Install: testSigner.OperatorID()}}
	if err := reg.Register(context.Background(), ghost); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the vanished claim's records swept", func() error {
		if a := bind.Lookup(t, "ghost."+dnsTestZone, dns.TypeA); len(a) != 0 {
			return fmt.Errorf("ghost A %v", a)
		}
		if p := bind.Lookup(t, "99.2.0.192.in-addr.arpa.", dns.TypePTR); len(p) != 0 {
			return fmt.Errorf("ghost PTR %v", p)
		}
		return nil
	})
	if got := addrsOf(append(bind.Lookup(t, fqdn, dns.TypeA), bind.Lookup(t, fqdn, dns.TypeAAAA)...)); !slices.Equal(got, want) {
		t.Fatalf("after the sweep, A and AAAA %s = %v, want %v: the sweep removed a live claim's records", fqdn, got, want)
	}

	// The claim's deletion removes its records.
	if err := env.Client.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	waitGone(t, claim, 60*time.Second)
	for _, typ := range []uint16{dns.TypeA, dns.TypeAAAA} {
		if a := bind.Lookup(t, fqdn, typ); len(a) != 0 {
			t.Fatalf("%s %s = %v after the claim went", dns.TypeToString[typ], fqdn, a)
		}
	}
	for _, r := range []string{rev, rev6} {
		if p := bind.Lookup(t, r, dns.TypePTR); len(p) != 0 {
			t.Fatalf("PTR %s = %v after the claim went", r, p)
		}
	}
	if txt := bind.Lookup(t, fqdn, dns.TypeTXT); len(txt) != 0 {
		t.Fatalf("TXT %s = %v after the claim went", fqdn, txt)
	}
}

// TestDNSServerUnreachable: a cluster whose DNS server does not answer
// reports DNSReady False (DNSServerUnreachable) and stays Ready; its
// claims' VMs are created (the claim says why it is not registered) and
// deleted all the same, promptly.
func TestDNSServerUnreachable(t *testing.T) {
	down := net.JoinHostPort("127.0.0.1", strconv.Itoa(dnsserver.FreePort(t)))
	f, static, sim := dnsFixture(t, down)
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionFalse, string(hfv1.DNSServerUnreachableReason))
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)

	claim := newClaimOf(f, static, "no-dns")
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	waitClaimCondition(t, claim, hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.DNSServerUnreachableReason)
	got, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	vm := int(got.Status.VMRef.VMID)
	if vm == 0 {
		t.Fatalf("claim records no VM id: %+v", got.Status.VMRef)
	}

	start := time.Now()
	if err := env.Client.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	waitGone(t, claim, 60*time.Second)
	t.Logf("claim deleted in %s", time.Since(start).Round(time.Millisecond))
	for _, v := range sim.VMs() {
		if v.VMID == vm {
			t.Fatalf("VM %d is still there after its claim went", vm)
		}
	}
	var c hfv1.HypervisorCluster
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), &c); err != nil {
		t.Fatal(err)
	}
	if !hfv1.IsConditionTrue(c.Status.Conditions, hfv1.ReadyCondition) {
		t.Fatalf("cluster Ready = %+v", hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition))
	}
}

// TestExternalDNSRegistration: on a cluster with dns.registerVMs and a
// dnsProvider of type external-dns, the cluster reports DNSReady (the
// DNSEndpoint CRD is installed, the operator may write them in the
// cluster's namespace); a dual-stack claim with static addresses gets a DNSEndpoint
// there, labelled with its owner, and a real external-dns (built from its
// Go module, rfc2136 provider, TXT registry, watching that namespace and
// label) publishes it to a real BIND, where real queries find the A and
// AAAA records and the PTR; a DNSEndpoint of the install whose claim is gone is swept;
// and the claim's deletion deletes its DNSEndpoint, after which
// external-dns removes the records.
func TestExternalDNSRegistration(t *testing.T) {
	bind := startDNS(t)
	ctx := context.Background()
	ns := fmt.Sprintf("dns-endpoints-%d", fixtureSeq+1)
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	// Its output is logged when the test fails.
	extdns.Start(t, extdns.Options{
		KubeConfig: env.KubeConfig(), Namespace: ns, LabelFilter: externaldns.ProviderLabel + "=" + string(dnsreg.TypeExternalDNS),
		Server: bind.Addr, Zones: []string{dnsTestZone, dnsTestReverse},
		KeyName: dnsserver.UpdateKey.Name, KeySecret: dnsserver.UpdateKey.Secret,
	})
	f, static, _ := dnsFixtureOf(t, func(c *hfv1.HypervisorCluster) {
		c.Spec.DNS = &hfv1.ClusterDNSSettings{
			DNSSettings: hfv1.DNSSettings{Domain: dnsTestZone},
			RegisterVMs: true,
			DNSProvider: &hfv1.DNSProvider{
				Type:         dnsreg.TypeExternalDNS,
				ReverseZones: []string{dnsTestReverse},
				TTLSeconds:   60,
				ExternalDNS:  &hfv1.ExternalDNSSettings{Namespace: ns},
			},
		}
	})
	ready := waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionTrue, string(hfv1.ReadyReason))
	if !strings.Contains(ready.Message, "namespace "+ns) {
		t.Errorf("DNSReady message %q does not name the namespace", ready.Message)
	}

	claim := newClaimOf(f, static, "edns-vm")
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	cond := waitClaimCondition(t, claim, hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionTrue, hfv1.ReadyReason)
	got, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, why := machineclaim.DNSRecord(got, testSigner.OperatorID(), nil)
	if why != "" {
		t.Fatalf("claim has nothing to register: %s", why)
	}
	fqdn := "edns-vm." + dnsTestZone + "."
	object := externaldns.ObjectName(fqdn)
	if !strings.Contains(cond.Message, "DNSEndpoint "+ns+"/"+object) || !strings.Contains(cond.Message, fqdn) {
		t.Fatalf("DNSRegistered message %q does not name the DNSEndpoint and the name", cond.Message)
	}
	endpoint := &unstructured.Unstructured{}
	endpoint.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind))
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: object}, endpoint); err != nil {
		t.Fatalf("the claim's DNSEndpoint: %v", err)
	}
	if l := endpoint.GetLabels(); l[externaldns.ClaimLabel] != string(got.UID) || l[externaldns.InstallLabel] != testSigner.OperatorID() {
		t.Fatalf("the DNSEndpoint's labels %v do not name the claim and the install", l)
	}
	// The fixture is dual stack: an A and an AAAA record.
	var want, want6 []string
	for _, a := range rec.Addrs {
		if a.Is4() {
			want = append(want, a.String())
		} else {
			want6 = append(want6, a.String())
		}
	}
	slices.Sort(want)
	slices.Sort(want6)
	if len(want) != 1 || len(want6) != 1 {
		t.Fatalf("claim registers %v; want an IPv4 and an IPv6 address", rec.Addrs)
	}
	static4 := netip.MustParseAddr(want[0])
	rev, _ := dns.ReverseAddr(static4.String())
	eventually(t, 60*time.Second, "external-dns publishes the claim's records", func() error {
		if got := addrsOf(bind.Lookup(t, fqdn, dns.TypeA)); !slices.Equal(got, want) {
			return fmt.Errorf("A %s = %v, want %v", fqdn, got, want)
		}
		if got := addrsOf(bind.Lookup(t, fqdn, dns.TypeAAAA)); !slices.Equal(got, want6) {
			return fmt.Errorf("AAAA %s = %v, want %v", fqdn, got, want6)
		}
		if got := ptrsOf(bind.Lookup(t, rev, dns.TypePTR)); !slices.Equal(got, []string{fqdn}) {
			return fmt.Errorf("PTR %s = %v, want %s", rev, got, fqdn)
		}
		return nil
	})
	if a := bind.Lookup(t, fqdn, dns.TypeA); a[0].Header().Ttl != 60 {
		t.Errorf("A %s has TTL %d, want dnsProvider.ttlSeconds 60", fqdn, a[0].Header().Ttl)
	}

	// A DNSEndpoint of this install for a claim that is gone (as if the
	// operator had been down when it was deleted) is swept, and its
	// records go from DNS; the live claim's stay.
	reg, err := externaldns.New(externaldns.Config{Client: env.Client, Namespace: ns, Provider: dnsreg.TypeExternalDNS, Zone: dnsTestZone, ReverseZones: []string{dnsTestReverse}})
	if err != nil {
		t.Fatal(err)
	}
	ghost := dnsreg.Record{Name: "ghost." + dnsTestZone, Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.99")},
		Owner: dnsreg.Owner{Claim: "0d5c1f3e-gone", Install: testSigner.OperatorID()}}
	if err := reg.Register(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the vanished claim's DNSEndpoint swept and its records gone", func() error {
		ghostObj := &unstructured.Unstructured{}
		ghostObj.SetGroupVersionKind(externaldns.GroupVersion.WithKind(externaldns.Kind))
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: externaldns.ObjectName(ghost.Name)}, ghostObj); err == nil {
			return fmt.Errorf("DNSEndpoint %s still there", ghostObj.GetName())
		}
		if a := bind.Lookup(t, "ghost."+dnsTestZone, dns.TypeA); len(a) != 0 {
			return fmt.Errorf("ghost A %v", a)
		}
		return nil
	})
	if got := addrsOf(bind.Lookup(t, fqdn, dns.TypeA)); !slices.Equal(got, want) {
		t.Fatalf("after the sweep, A %s = %v, want %v: the sweep removed a live claim's records", fqdn, got, want)
	}

	// The claim's deletion deletes its DNSEndpoint, and external-dns
	// removes the records.
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	waitGone(t, claim, 60*time.Second)
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: object}, endpoint); !apierrors.IsNotFound(err) {
		t.Fatalf("the claim's DNSEndpoint after the claim went: %v", err)
	}
	eventually(t, 60*time.Second, "external-dns removes the claim's records", func() error {
		if a := bind.Lookup(t, fqdn, dns.TypeA); len(a) != 0 {
			return fmt.Errorf("A %s = %v", fqdn, a)
		}
		if p := bind.Lookup(t, rev, dns.TypePTR); len(p) != 0 {
			return fmt.Errorf("PTR %s = %v", rev, p)
		}
		return nil
	})
}

// TestExternalDNSNotSetUp: a cluster of type external-dns whose DNSEndpoints
// cannot be written (here: the namespace it names does not exist; the
// missing CRD and missing permissions take the same path, each with its
// reason, internal/dnsreg/externaldns) reports DNSReady False with the
// reason and the fix, and stays Ready; its claims' VMs are created (the
// claim says why it is not registered) and deleted all the same, promptly.
// Creating the namespace makes it work without a restart.
func TestExternalDNSNotSetUp(t *testing.T) {
	ns := fmt.Sprintf("dns-endpoints-later-%d", fixtureSeq+1)
	f, static, sim := dnsFixtureOf(t, func(c *hfv1.HypervisorCluster) {
		c.Spec.DNS = &hfv1.ClusterDNSSettings{
			DNSSettings: hfv1.DNSSettings{Domain: dnsTestZone},
			RegisterVMs: true,
			DNSProvider: &hfv1.DNSProvider{Type: dnsreg.TypeExternalDNS, ExternalDNS: &hfv1.ExternalDNSSettings{Namespace: ns, LabelValue: "cloudflare"}},
		}
	})
	reason := externaldns.ErrNamespaceMissing.Reason()
	notReady := waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionFalse, reason)
	if !strings.Contains(notReady.Message, "namespace "+ns+" does not exist") || !strings.Contains(notReady.Message, "dns.dnsProvider.externalDNS.namespace") {
		t.Errorf("DNSReady message %q names neither the namespace nor the fix", notReady.Message)
	}
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)

	claim := newClaimOf(f, static, "no-endpoint")
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	waitClaimCondition(t, claim, hfv1.MachineClaimDNSRegisteredCondition, metav1.ConditionFalse, hfv1.ConditionReason(reason))
	got, err := getClaim(t, claim)
	if err != nil {
		t.Fatal(err)
	}
	vm := int(got.Status.VMRef.VMID)
	if err := env.Client.Delete(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	waitGone(t, claim, 60*time.Second)
	for _, v := range sim.VMs() {
		if v.VMID == vm {
			t.Fatalf("VM %d is still there after its claim went", vm)
		}
	}

	if err := env.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	})
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionTrue, string(hfv1.ReadyReason))
}
