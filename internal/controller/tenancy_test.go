package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// tenantSelector selects the fixtures' namespaces.
var tenantSelector = metav1.LabelSelector{MatchLabels: map[string]string{"hyperfleet.io/tenant": "yes"}}

func waitClusterCondition(t *testing.T, cluster *hfv1.HypervisorCluster, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	var cond *metav1.Condition
	// A bound on a hang, not a speed: under make test's cold compile a
	// cluster's first DNS check once took over a minute to be reported.
	eventually(t, 3*time.Minute, fmt.Sprintf("cluster %s=%s/%s", typ, status, reason), func() error {
		got := &hfv1.HypervisorCluster{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(cluster), got); err != nil {
			return err
		}
		cond = meta.FindStatusCondition(got.Status.Conditions, typ)
		if cond == nil || cond.Status != status || cond.Reason != reason || cond.ObservedGeneration != got.Generation {
			return fmt.Errorf("%s = %+v", typ, cond)
		}
		return nil
	})
	return cond
}

// TestTenancyAllowLists: a template that uses a bridge, VLAN, Proxmox
// template, storage or resource pool that the cluster's spec.tenancy does
// not allow to its namespace is not Ready, says which field and what is
// allowed, and no VM is cloned for a claim of it.
func TestTenancyAllowLists(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = tenantSelector.DeepCopy()
		c.Spec.Tenancy = []hfv1.TenancyRule{{
			NamespaceSelector: *tenantSelector.DeepCopy(),
			Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}, {Name: "debian-12-ci"}},
			Bridges:           []string{"vmbr0", "vmbr1"},
			Storages:          []string{"local-lvm"},
			ResourcePools:     []string{"ci"},
		}}
	})
	cond := waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterTenancyRestrictedCondition), metav1.ConditionTrue, string(hfv1.RestrictedReason))
	t.Logf("TenancyRestricted: %s", cond.Message)
	// The fixture's template uses allowed values only.
	waitTemplate(t, f.template, metav1.ConditionTrue, "")

	variant := func(name string, mutate func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: name}
		tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
		mutate(tmpl)
		f.create(tmpl)
		return tmpl
	}
	cases := []struct {
		name   string
		texts  []string
		mutate func(*hfv1.HypervisorMachineTemplate)
	}{
		{"bridge", []string{"spec.network.bridge vmbr9", "vmbr0, vmbr1"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.Bridge = "vmbr9"
		}},
		{"vlan", []string{"spec.network.vlan 42", "untagged"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.VLAN = ptr.To[int32](42)
		}},
		{"template", []string{"spec.source.proxmox.templateID 9001", "allowed ids: 9000"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = ptr.To[int32](9001)
		}},
		{"template-name", []string{`spec.source.proxmox.templateName "admin-only"`, "allowed names: debian-12-ci"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.TemplateID = nil
			tm.Spec.Source.Proxmox.TemplateName = "admin-only"
		}},
		{"storage", []string{"spec.source.proxmox.storage local", "allowed storages: local-lvm"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.CloneMode = hfv1.CloneModeFull
			tm.Spec.Source.Proxmox.Storage = "local"
		}},
		{"pool", []string{"spec.source.proxmox.pool infra", "allowed resource pools: ci"}, func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Source.Proxmox.Pool = "infra"
		}},
	}
	templates := map[string]*hfv1.HypervisorMachineTemplate{}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := variant(tc.name, tc.mutate)
			templates[tc.name] = tmpl
			got := waitTemplate(t, tmpl, metav1.ConditionFalse, string(hfv1.NotAllowedByClusterReason))
			ready := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition)
			if ready == nil || ready.Status != metav1.ConditionFalse || ready.Reason != string(hfv1.NotAllowedByClusterReason) {
				t.Fatalf("Ready = %+v", ready)
			}
			for _, text := range append(tc.texts, "spec.tenancy") {
				if !strings.Contains(ready.Message, text) {
					t.Errorf("message %q does not mention %q", ready.Message, text)
				}
			}
		})
	}

	// A claim of a refused template waits, and no VM is cloned for it.
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "on-vmbr9"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: templates["bridge"].Name}},
	}
	f.create(claim)
	eventually(t, 30*time.Second, "claim waits for its template", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, string(hfv1.NotAllowedByClusterReason)) {
			return fmt.Errorf("Provisioned = %+v", c)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Fatalf("VM cloned for a template the cluster does not allow: %+v", vms)
	}
}

// TestTenancyNamespaceNotAdmitted: a template is not validated against a
// cluster that does not admit its namespace, and its status then holds
// nothing about the cluster (nodes, template ids and names, storages),
// including what an earlier validation recorded. The cluster warns while
// it admits every namespace or has no allow-lists.
func TestTenancyNamespaceNotAdmitted(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterTenancyRestrictedCondition), metav1.ConditionFalse, string(hfv1.AllNamespacesAdmittedReason))
	valid := waitTemplate(t, f.template, metav1.ConditionTrue, "")
	if valid.Status.ResolvedTemplate == nil || valid.Status.TemplateHash == "" {
		t.Fatalf("the admitted template's status records no resolution: %+v", valid.Status)
	}

	updateCluster := func(mutate func(*hfv1.HypervisorCluster)) {
		t.Helper()
		var cur hfv1.HypervisorCluster
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), &cur); err != nil {
			t.Fatal(err)
		}
		mutate(&cur)
		if err := env.Client.Update(context.Background(), &cur); err != nil {
			t.Fatal(err)
		}
	}
	noLeak := func(got *hfv1.HypervisorMachineTemplate) {
		t.Helper()
		if got.Status.ResolvedTemplate != nil || got.Status.TemplateHash != "" {
			t.Errorf("status keeps cluster details: resolvedTemplate %+v, templateHash %q", got.Status.ResolvedTemplate, got.Status.TemplateHash)
		}
		for _, c := range got.Status.Conditions {
			for _, secret := range []string{"pve1", "9000", "debian-12-ci", "local-lvm", sim.url} {
				if strings.Contains(c.Message, secret) {
					t.Errorf("condition %s leaks %q: %s", c.Type, secret, c.Message)
				}
			}
		}
	}

	// allowedNamespaces that does not select the namespace.
	updateCluster(func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}}
	})
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterTenancyRestrictedCondition), metav1.ConditionFalse, string(hfv1.NoAllowListsReason))
	got := waitTemplate(t, f.template, metav1.ConditionFalse, string(hfv1.NamespaceNotAllowedReason))
	noLeak(got)
	if c := hfv1.FindCondition(got.Status.Conditions, hfv1.ReadyCondition); c == nil || !strings.Contains(c.Message, "does not admit namespace "+f.namespace) {
		t.Errorf("Ready = %+v", c)
	}

	// Admitted by allowedNamespaces, but no tenancy entry selects it.
	updateCluster(func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = tenantSelector.DeepCopy()
		c.Spec.Tenancy = []hfv1.TenancyRule{{
			NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}},
			Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}},
		}}
	})
	waitClusterCondition(t, f.cluster, string(hfv1.HypervisorClusterTenancyRestrictedCondition), metav1.ConditionTrue, string(hfv1.RestrictedReason))
	noLeak(waitTemplate(t, f.template, metav1.ConditionFalse, string(hfv1.NamespaceNotAllowedReason)))

	// Labelling the namespace for the entry admits it again (the namespace
	// watch wakes the template).
	ns := &corev1.Namespace{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: f.namespace}, ns); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(ns.DeepCopy())
	ns.Labels["team"] = "other"
	if err := env.Client.Patch(context.Background(), ns, patch); err != nil {
		t.Fatal(err)
	}
	waitTemplate(t, f.template, metav1.ConditionTrue, "")
}
