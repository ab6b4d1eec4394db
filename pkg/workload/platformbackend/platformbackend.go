// Package platformbackend is the part of a CI platform's workload.Backend
// that every platform has alike: the dependencies its providers are built
// with, the CI platform API metrics it registers (pkg/workload/workloadmetrics),
// its name and template section, and the cache that keeps its providers
// while a template's configuration stays the same. A platform's back-end
// embeds a Base and adds what is its own: reading its sections of the API,
// its webhooks and how it builds a provider.
package platformbackend

import (
	"fmt"
	"strings"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadmetrics"
)

// Identity says which platform a Base serves.
type Identity struct {
	// Name is workload.Backend.Name, such as the platform's brand name.
	Name string
	// TemplateField is workload.Backend.TemplateField, the template's
	// section for the platform.
	TemplateField string
	// Webhooks is workload.WebhookReceiver.WebhookFormat, what the
	// platform's webhook deliveries look like.
	Webhooks workload.WebhookFormat
}

// Base is embedded by a platform's back-end. Build it with New; the zero
// value serves only the methods that use no dependency.
type Base[P workload.Provider] struct {
	// Dependencies are the ones the back-end was built with.
	workload.Dependencies

	id        Identity
	providers *workload.ProviderCache[P]
}

// New is the Base of a platform's workload.Factory: it registers the CI
// platform API metrics with deps.Metrics.
func New[P workload.Provider](deps workload.Dependencies, id Identity) (Base[P], error) {
	if err := workloadmetrics.Register(deps.Metrics); err != nil {
		return Base[P]{}, fmt.Errorf("%s: register metrics: %w", strings.ToLower(id.Name), err)
	}
	return Base[P]{Dependencies: deps, id: id, providers: new(workload.ProviderCache[P])}, nil
}

// Factory is the workload.Factory of a platform whose back-end B embeds
// its Base and adds the platform's own methods: it builds the Base (New)
// and puts it in a new B.
func Factory[P workload.Provider, B any, PB interface {
	*B
	workload.Backend
	setBase(Base[P])
}](id Identity) workload.Factory {
	return func(deps workload.Dependencies) (workload.Backend, error) {
		base, err := New[P](deps, id)
		if err != nil {
			return nil, err
		}
		b := PB(new(B))
		b.setBase(base)
		return b, nil
	}
}

// setBase is how Factory fills the Base a back-end embeds.
func (b *Base[P]) setBase(base Base[P]) { *b = base }

// Name implements workload.Backend.
func (b Base[P]) Name() string { return b.id.Name }

// TemplateField implements workload.Backend.
func (b Base[P]) TemplateField() string { return b.id.TemplateField }

// WebhookFormat implements workload.WebhookReceiver.
func (b Base[P]) WebhookFormat() workload.WebhookFormat { return b.id.Webhooks }

// ErrNoSection is the error of a provider asked for with a template that
// has no section for the platform.
func (b Base[P]) ErrNoSection(tmpl *hfv1.HypervisorMachineTemplate) error {
	return fmt.Errorf("HypervisorMachineTemplate %s has no %s", tmpl.Name, b.id.TemplateField)
}

// HTTPTimeout is the template's spec.bootstrap.httpTimeout; zero when it
// sets none (the provider's default).
func HTTPTimeout(tmpl *hfv1.HypervisorMachineTemplate) time.Duration {
	if t := tmpl.Spec.Bootstrap.HTTPTimeout; t != nil {
		return t.Duration
	}
	return 0
}

// CachedProvider is the provider of tmpl's scope built from the
// configuration whose fingerprint is fp (see workload.ProviderCache), built
// with build when there is none or the configuration changed. build fails
// only on the template's settings, so its error is a configuration error
// whose reason is the platform's name and CredentialsInvalid (such as
// GitHubCredentialsInvalid).
func (b Base[P]) CachedProvider(tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope, fp string, build func() (P, error)) (workload.Provider, error) {
	p, err := b.providers.Get(tmpl, scope, fp, build)
	if err != nil {
		return nil, errclass.Errorf(errclass.ClassConfiguration, b.Name()+"CredentialsInvalid", "%s of HypervisorMachineTemplate %s: %w", b.id.TemplateField, tmpl.Name, err)
	}
	return p, nil
}
