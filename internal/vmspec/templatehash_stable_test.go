package vmspec

import (
	"testing"

	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestTemplateHashIsStable: the drift hash of a template is what earlier
// versions computed for it (the value below), so that an upgrade does not
// see every claim's VM as stale and replace it. The source is hashed as
// earlier versions encoded it, templateId included (hashedSource): the
// API's respelling of that field to templateID changes no hash.
func TestTemplateHashIsStable(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	for _, tc := range []struct {
		name string
		src  hfv1.ProxmoxSource
		want string
	}{
		{"by id", hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000), CloneMode: hfv1.CloneMode("linked")}, "ddd33dc7c41e9b993947e45d89e3ac5a42a7b47d96ebfdb217334cce159edab2"},
		{"by name, full clone", hfv1.ProxmoxSource{TemplateName: "debian-12-ci", CloneMode: hfv1.CloneMode("full"), Storage: "ceph"}, "effe07bb661e7f9b97dae46c65d6e32306e1ab9b606f2e5cc9c19d988a73e51d"},
	} {
		tm := &hfv1.HypervisorMachineTemplate{}
		tm.Spec.Source.Proxmox = tc.src
		tm.Spec.Resources = hfv1.MachineResources{CPU: 2}
		got, err := TemplateHash(ws, tm, proxmoxCluster(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s: TemplateHash = %s, want %s", tc.name, got, tc.want)
		}
	}
}
