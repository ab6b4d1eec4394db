package quota

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const gi = int64(1) << 30

// listed is a Source over a fixed list, by namespace.
func listed(claims map[string][]Claim) Source {
	return func(_ context.Context, ns string) ([]Claim, error) { return claims[ns], nil }
}

func vm(uid, cluster string, cpu int64, mem int64) Claim {
	return Claim{UID: types.UID(uid), Cluster: cluster, Use: Use{Machines: 1, CPU: cpu, Memory: mem}}
}

func name(n string) types.NamespacedName { return types.NamespacedName{Namespace: "team-a", Name: n} }

func TestOf(t *testing.T) {
	u := Of(&provider.VMSpec{CPUCores: 4, MemoryBytes: 8 * gi, DiskBytes: 40 * gi,
		Hardware: &provider.Hardware{Devices: []string{"gpu", "gpu"}, ExtraDisks: []provider.Disk{{Bytes: 100 * gi}, {Bytes: 10 * gi}}}})
	want := Use{Machines: 1, CPU: 4, Memory: 8 * gi, Disk: 150 * gi, Devices: 2}
	for _, r := range Resources {
		if u[r] != want[r] {
			t.Errorf("%s = %d, want %d", r, u[r], want[r])
		}
	}
	if u := Of(&provider.VMSpec{}); u[Machines] != 1 || u[Disk] != 0 || u[Devices] != 0 {
		t.Errorf("a VM keeping its template's sizes counts %v, want one machine", u)
	}
}

func TestAdmit(t *testing.T) {
	mem := resource.MustParse("16Gi")
	machines2 := []Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{Machines: ptr.To[int32](2)}}}
	for _, tc := range []struct {
		name   string
		claims []Claim
		rules  []Rule
		need   Use
		// before admits these claims (by UID, needing one machine)
		// first, each on cluster pve.
		before    []string
		want      string // the field refused, "" admitted
		wantUsage int64
	}{
		{name: "room", claims: []Claim{vm("a", "pve", 2, gi), {UID: "self"}}, rules: machines2, need: Use{Machines: 1}},
		{name: "machines full", claims: []Claim{vm("a", "pve", 2, gi), vm("b", "pve", 2, gi), {UID: "self"}}, rules: machines2, need: Use{Machines: 1},
			want: "spec.tenancy[0].limits.machines", wantUsage: 2},
		{name: "another cluster's VMs do not count", claims: []Claim{vm("a", "other", 2, gi), vm("b", "other", 2, gi), {UID: "self"}}, rules: machines2, need: Use{Machines: 1}},
		{name: "claims without a VM do not count", claims: []Claim{{UID: "a"}, {UID: "b"}, {UID: "self"}}, rules: machines2, need: Use{Machines: 1}},
		{name: "a pending charge counts", claims: []Claim{vm("a", "pve", 2, gi), {UID: "b"}, {UID: "self"}}, before: []string{"b"}, rules: machines2, need: Use{Machines: 1},
			want: "spec.tenancy[0].limits.machines", wantUsage: 2},
		{name: "a charge the cache shows counts once", claims: []Claim{vm("b", "pve", 0, 0), {UID: "self"}}, before: []string{"b"}, rules: machines2, need: Use{Machines: 1}},
		{name: "a charge of a claim gone is dropped", claims: []Claim{vm("a", "pve", 2, gi), {UID: "self"}}, before: []string{"b"}, rules: machines2, need: Use{Machines: 1}},
		{name: "memory", claims: []Claim{vm("a", "pve", 2, 12*gi), {UID: "self"}}, rules: []Rule{{Field: "spec.tenancy[3].limits", Limits: &hfv1.TenantLimits{Memory: &mem}}},
			need: Use{Machines: 1, Memory: 8 * gi}, want: "spec.tenancy[3].limits.memory", wantUsage: 12 * gi},
		{name: "the strictest rule wins", claims: []Claim{vm("a", "pve", 4, gi), {UID: "self"}},
			rules: []Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{CPU: ptr.To[int32](64)}}, {Field: "spec.tenancy[1].limits", Limits: &hfv1.TenantLimits{CPU: ptr.To[int32](6)}}},
			need:  Use{Machines: 1, CPU: 4}, want: "spec.tenancy[1].limits.cpu", wantUsage: 4},
		{name: "a resource not needed does not refuse", claims: []Claim{{UID: "a", Cluster: "pve", Use: Use{Machines: 1, Devices: 2}}, {UID: "self"}},
			rules: []Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{Devices: ptr.To[int32](1)}}}, need: Use{Machines: 1}},
		{name: "zero machines", claims: []Claim{{UID: "self"}}, rules: []Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{Machines: ptr.To[int32](0)}}},
			need: Use{Machines: 1}, want: "spec.tenancy[0].limits.machines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLedger(listed(map[string][]Claim{"team-a": tc.claims}))
			ctx := context.Background()
			for _, uid := range tc.before {
				if ex, err := l.Admit(ctx, "pve", name(uid), types.UID(uid), []Rule{{Field: "x", Limits: &hfv1.TenantLimits{}}}, Use{Machines: 1}); ex != nil || err != nil {
					t.Fatalf("admit %s first: %v %v", uid, ex, err)
				}
			}
			ex, err := l.Admit(ctx, "pve", name("self"), "self", tc.rules, tc.need)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.want == "" && ex != nil:
				t.Fatalf("refused: %v", ex)
			case tc.want != "" && ex == nil:
				t.Fatalf("admitted, want %s exceeded", tc.want)
			case ex != nil:
				if ex.Field != tc.want || ex.Usage != tc.wantUsage || ex.Usage+ex.Need <= ex.Limit {
					t.Errorf("refused over %s (usage %d, need %d, limit %d), want %s with usage %d", ex.Field, ex.Usage, ex.Need, ex.Limit, tc.want, tc.wantUsage)
				}
				if !l.Waiting("self") {
					t.Error("a refused claim is not waiting")
				}
			}
		})
	}
}

func TestReleaseAndForget(t *testing.T) {
	ctx := context.Background()
	l := NewLedger(listed(map[string][]Claim{"team-a": {{UID: "a"}, {UID: "b"}}}))
	one := []Rule{{Field: "spec.tenancy[0].limits", Limits: &hfv1.TenantLimits{Machines: ptr.To[int32](1)}}}
	if ex, _ := l.Admit(ctx, "pve", name("a"), "a", one, Use{Machines: 1}); ex != nil {
		t.Fatalf("a refused: %v", ex)
	}
	ex, _ := l.Admit(ctx, "pve", name("b"), "b", one, Use{Machines: 1})
	if ex == nil || !strings.Contains(ex.Error(), "limit 1, in use 1, this VM needs 1") {
		t.Fatalf("b admitted over a's charge, or said %v", ex)
	}
	if woken := l.Release("a"); len(woken) != 1 || woken[0] != name("b") {
		t.Fatalf("releasing a's charge woke %v, want b", woken)
	}
	if ex, _ := l.Admit(ctx, "pve", name("b"), "b", one, Use{Machines: 1}); ex != nil || l.Waiting("b") {
		t.Fatalf("b refused after a's release: %v", ex)
	}
	l.Forget("b")
	if ex, _ := l.Admit(ctx, "pve", name("a"), "a", one, Use{Machines: 1}); ex != nil {
		t.Fatalf("a refused after b's VM was destroyed: %v", ex)
	}
}

func TestAdmitReadError(t *testing.T) {
	l := NewLedger(func(context.Context, string) ([]Claim, error) { return nil, errors.New("cache down") })
	if _, err := l.Admit(context.Background(), "pve", name("a"), "a", nil, Use{Machines: 1}); err == nil {
		t.Fatal("admitted without reading the cache")
	}
}

func TestFormat(t *testing.T) {
	if got := Format(Memory, 16*gi); got != "16Gi" {
		t.Errorf("memory = %s", got)
	}
	if got := Format(CPU, 12); got != "12" {
		t.Errorf("cpu = %s", got)
	}
}
