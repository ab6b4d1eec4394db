// Package generic is HyperFleet's workload back-end for VMs with no CI
// platform behind them (workload type generic, docs/generic.md): a VM runs
// its template's spec.bootstrap.generic.script once and powers off, or is
// ended at its ttl. No runner credential is issued and no runner is
// observed or removed: the back-end is a workload.NoRunner, which the
// controllers read as "no platform to ask".
package generic

import (
	"cmp"
	"context"
	"errors"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The API sections generic reads, for messages.
const (
	templateField = "spec.bootstrap.generic"
	poolField     = "spec.workload"
)

// Defaults of spec.bootstrap.generic, the same as the CRD's.
const (
	defaultWorkDir = "/var/lib/hyperfleet/work"
	defaultArch    = "x64"
	// The agent runs as a systemd service on Linux VMs only.
	vmOS = "linux"
)

// Backend is generic as a workload.Backend. Register it under
// hfv1.WorkloadGeneric with NewBackend.
type Backend struct{}

var (
	_ workload.NoRunner = Backend{}
	_ workload.Factory  = NewBackend
)

// NewBackend is the workload.Factory of generic.
func NewBackend(workload.Dependencies) (workload.Backend, error) { return Backend{}, nil }

// Name implements workload.Backend.
func (Backend) Name() string { return "Generic" }

// TemplateField implements workload.Backend.
func (Backend) TemplateField() string { return templateField }

// RunsNoRunner implements workload.NoRunner.
func (Backend) RunsNoRunner() {}

// Template implements workload.Backend for a template with a
// spec.bootstrap.generic: its script, ttl and work directory.
func (Backend) Template(tmpl *hfv1.HypervisorMachineTemplate) (workload.Template, bool) {
	g := tmpl.Spec.Bootstrap.Generic
	if g == nil {
		return workload.Template{}, false
	}
	ttl := hfv1.DefaultGenericTTL
	if g.TTL != nil {
		ttl = g.TTL.Duration
	}
	return workload.Template{
		Field:  templateField,
		Script: g.Script,
		TTL:    ttl,
		Runner: workload.RunnerSoftware{
			OS: vmOS, Arch: cmp.Or(string(g.Arch), defaultArch), WorkDir: cmp.Or(g.WorkDir, defaultWorkDir),
		},
	}, true
}

// Pool implements workload.Backend for a generic pool: no scope and no
// labels; its claims say type generic.
func (Backend) Pool(pool *hfv1.RunnerPool, _ *hfv1.HypervisorMachineTemplate) (workload.Pool, bool) {
	if pool.Spec.Workload.Type != hfv1.WorkloadGeneric {
		return workload.Pool{}, false
	}
	return workload.Pool{Field: poolField, Claim: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGeneric}}, true
}

// Claim implements workload.Backend: a generic claim asks for no runner.
func (Backend) Claim(*hfv1.MachineClaim) workload.ClaimRunner { return workload.ClaimRunner{} }

// ErrNoPlatform: generic has no CI platform account.
var ErrNoPlatform = errors.New("workload type generic has no CI platform: no runner credential, runner or job to ask about")

// Provider implements workload.Backend; generic has no platform account,
// and the controllers do not ask a NoRunner back-end for one.
func (Backend) Provider(context.Context, *hfv1.HypervisorMachineTemplate, workload.Scope, workload.SecretReader) (workload.Provider, error) {
	return nil, ErrNoPlatform
}
