package provider_test

import (
	"encoding/json"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// sectionKind is a kind whose template section is a template name with
// its prefix: it reads the templates named so.
type sectionKind struct{ prefix string }

func (sectionKind) New(provider.ClusterConfig, provider.Deps) (provider.Provider, error) {
	return nil, nil
}
func (sectionKind) ReadCluster(*hfv1.HypervisorCluster, *provider.ClusterConfig) error { return nil }
func (sectionKind) MovedFields(*hfv1.HypervisorCluster) []provider.MovedField          { return nil }
func (k sectionKind) ReadsTemplate(t *hfv1.HypervisorMachineTemplate) bool {
	return len(t.Spec.Source.Proxmox.TemplateName) > len(k.prefix) && t.Spec.Source.Proxmox.TemplateName[:len(k.prefix)] == k.prefix
}
func (sectionKind) ReadSource(*hfv1.HypervisorMachineTemplate) provider.TemplateSource {
	return provider.TemplateSource{}
}
func (sectionKind) NativeCloudInit(*hfv1.HypervisorMachineTemplate) *provider.NativeCloudInit {
	return nil
}
func (sectionKind) HashInput(*hfv1.HypervisorMachineTemplate) (json.RawMessage, json.RawMessage, error) {
	return nil, nil, nil
}
func (sectionKind) TenancyViolations(*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster, *hfv1.TenancyRule) []string {
	return nil
}
func (sectionKind) DescribeTemplate(*provider.TemplateInfo) string             { return "" }
func (sectionKind) Advice(provider.AdviceTopic, *provider.TemplateInfo) string { return "" }
func (sectionKind) ResolvedTemplate(*provider.TemplateInfo) hfv1.ResolvedTemplate {
	return hfv1.ResolvedTemplate{}
}

// TestTemplateKind: a template's kind is its cluster's registered kind,
// whatever section the template sets; on a cluster that names no
// registered kind, the first registered kind, by name, that reads the
// template's section; none when no kind reads it. Registering the very
// same kind again changes nothing; Factories are the kinds'.
func TestTemplateKind(t *testing.T) {
	a, b := sectionKind{"a-"}, sectionKind{"b-"}
	provider.Register("test-a", a)
	provider.Register("test-b", b)
	provider.Register("test-a", a)
	tmpl := func(name string) *hfv1.HypervisorMachineTemplate {
		t := &hfv1.HypervisorMachineTemplate{}
		t.Spec.Source.Proxmox.TemplateName = name
		return t
	}
	cluster := func(kind hfv1.HypervisorProvider) *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: kind}}
	}
	for _, tc := range []struct {
		name    string
		tmpl    string
		cluster hfv1.HypervisorProvider
		want    provider.Kind
	}{
		{"the cluster's kind", "b-debian", "test-a", a},
		{"the cluster's kind, for a template no kind reads", "debian", "test-b", b},
		{"a cluster of no registered kind: the kind reading the section", "b-debian", "", b},
		{"a cluster of no registered kind, a section no kind reads", "debian", "vsphere", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := provider.TemplateKind(tmpl(tc.tmpl), cluster(tc.cluster))
			if ok != (tc.want != nil) || got != tc.want {
				t.Fatalf("TemplateKind = %v, %v; want %v", got, ok, tc.want)
			}
		})
	}
	if f := provider.Factories(provider.Registered()); f["test-a"] != provider.Factory(a) || f["test-b"] != provider.Factory(b) {
		t.Fatalf("Factories = %v, want the kinds themselves", f)
	}
}
