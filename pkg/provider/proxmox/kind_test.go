package proxmox

import (
	"reflect"
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestKindReadsItsSource: source.proxmox becomes a TemplateRef in the
// source's Settings, which a placement record holds and rebuilds whole;
// a template without source.proxmox is not Proxmox's.
func TestKindReadsItsSource(t *testing.T) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if Kind.ReadsTemplate(tmpl) {
		t.Fatal("a template without source.proxmox is read as Proxmox's")
	}
	tmpl.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateID: ptr(int32(9000)), CloneMode: hfv1.CloneModeFull, Storage: "ceph", Format: "qcow2", Pool: "ci"}
	src := Kind.ReadSource(tmpl)
	want := TemplateRef{ID: 9000, Storage: "ceph", Format: "qcow2", ResourcePool: "ci"}
	if !Kind.ReadsTemplate(tmpl) || src.Linked || !reflect.DeepEqual(src.Settings, want) {
		t.Fatalf("ReadSource = %+v, want a full clone of %+v", src, want)
	}
	if back := provider.SourceFromRecord(TemplateRef{}, provider.RecordSource(src)); !reflect.DeepEqual(back, want) {
		t.Fatalf("the placement record rebuilds %+v, want %+v", back, want)
	}
	// A selector: its tags lower-cased, sorted, once each, and its
	// record's template reference names them.
	tmpl.Spec.Source.Proxmox = hfv1.ProxmoxSource{TemplateSelector: &hfv1.TemplateSelector{MatchTags: []string{"Debian12", "ci", "CI"}}, CloneMode: hfv1.CloneModeLinked}
	src = Kind.ReadSource(tmpl)
	want = TemplateRef{Selector: "ci,debian12"}
	if !Kind.ReadsTemplate(tmpl) || !src.Linked || !reflect.DeepEqual(src.Settings, want) {
		t.Fatalf("ReadSource = %+v, want a linked clone of %+v", src, want)
	}
	rec := provider.RecordSource(src)
	if ref := rec.TemplateRef(); ref != "tags:ci,debian12" {
		t.Fatalf("template reference %q, want tags:ci,debian12", ref)
	}
	back, err := provider.SourceRecord{}.WithTemplateRef(rec.TemplateRef())
	if err != nil || !reflect.DeepEqual(provider.SourceFromRecord(TemplateRef{}, back), want) {
		t.Fatalf("the placement record rebuilds %+v (%v), want %+v", back, err, want)
	}
}

// TestClusterSettings: a configuration without settings gets the default
// ISO storage; settings of another kind are refused, naming spec.provider.
func TestClusterSettings(t *testing.T) {
	if s, err := clusterSettings(provider.ClusterConfig{}); err != nil || s.ISOStorage != hfv1.DefaultISOStorage {
		t.Fatalf("clusterSettings(none) = %+v, %v; want ISO storage %s", s, err, hfv1.DefaultISOStorage)
	}
	if s, err := clusterSettings(provider.ClusterConfig{Settings: &ClusterSettings{ISOStorage: "isos"}}); err != nil || s.ISOStorage != "isos" {
		t.Fatalf("clusterSettings(isos) = %+v, %v", s, err)
	}
	if _, err := clusterSettings(provider.ClusterConfig{Settings: "libvirt's"}); err == nil || !strings.Contains(err.Error(), "spec.provider") {
		t.Fatalf("clusterSettings(another kind's) = %v, want a refusal naming spec.provider", err)
	}
}
