package quota

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// placed is one claim as the API server holds it.
type placed struct {
	ns      string
	cluster string // "" without a VM
	use     Use
}

// laggingStore is the API server and an informer cache that lags it: every
// write appends a version of all claims, and the cache shows an older
// version until it is advanced (never backwards).
type laggingStore struct {
	mu       sync.Mutex
	versions []map[types.UID]placed
	shown    int
}

func (s *laggingStore) write(f func(map[types.UID]placed)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	next := maps.Clone(s.versions[len(s.versions)-1])
	f(next)
	s.versions = append(s.versions, next)
}

func (s *laggingStore) latest() map[types.UID]placed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[len(s.versions)-1]
}

// advance moves the cache forward by up to n versions; n < 0 syncs it.
func (s *laggingStore) advance(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 0 {
		n = len(s.versions)
	}
	s.shown = min(s.shown+n, len(s.versions)-1)
}

func (s *laggingStore) source(_ context.Context, ns string) ([]Claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Claim
	for uid, c := range s.versions[s.shown] {
		if c.ns == ns {
			out = append(out, Claim{UID: uid, Cluster: c.cluster, Use: c.use})
		}
	}
	return out, nil
}

// usageOf is what namespace ns uses on cluster in claims.
func usageOf(claims map[types.UID]placed, ns, cluster string) Use {
	u := Use{}
	for _, c := range claims {
		if c.ns == ns && c.cluster == cluster {
			u.add(c.use)
		}
	}
	return u
}

func drawLimits(t *rapid.T, ns string) *hfv1.TenantLimits {
	l := &hfv1.TenantLimits{}
	opt := func(label string, hi int) *int32 {
		if !rapid.Bool().Draw(t, label+" limited "+ns) {
			return nil
		}
		return ptr.To(int32(rapid.IntRange(0, hi).Draw(t, label+" "+ns)))
	}
	l.Machines, l.CPU, l.Devices = opt("machines", 6), opt("cpu", 24), opt("devices", 4)
	if n := opt("memory GiB", 48); n != nil {
		l.Memory = resource.NewQuantity(int64(*n)*gi, resource.BinarySI)
	}
	if n := opt("disk GiB", 400); n != nil {
		l.Disk = resource.NewQuantity(int64(*n)*gi, resource.BinarySI)
	}
	return l
}

// Feature: hyperfleet-operator, Property 29: Namespace Quotas Are Never Exceeded
//
// Claims of random sizes in one to three namespaces under random limits
// are placed on two clusters by several goroutines at once through the
// ledger, over a cache that shows the placement records later than they
// are written; some writes fail, VMs are destroyed, and the operator
// restarts (a fresh ledger over the records written so far). After every
// step each namespace's usage on each cluster, counted from the records
// written, is within every limit; a claim refused would have exceeded the
// limit it names, and, with the cache caught up, exactly by what the
// records say.
func TestQuotaNeverExceededProperty(t *testing.T) {
	proptest.Check(t, proptest.Minimum, func(t *rapid.T) {
		clusters := []string{"pve", "lab"}
		namespaces := []string{"team-a", "team-b", "team-c"}[:rapid.IntRange(1, 3).Draw(t, "namespaces")]
		rules := map[string][]Rule{}
		for i, ns := range namespaces {
			rules[ns] = []Rule{{Field: fmt.Sprintf("spec.tenancy[%d].limits", i), Limits: drawLimits(t, ns)}}
		}
		type claim struct {
			uid  types.UID
			ns   string
			need Use
		}
		var claims []claim
		store := &laggingStore{versions: []map[types.UID]placed{{}}}
		store.write(func(m map[types.UID]placed) {
			for i := range rapid.IntRange(1, 16).Draw(t, "claims") {
				c := claim{uid: types.UID(fmt.Sprintf("c%d", i)), ns: rapid.SampledFrom(namespaces).Draw(t, "namespace"), need: Use{
					Machines: 1,
					CPU:      int64(rapid.IntRange(0, 8).Draw(t, "cpu")),
					Memory:   int64(rapid.IntRange(0, 16).Draw(t, "memory GiB")) * gi,
					Disk:     int64(rapid.IntRange(0, 120).Draw(t, "disk GiB")) * gi,
					Devices:  int64(rapid.IntRange(0, 2).Draw(t, "devices")),
				}}
				claims = append(claims, c)
				m[c.uid] = placed{ns: c.ns}
			}
		})
		store.advance(-1)
		ledger := NewLedger(store.source)
		ctx := context.Background()

		within := func(step string) {
			now := store.latest()
			for _, ns := range namespaces {
				for _, cl := range clusters {
					u := usageOf(now, ns, cl)
					if ex := exceeded(rules[ns], Use{}, u); ex != nil {
						t.Fatalf("after %s: namespace %s on %s uses %d of %s, over its limit %d", step, ns, cl, ex.Need, ex.Field, ex.Limit)
					}
				}
			}
		}
		unplaced := func() []claim {
			now := store.latest()
			var out []claim
			for _, c := range claims {
				if p, ok := now[c.uid]; ok && p.cluster == "" {
					out = append(out, c)
				}
			}
			return out
		}

		for step := range rapid.IntRange(1, 25).Draw(t, "steps") {
			switch rapid.IntRange(0, 5).Draw(t, "action") {
			case 0, 1: // several reconciles place claims at once
				free := unplaced()
				if len(free) == 0 {
					continue
				}
				batch := rapid.SliceOfNDistinct(rapid.SampledFrom(free), 1, min(4, len(free)), func(c claim) types.UID { return c.uid }).Draw(t, "placed at once")
				type try struct {
					c       claim
					cluster string
					fails   bool
				}
				tries := make([]try, len(batch))
				inFlight := Use{}
				for i, c := range batch {
					tries[i] = try{c: c, cluster: rapid.SampledFrom(clusters).Draw(t, "cluster"), fails: rapid.IntRange(0, 4).Draw(t, "write fails") == 0}
					inFlight.add(c.need)
				}
				// The bound a refusal may count up to: every VM the
				// cache or the records show, and every claim of the batch.
				before, cached := store.latest(), map[types.UID]placed{}
				store.mu.Lock()
				maps.Copy(cached, store.versions[store.shown])
				store.mu.Unlock()
				var wg sync.WaitGroup
				refusals := make([]*Exceeded, len(tries))
				for i, tr := range tries {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ex, err := ledger.Admit(ctx, tr.cluster, types.NamespacedName{Namespace: tr.c.ns, Name: string(tr.c.uid)}, tr.c.uid, rules[tr.c.ns], tr.c.need)
						if err != nil {
							panic(err)
						}
						if ex != nil {
							refusals[i] = ex
							return
						}
						if tr.fails {
							ledger.Release(tr.c.uid)
							return
						}
						store.write(func(m map[types.UID]placed) {
							if p, ok := m[tr.c.uid]; ok {
								m[tr.c.uid] = placed{ns: p.ns, cluster: tr.cluster, use: tr.c.need}
							}
						})
					}()
				}
				wg.Wait()
				for i, ex := range refusals {
					if ex == nil {
						continue
					}
					tr := tries[i]
					bound := usageOf(before, tr.c.ns, tr.cluster)[ex.Resource] + usageOf(cached, tr.c.ns, tr.cluster)[ex.Resource] + inFlight[ex.Resource]
					if ex.Usage+ex.Need <= ex.Limit || ex.Need != tr.c.need[ex.Resource] || ex.Usage > bound {
						t.Fatalf("claim %s refused over %s: usage %d + need %d against limit %d (need %d, at most %d in use)",
							tr.c.uid, ex.Field, ex.Usage, ex.Need, ex.Limit, tr.c.need[ex.Resource], bound)
					}
				}
			case 2: // the cache catches up a little
				store.advance(rapid.IntRange(0, 3).Draw(t, "versions"))
			case 3: // a VM is destroyed, or its claim deleted with it
				var withVM []claim
				for _, c := range claims {
					if p, ok := store.latest()[c.uid]; ok && p.cluster != "" {
						withVM = append(withVM, c)
					}
				}
				if len(withVM) == 0 {
					continue
				}
				c := rapid.SampledFrom(withVM).Draw(t, "destroyed")
				gone := rapid.Bool().Draw(t, "claim deleted")
				store.write(func(m map[types.UID]placed) {
					if gone {
						delete(m, c.uid)
					} else {
						m[c.uid] = placed{ns: c.ns}
					}
				})
				ledger.Forget(c.uid)
			case 4: // the operator restarts: its cache syncs before any reconcile
				store.advance(-1)
				ledger = NewLedger(store.source)
			case 5: // one claim alone, the cache caught up: refused only when the records say so
				free := unplaced()
				if len(free) == 0 {
					continue
				}
				store.advance(-1)
				c, cl := rapid.SampledFrom(free).Draw(t, "claim"), rapid.SampledFrom(clusters).Draw(t, "cluster")
				ex, err := ledger.Admit(ctx, cl, types.NamespacedName{Namespace: c.ns, Name: string(c.uid)}, c.uid, rules[c.ns], c.need)
				if err != nil {
					t.Fatal(err)
				}
				u := usageOf(store.latest(), c.ns, cl)
				if want := exceeded(rules[c.ns], u, c.need); (ex == nil) != (want == nil) || (ex != nil && (ex.Field != want.Field || ex.Usage != want.Usage)) {
					t.Fatalf("claim %s on %s with the cache caught up: ledger says %v, the records say %v", c.uid, cl, ex, want)
				}
				if ex == nil {
					store.write(func(m map[types.UID]placed) { m[c.uid] = placed{ns: c.ns, cluster: cl, use: c.need} })
				}
			}
			within(fmt.Sprintf("step %d", step))
		}
	})
}
