package sweeper

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
)

// zone is an in-memory DNS service: the records registered, by name.
type zone struct {
	mu      sync.Mutex
	records map[string]dnsreg.Record
	listErr error
}

func (z *zone) Register(_ context.Context, rec dnsreg.Record) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.records[dnsreg.Fqdn(rec.Name)] = rec
	return nil
}

func (z *zone) Remove(_ context.Context, rec dnsreg.Record) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if got, ok := z.records[dnsreg.Fqdn(rec.Name)]; ok && got.Owner == rec.Owner {
		delete(z.records, dnsreg.Fqdn(rec.Name))
	}
	return nil
}

func (z *zone) List(_ context.Context, owner dnsreg.Owner) ([]dnsreg.Record, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.listErr != nil {
		return nil, z.listErr
	}
	var out []dnsreg.Record
	for _, rec := range z.records {
		if owner.Matches(rec.Owner) {
			out = append(out, rec)
		}
	}
	slices.SortFunc(out, func(a, b dnsreg.Record) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

func (z *zone) names() []string {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []string
	for n := range z.records {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// withDNS gives the world's cluster a DNS service registering VMs, with a
// record for a live claim, one for a gone claim of this install and one
// for a gone claim of another install.
func withDNS(w *world) *zone {
	w.t.Helper()
	live := w.claim("live")
	z := &zone{records: map[string]dnsreg.Record{}}
	install := w.signer.OperatorID()
	for _, rec := range []dnsreg.Record{
		{Name: "live.ci.example.test", Owner: dnsreg.Owner{Claim: live.UID, Install: install}},
		{Name: "gone.ci.example.test", Owner: dnsreg.Owner{Claim: "uid-gone", Install: install}},
		{Name: "other.ci.example.test", Owner: dnsreg.Owner{Claim: "uid-other", Install: "another-install"}},
	} {
		rec.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.10")}
		_ = z.Register(context.Background(), rec)
	}
	w.sweeper.DNS = dnsreg.NewClusters()
	w.sweeper.DNS.Set(w.cluster, dnsreg.Cluster{Registrar: z, Key: "k", RegisterVMs: true})
	return z
}

// TestDNSSweep: a name this install registered for a claim that is gone is
// reported at once and removed after the grace period; a live claim's name
// and another install's are never touched; dry-run only reports.
func TestDNSSweep(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		t.Run(map[bool]string{false: "remove", true: "dry-run"}[dryRun], func(t *testing.T) {
			w := newWorld(t, dryRun)
			z := withDNS(w)
			ctx := context.Background()
			w.sweeper.SweepAll(ctx)
			if got := w.sweeper.DNSOrphans(); len(got) != 1 || !strings.Contains(got[0], "gone.ci.example.test.") {
				t.Fatalf("orphans %v, want the gone claim's name", got)
			}
			if !hasEvent(w, "OrphanDNSFound") {
				t.Fatal("no OrphanDNSFound event")
			}
			if len(z.names()) != 3 {
				t.Fatalf("removed before the grace period: %v", z.names())
			}
			w.clock.Step(grace + round)
			w.sweeper.SweepAll(ctx)
			want := []string{"gone.ci.example.test.", "live.ci.example.test.", "other.ci.example.test."}
			if !dryRun {
				want = []string{"live.ci.example.test.", "other.ci.example.test."}
				if !hasEvent(w, "OrphanDNSRemoved") {
					t.Fatal("no OrphanDNSRemoved event")
				}
			}
			if got := z.names(); !slices.Equal(got, want) {
				t.Fatalf("names %v, want %v", got, want)
			}
		})
	}
}

// TestDNSSweepWaitsForItsClaim: a name found orphaned whose claim exists
// by the time the grace period ends is not removed, and nothing is swept
// on a cluster whose DNS service fails its check.
func TestDNSSweepWaitsForItsClaim(t *testing.T) {
	w := newWorld(t, false)
	z := withDNS(w)
	ctx := context.Background()
	w.sweeper.SweepAll(ctx)
	// A claim with the UID the record names turns up.
	if err := w.kube.Create(ctx, &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "gone", UID: "uid-gone"}}); err != nil {
		t.Fatal(err)
	}
	w.clock.Step(grace + round)
	w.sweeper.SweepAll(ctx)
	if got := z.names(); len(got) != 3 {
		t.Fatalf("names %v: a live claim's name was removed", got)
	}

	w2 := newWorld(t, false)
	z2 := withDNS(w2)
	w2.sweeper.DNS.Set(w2.cluster, dnsreg.Cluster{Registrar: z2, Key: "k", RegisterVMs: true, CheckErr: errors.New("no answer")})
	w2.sweeper.SweepAll(ctx)
	w2.clock.Step(grace + round)
	w2.sweeper.SweepAll(ctx)
	if got := z2.names(); len(got) != 3 {
		t.Fatalf("names %v: swept a cluster whose DNS check fails", got)
	}
}

func hasEvent(w *world, reason string) bool {
	for {
		select {
		case e := <-w.events.Events:
			if strings.Contains(e, reason) {
				return true
			}
		default:
			return false
		}
	}
}
