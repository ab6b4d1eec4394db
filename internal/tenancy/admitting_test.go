package tenancy

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestAdmittingRule: the rule whose limits bound a namespace is the first
// that selects it and allows the template, as Violations passes it.
func TestAdmittingRule(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"team": "a"}}},
	).Build()
	tmpl := &hfv1.HypervisorMachineTemplate{Spec: hfv1.HypervisorMachineTemplateSpec{
		Source: hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneModeLinked}},
	}}
	rule := func(team string, id int32) hfv1.TenancyRule {
		return hfv1.TenancyRule{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": team}},
			Templates: []hfv1.AllowedTemplate{{ID: ptr.To(id)}}}
	}
	for _, tc := range []struct {
		name  string
		rules []hfv1.TenancyRule
		want  int
	}{
		{"no rules", nil, -1},
		{"the first selecting rule allowing it", []hfv1.TenancyRule{rule("b", 9000), rule("a", 9001), rule("a", 9000), rule("a", 9000)}, 2},
		{"no rule allows it", []hfv1.TenancyRule{rule("a", 9001)}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox, Tenancy: tc.rules}}
			got, err := AdmittingRule(context.Background(), c, cluster, "team-a", tmpl, nil)
			if err != nil || got != tc.want {
				t.Fatalf("AdmittingRule = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
