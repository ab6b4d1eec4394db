package controller_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

// kindTestvisor is a hypervisor kind only this test binary has.
const kindTestvisor hfv1.HypervisorProvider = "testvisor"

// Registered through the public mechanism, as a binary's main registers
// the kinds it ships: nothing else in the operator names it.
func init() { provider.Register(kindTestvisor, testvisor{}) }

// testvisorMachines is the block every testvisor cluster numbers its VMs
// from: the kind has no section of its own in the API to read one from.
var testvisorMachines = [2]int{3000, 3999}

// testvisor is a hypervisor kind built on the in-memory fake
// (pkg/provider/fake): each cluster holds the fake's one template,
// ci-template, which every template on it is cloned from.
type testvisor struct{}

// testvisorSettings is testvisor's own part of a ClusterConfig: where its
// world's hypervisor is (lifeHypervisors).
type testvisorSettings struct{ Endpoint string }

func (testvisor) New(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	s, ok := cfg.Settings.(testvisorSettings)
	if !ok {
		return nil, fmt.Errorf("testvisor %s: settings %T are not testvisor's", cfg.Name, cfg.Settings)
	}
	hv, ok := lifeHypervisors.Load(s.Endpoint)
	if !ok {
		return nil, provider.Errorf(provider.ClassConfiguration, "NoHypervisor", "testvisor %s: no hypervisor at %s", cfg.Name, s.Endpoint)
	}
	return hv.(*fakeprovider.Cluster).NewProvider(cfg, deps)
}

func (testvisor) ReadCluster(c *hfv1.HypervisorCluster, cfg *provider.ClusterConfig) error {
	cfg.VMIDStart, cfg.VMIDEnd = testvisorMachines[0], testvisorMachines[1]
	cfg.Settings = testvisorSettings{Endpoint: c.Spec.Endpoint}
	return nil
}

func (testvisor) MovedFields(*hfv1.HypervisorCluster) []provider.MovedField { return nil }

// ReadsTemplate: every template on a testvisor cluster is cloned from
// ci-template (ReadSource), whatever its source section says.
func (testvisor) ReadsTemplate(*hfv1.HypervisorMachineTemplate) bool { return true }

func (testvisor) ReadSource(*hfv1.HypervisorMachineTemplate) provider.TemplateSource {
	return provider.TemplateSource{Linked: true, Settings: fakeprovider.TemplateRef{Name: fakeprovider.DefaultOptions().Templates[0].Name}}
}

func (testvisor) NativeCloudInit(*hfv1.HypervisorMachineTemplate) *provider.NativeCloudInit {
	return nil
}

func (testvisor) HashInput(*hfv1.HypervisorMachineTemplate) (source, native json.RawMessage, err error) {
	return json.RawMessage(`"ci-template"`), nil, nil
}

func (testvisor) TenancyViolations(*hfv1.HypervisorMachineTemplate, *hfv1.HypervisorCluster, *hfv1.TenancyRule) []string {
	return nil
}

func (testvisor) DescribeTemplate(info *provider.TemplateInfo) string { return info.Name }

func (testvisor) Advice(topic provider.AdviceTopic, _ *provider.TemplateInfo) string {
	return "testvisor has no advice on " + string(topic)
}

func (testvisor) ResolvedTemplate(info *provider.TemplateInfo) hfv1.ResolvedTemplate {
	return hfv1.ResolvedTemplate{Node: info.Node}
}

// TestRegisteredKindRunsAClaim: a cluster names testvisor, a kind only
// this test registers (provider.Register, backed by the in-memory fake);
// the operator's reconcilers, wired as the manager wires them (the
// registered kinds' factories), connect it, validate a template on it and
// provision a claim: its VM runs (Provisioned True, the credential placed
// in it), numbered from the kind's own block, with no shared code naming
// the kind.
func TestRegisteredKindRunsAClaim(t *testing.T) {
	w := newLifeWorld(t, t, lifeOptions{kind: kindTestvisor})
	w.createTemplate(w.template("tv"))
	claim := w.newClaim("runner-1", "tv")
	w.runUntil("claim "+claim.Name+" provisioned on a running VM", func() error {
		got := w.get(claim)
		vms := w.vmsOf(claim.UID)
		if got == nil || !hfv1.IsConditionTrue(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition) || len(vms) != 1 || vms[0].Power != provider.PowerRunning {
			return w.pending(fmt.Sprintf("VMs %+v", vms), got)
		}
		return nil
	})
	vm := w.vmsOf(claim.UID)[0]
	if vm.VMID < testvisorMachines[0] || vm.VMID > testvisorMachines[1] {
		t.Errorf("the claim's VM is number %d, outside testvisor's block %v", vm.VMID, testvisorMachines)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := w.kube.Get(w.ctx, client.ObjectKeyFromObject(w.template("tv")), tmpl); err != nil {
		t.Fatal(err)
	}
	if r := tmpl.Status.ResolvedTemplate; r == nil || r.Node == "" || r.VMID != 0 {
		t.Errorf("the template's status.resolvedTemplate is %+v, want testvisor's (a node, no Proxmox VM id)", r)
	}
}
