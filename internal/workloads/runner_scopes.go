package workloads

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/sweeper"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

var _ sweeper.RunnerScopes = (*Platforms)(nil)

// RunnerScopes implements sweeper.RunnerScopes: the scope of every
// HypervisorMachineTemplate that names one and of every RunnerPool (with
// its template's credentials), each scope of each platform endpoint once.
// A scope whose credentials cannot be read is skipped this round.
func (w *Platforms) RunnerScopes(ctx context.Context) ([]sweeper.RunnerScope, error) {
	var tmpls hfv1.HypervisorMachineTemplateList
	if err := w.Client.List(ctx, &tmpls); err != nil {
		return nil, fmt.Errorf("list HypervisorMachineTemplates: %w", err)
	}
	var pools hfv1.RunnerPoolList
	if err := w.Client.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("list RunnerPools: %w", err)
	}
	c := scopeCollector{w: w, seen: map[string]bool{}}
	byName := map[string]*hfv1.HypervisorMachineTemplate{}
	for i := range tmpls.Items {
		t := &tmpls.Items[i]
		byName[t.Namespace+"/"+t.Name] = t
		if be, tt, ok := w.Backends.Template(t); ok && !tt.Scope.IsZero() {
			c.add(ctx, be, t, tt.Endpoint, tt.Scope, t)
		}
	}
	for i := range pools.Items {
		pool := &pools.Items[i]
		t := byName[pool.Namespace+"/"+pool.Spec.TemplateRef.Name]
		if t == nil {
			continue
		}
		if be, ps, ok := w.Backends.Pool(pool, t); ok && !ps.Scope.IsZero() {
			tt, _ := be.Template(t)
			c.add(ctx, be, t, tt.Endpoint, ps.Scope, pool)
		}
	}
	return c.out, nil
}

type scopeCollector struct {
	w    *Platforms
	seen map[string]bool
	out  []sweeper.RunnerScope
}

// add appends the scope on endpoint (empty: the platform's public service)
// unless it is there already; obj receives the scope's events.
func (c *scopeCollector) add(ctx context.Context, be workload.Backend, tmpl *hfv1.HypervisorMachineTemplate, endpoint string, scope workload.Scope, obj client.Object) {
	if scope.IsEnterprise() {
		// An enterprise's runners are one list whichever organization a
		// pool serves with them: swept once, at the enterprise.
		scope = workload.Scope{Enterprise: scope.Enterprise}
	}
	key := scope.String()
	if endpoint != "" {
		key = endpoint + " " + key
	}
	if c.seen[key] {
		return
	}
	p, err := be.Provider(ctx, tmpl, scope, c.w.readSecret)
	if err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("Skipping a CI scope in the runner sweep", "scope", key, "HypervisorMachineTemplate", tmpl.Namespace+"/"+tmpl.Name, "reason", err.Error())
		return
	}
	c.seen[key] = true
	c.out = append(c.out, sweeper.RunnerScope{Key: key, Provider: p, EventObject: obj})
}
