package controller

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/sweeper"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

var _ sweeper.RunnerScopes = (*GitHubBootstrap)(nil)

// RunnerScopes implements sweeper.RunnerScopes: the GitHub scope of every
// HypervisorMachineTemplate that names one and of every RunnerPool (with
// its template's credentials), each scope of each GitHub host once. A
// scope whose credentials cannot be read is skipped this round.
func (b *GitHubBootstrap) RunnerScopes(ctx context.Context) ([]sweeper.RunnerScope, error) {
	var tmpls hfv1.HypervisorMachineTemplateList
	if err := b.Client.List(ctx, &tmpls); err != nil {
		return nil, fmt.Errorf("list HypervisorMachineTemplates: %w", err)
	}
	var pools hfv1.RunnerPoolList
	if err := b.Client.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("list RunnerPools: %w", err)
	}
	c := scopeCollector{b: b, seen: map[string]bool{}}
	byName := map[string]*hfv1.HypervisorMachineTemplate{}
	for i := range tmpls.Items {
		t := &tmpls.Items[i]
		byName[t.Namespace+"/"+t.Name] = t
		if scope, ok := demand.PoolScope(nil, &t.Spec.Bootstrap.GitHub); ok {
			c.add(ctx, t, scope, t)
		}
	}
	for i := range pools.Items {
		pool := &pools.Items[i]
		t := byName[pool.Namespace+"/"+pool.Spec.TemplateRef.Name]
		if t == nil {
			continue
		}
		if scope, ok := demand.PoolScope(pool.Spec.Workload.GitHub, &t.Spec.Bootstrap.GitHub); ok {
			c.add(ctx, t, scope, pool)
		}
	}
	return c.out, nil
}

type scopeCollector struct {
	b    *GitHubBootstrap
	seen map[string]bool
	out  []sweeper.RunnerScope
}

// add appends the scope on tmpl's GitHub host unless it is there already;
// obj receives the scope's events.
func (c *scopeCollector) add(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, obj client.Object) {
	key := scope.String()
	if base := orDefault(tmpl.Spec.Bootstrap.GitHub.APIBaseURL, ghworkload.DefaultBaseURL); base != ghworkload.DefaultBaseURL {
		key = base + " " + key
	}
	if c.seen[key] {
		return
	}
	p, _, err := c.b.scopedProvider(ctx, tmpl, scope)
	if err != nil {
		ctrl.LoggerFrom(ctx).V(1).Info("Skipping a CI scope in the runner sweep", "scope", key, "HypervisorMachineTemplate", tmpl.Namespace+"/"+tmpl.Name, "reason", err.Error())
		return
	}
	c.seen[key] = true
	c.out = append(c.out, sweeper.RunnerScope{Key: key, Provider: p, EventObject: obj})
}
