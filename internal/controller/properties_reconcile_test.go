package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// poolOp is one generated change of a RunnerPool or its template.
type poolOp struct {
	kind     string // scale, switch, labels, template
	min, max int32
	labels   []string
}

func (o poolOp) String() string {
	switch o.kind {
	case "scale":
		return fmt.Sprintf("scale to %d..%d", o.min, o.max)
	case "labels":
		return fmt.Sprintf("labels %v", o.labels)
	}
	return o.kind
}

// Feature: hyperfleet-operator, Property 16: Reconciliation Behavior
//
// TestReconciliationProperty: a RunnerPool created and then changed by a
// generated sequence of edits, made at generated moments while the
// operator reconciles (its bounds scaled, including bounds the API
// refuses; its template switched; its runner labels changed; its
// template's resources edited), converges to its final spec: its status
// observes its last generation, it has exactly its final minimum of live
// claims (no jobs arrive, and idle claims above it go at once), every
// live claim is of its final template and built from that template's
// current version, none is counted stale, and it settles there.
func TestReconciliationProperty(t *testing.T) {
	longScenario(t)
	w := newPropertyWorld(t)
	ctx := context.Background()
	// A second template, different enough that its VMs differ: switching
	// to it makes every claim of the first stale.
	other := w.f.template.DeepCopy()
	other.ObjectMeta = metav1.ObjectMeta{Namespace: w.f.namespace, Name: "debian-small"}
	other.Spec.Resources = hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("1Gi")}
	w.f.create(other)
	templates := []string{w.f.template.Name, other.Name}
	labelSets := [][]string{{"linux"}, {"linux", "x64"}, {"gpu"}}
	var ops, refused int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		w.n++
		min0 := rapid.Int32Range(0, 2).Draw(rt, "min")
		pool := &hfv1.RunnerPool{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.f.namespace, Name: fmt.Sprintf("p16-%d", w.n)},
			Spec: hfv1.RunnerPoolSpec{
				TemplateRef: hfv1.ObjectName{Name: rapid.SampledFrom(templates).Draw(rt, "template")},
				Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{
					Labels: rapid.SampledFrom(labelSets).Draw(rt, "labels")}},
				Scaling: hfv1.Scaling{MinReplicas: min0, MaxReplicas: rapid.Int32Range(max(min0, 1), 3).Draw(rt, "max"),
					ScaleDownDelay: &metav1.Duration{}},
			},
		}
		if err := env.Client.Create(ctx, pool); err != nil {
			rt.Fatal(err)
		}
		defer w.removePool(rt, pool)
		final := pool.Spec.DeepCopy()
		var done []string
		for range rapid.IntRange(1, 3).Draw(rt, "edits") {
			time.Sleep(time.Duration(rapid.IntRange(0, 300).Draw(rt, "wait ms")) * time.Millisecond)
			op := poolOp{kind: rapid.SampledFrom([]string{"scale", "switch", "labels", "template"}).Draw(rt, "edit")}
			switch op.kind {
			case "scale":
				op.min, op.max = rapid.Int32Range(0, 3).Draw(rt, "new min"), rapid.Int32Range(1, 3).Draw(rt, "new max")
			case "labels":
				op.labels = rapid.SampledFrom(labelSets).Draw(rt, "new labels")
			}
			ops++
			done = append(done, op.String())
			if op.kind == "template" {
				// The pool's template changes: its VMs differ from now on.
				if err := retry.RetryOnConflict(conflictRetry, func() error {
					var tmpl hfv1.HypervisorMachineTemplate
					if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: final.TemplateRef.Name}, &tmpl); err != nil {
						return err
					}
					tmpl.Spec.Resources.CPU = tmpl.Spec.Resources.CPU%3 + 1
					return env.Client.Update(ctx, &tmpl)
				}); err != nil {
					rt.Fatal(err)
				}
				continue
			}
			err := retry.RetryOnConflict(conflictRetry, func() error {
				var p hfv1.RunnerPool
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
					return err
				}
				switch op.kind {
				case "scale":
					p.Spec.Scaling.MinReplicas, p.Spec.Scaling.MaxReplicas = op.min, op.max
				case "switch":
					p.Spec.TemplateRef.Name = templates[(slices.Index(templates, p.Spec.TemplateRef.Name)+1)%2]
				case "labels":
					p.Spec.Workload.GitHub.Labels = op.labels
				}
				if err := env.Client.Update(ctx, &p); err != nil {
					return err
				}
				final = p.Spec.DeepCopy()
				return nil
			})
			switch {
			case op.kind == "scale" && op.min > op.max:
				// Bounds the API refuses change nothing.
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "minReplicas") {
					rt.Fatalf("pool scaled to %d..%d: %v, want refused naming minReplicas", op.min, op.max, err)
				}
				refused++
			case err != nil:
				rt.Fatalf("%s: %v", op, err)
			}
		}
		// The claims the pool has once its last edit has been seen: a
		// claim still starting is not removed to scale down (it may be
		// about to take a job; only idle ones are, and no runner comes
		// online in this world), so these may stay above the final
		// bounds; the pool must not add any beyond them. Seen means the
		// pool's status reports the edit's generation: the pass that
		// wrote it ran on the last spec, and every pass before it, which
		// may have created claims for an older one, has ended (a fixed
		// 150 ms wait missed a claim a pass of the old spec created later
		// on a loaded CI machine).
		within(rt, 30*time.Second, "pool "+pool.Name+" observed its last edit", func() error {
			var p hfv1.RunnerPool
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
				return err
			}
			if p.Status.ObservedGeneration != p.Generation {
				return fmt.Errorf("observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
			}
			return nil
		})
		before := map[string]bool{}
		if cs, err := liveClaims(ctx, pool); err == nil {
			for _, c := range cs {
				before[string(c.UID)] = true
			}
		} else {
			rt.Fatal(err)
		}
		// Converged: checked until it holds, then again a little later
		// (it stays there: nothing flaps).
		converged := func() error {
			var p hfv1.RunnerPool
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p); err != nil {
				return err
			}
			if p.Status.ObservedGeneration != p.Generation {
				return fmt.Errorf("observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
			}
			var tmpl hfv1.HypervisorMachineTemplate
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: final.TemplateRef.Name}, &tmpl); err != nil {
				return err
			}
			if tmpl.Status.ObservedGeneration != tmpl.Generation {
				return fmt.Errorf("template %s not validated yet", tmpl.Name)
			}
			live, err := liveClaims(ctx, pool)
			if err != nil {
				return err
			}
			kept := 0
			for _, c := range live {
				if before[string(c.UID)] {
					kept++
				}
			}
			if want := max(final.Scaling.MinReplicas, int32(kept)); int32(len(live)) != want {
				return fmt.Errorf("%d live claims (%d of them from before the last edit), want %d (the final minimum %d, or those kept): %v",
					len(live), kept, want, final.Scaling.MinReplicas, claimNames(live))
			}
			if int32(len(live)) > final.Scaling.MaxReplicas && kept < len(live) {
				rt.Fatalf("pool %s has %d live claims, above its maximum %d, and made %d of them after its last edit", pool.Name, len(live), final.Scaling.MaxReplicas, len(live)-kept)
			}
			for _, c := range live {
				if c.Spec.TemplateRef.Name != final.TemplateRef.Name {
					return fmt.Errorf("claim %s is of template %s, the pool's is %s", c.Name, c.Spec.TemplateRef.Name, final.TemplateRef.Name)
				}
				if c.Status.TemplateHash == "" || c.Status.TemplateHash != tmpl.Status.TemplateHash {
					return fmt.Errorf("claim %s built from template version %.12q, current %.12q", c.Name, c.Status.TemplateHash, tmpl.Status.TemplateHash)
				}
			}
			if p.Status.StaleReplicas != 0 {
				return fmt.Errorf("status: %d stale", p.Status.StaleReplicas)
			}
			return nil
		}
		within(rt, 45*time.Second, fmt.Sprintf("pool %s converged after %v", pool.Name, done), converged)
		time.Sleep(100 * time.Millisecond)
		if err := converged(); err != nil {
			rt.Fatalf("pool %s converged after %v, then left it: %v", pool.Name, done, err)
		}
	})
	t.Logf("%d edits, %d refused by the API", ops, refused)
	if refused == 0 {
		t.Error("no generated edit was refused by the API; the generator never tried bounds out of order")
	}
}

// liveClaims are the pool's claims that are neither ending nor deleted.
func liveClaims(ctx context.Context, pool *hfv1.RunnerPool) ([]hfv1.MachineClaim, error) {
	var claims hfv1.MachineClaimList
	if err := env.Client.List(ctx, &claims, client.InNamespace(pool.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
		return nil, fmt.Errorf("list claims of pool %s: %w", pool.Name, err)
	}
	var out []hfv1.MachineClaim
	for _, c := range claims.Items {
		if c.DeletionTimestamp.IsZero() && !c.EndRequested() && !c.Ended() {
			out = append(out, c)
		}
	}
	return out, nil
}

func claimNames(cs []hfv1.MachineClaim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Name)
	}
	return out
}

// removePool deletes the pool, then its claims (the API server of the
// tests runs no garbage collector), and waits until they and their VMs
// are gone.
func (w *propertyWorld) removePool(t *rapid.T, pool *hfv1.RunnerPool) {
	ctx := context.Background()
	if err := env.Client.Delete(ctx, pool); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	within(t, 10*time.Second, "pool "+pool.Name+" gone", func() error {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &hfv1.RunnerPool{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		return nil
	})
	uids := map[string]bool{}
	within(t, 60*time.Second, "claims of pool "+pool.Name+" gone", func() error {
		var claims hfv1.MachineClaimList
		if err := env.Client.List(ctx, &claims, client.InNamespace(pool.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
			return err
		}
		for i := range claims.Items {
			uids[string(claims.Items[i].UID)] = true
			if claims.Items[i].DeletionTimestamp.IsZero() {
				_ = env.Client.Delete(ctx, &claims.Items[i])
			}
		}
		if n := len(claims.Items); n > 0 {
			return fmt.Errorf("%d left", n)
		}
		return nil
	})
	for uid := range uids {
		if vms := w.vmsOf(uid); len(vms) > 0 {
			t.Fatalf("pool %s and its claims are gone but VM %d is still on the cluster", pool.Name, vms[0].VMID)
		}
	}
}
