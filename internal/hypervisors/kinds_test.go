package hypervisors_test

import (
	"encoding/json"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The kinds of TestProviderSelectionProperty, registered through the
// public mechanism as a binary's main registers its own: the built-in
// proxmox, and stubvisor, a kind only this test has.
func init() {
	provider.Register(hfv1.ProviderProxmox, proxmox.Kind)
	provider.Register(kindStub, stubKind{})
}

// stubRange is the machine numbers of every stubvisor cluster: the kind
// has no section of its own in the API, so it reads nothing but the
// neutral fields.
var stubRange = [2]int{7000, 7999}

// stubKind is a hypervisor kind that exists only in this test, built on
// the in-memory fake (pkg/provider/fake): its clusters hold the fake's
// template ci-template. Its factory is replaced by the test's recording
// ones (kindFactories); what the shared code asks of a kind, it answers.
type stubKind struct{}

// stubSettings is stubvisor's own part of a ClusterConfig.
type stubSettings struct{ Cluster string }

func (stubKind) New(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	return nil, provider.Errorf(provider.ClassConfiguration, "NoStubvisor", "stubvisor %s: built by the test's factories only", cfg.Name)
}

func (stubKind) ReadCluster(c *hfv1.HypervisorCluster, cfg *provider.ClusterConfig) error {
	cfg.VMIDStart, cfg.VMIDEnd = stubRange[0], stubRange[1]
	cfg.Settings = stubSettings{Cluster: c.Name}
	return nil
}

func (stubKind) MovedFields(*hfv1.HypervisorCluster) []provider.MovedField { return nil }
func (stubKind) ReadsTemplate(*hfv1.HypervisorMachineTemplate) bool        { return false }
func (stubKind) NativeCloudInit(*hfv1.HypervisorMachineTemplate) *provider.NativeCloudInit {
	return nil
}
func (stubKind) ReadSource(*hfv1.HypervisorMachineTemplate) provider.TemplateSource {
	return provider.TemplateSource{Linked: true, Settings: fake.TemplateRef{Name: fake.DefaultOptions().Templates[0].Name}}
}
func (stubKind) HashInput(*hfv1.HypervisorMachineTemplate) (json.RawMessage, json.RawMessage, error) {
	return json.RawMessage(`"ci-template"`), nil, nil
}
func (stubKind) TenancyViolations(*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster, *hfv1.TenancyRule) []string {
	return nil
}
func (stubKind) DescribeTemplate(info *provider.TemplateInfo) string { return info.Name }
func (stubKind) Advice(topic provider.AdviceTopic, _ *provider.TemplateInfo) string {
	return "stubvisor cannot fix " + string(topic)
}
func (stubKind) ResolvedTemplate(info *provider.TemplateInfo) hfv1.ResolvedTemplate {
	return hfv1.ResolvedTemplate{Node: info.Node}
}
