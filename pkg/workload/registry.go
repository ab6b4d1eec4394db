package workload

import (
	"fmt"
	"maps"
	"slices"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/registry"
)

// Factory builds one CI platform's Backend for an operator.
type Factory func(Dependencies) (Backend, error)

// platforms are the factories registered with Register, by workload type.
var platforms = registry.New[hfv1.WorkloadType, Factory]("workload type")

// Register makes a CI platform available to the operator under its
// workload type (spec.workload.type). The binary's main registers every
// platform it ships, so that supporting one more is its package and one
// line there. Registering a type twice, or an empty type or nil factory,
// is a programming error and panics.
func Register(t hfv1.WorkloadType, f Factory) { platforms.Register(t, f) }

// Registered returns a copy of the factories registered so far.
func Registered() map[hfv1.WorkloadType]Factory { return platforms.Registered() }

// Backends are the back-ends of one operator, by workload type. A nil
// *Backends has none.
type Backends struct {
	types  []hfv1.WorkloadType
	byType map[hfv1.WorkloadType]Backend
}

// NewBackends builds a Backend with every factory.
func NewBackends(factories map[hfv1.WorkloadType]Factory, deps Dependencies) (*Backends, error) {
	b := &Backends{byType: make(map[hfv1.WorkloadType]Backend, len(factories))}
	for _, t := range slices.Sorted(maps.Keys(factories)) {
		be, err := factories[t](deps)
		if err != nil {
			return nil, fmt.Errorf("workload type %s: %w", t, err)
		}
		b.types = append(b.types, t)
		b.byType[t] = be
	}
	return b, nil
}

// Types are the workload types served, sorted.
func (b *Backends) Types() []hfv1.WorkloadType {
	if b == nil {
		return nil
	}
	return slices.Clone(b.types)
}

// For returns the back-end of workload type t.
func (b *Backends) For(t hfv1.WorkloadType) (Backend, bool) {
	if b == nil {
		return nil, false
	}
	be, ok := b.byType[t]
	return be, ok
}

// Template returns the back-end that reads tmpl, with what it read: the
// first, by workload type, whose section tmpl has. A template configures
// the platform its claims' runners register with when they name none
// (spec.workloadConfig unset).
func (b *Backends) Template(tmpl *hfv1.HypervisorMachineTemplate) (Backend, Template, bool) {
	for _, t := range b.Types() {
		if tt, ok := b.byType[t].Template(tmpl); ok {
			return b.byType[t], tt, true
		}
	}
	return nil, Template{}, false
}

// Pool returns the back-end of pool's workload type, with what it read
// from pool and tmpl (its template, nil when it does not exist); false
// when no back-end serves the type or the pool has no section for it.
func (b *Backends) Pool(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (Backend, Pool, bool) {
	be, ok := b.For(pool.Spec.Workload.Type)
	if !ok {
		return nil, Pool{}, false
	}
	p, ok := be.Pool(pool, tmpl)
	return be, p, ok
}

// Claim returns the back-end of claim's runner: that of its
// spec.workloadConfig's type, else its template's.
func (b *Backends) Claim(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (Backend, bool) {
	if wc := claim.Spec.WorkloadConfig; wc != nil {
		return b.For(wc.Type)
	}
	be, _, ok := b.Template(tmpl)
	return be, ok
}

// APIHosts are the API hosts tmpl's credentials are used at, as the
// back-end of the platform tmpl configures reads them (Template.APIHosts);
// none when no back-end reads tmpl.
func (b *Backends) APIHosts(tmpl *hfv1.HypervisorMachineTemplate) []APIHost {
	_, t, ok := b.Template(tmpl)
	if !ok {
		return nil
	}
	return t.APIHosts
}
