package vmspec

import (
	"strings"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestCheckSource: a template is refused when it does not set its
// cluster's kind's source section, naming the section to set; a cluster
// of a kind this build does not register is left to UnknownProvider.
func TestCheckSource(t *testing.T) {
	proxmox := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}}
	proxmox.Name = "pve"
	onProxmox := &hfv1.HypervisorMachineTemplate{}
	onProxmox.Spec.Source.Proxmox.TemplateName = "debian"
	onLibvirt := &hfv1.HypervisorMachineTemplate{}
	onLibvirt.Spec.Source.Libvirt = &hfv1.LibvirtSource{Domain: "debian"}
	if err := CheckSource(onProxmox, proxmox); err != nil {
		t.Fatalf("a proxmox template on a proxmox cluster: %v", err)
	}
	if err := CheckSource(onLibvirt, proxmox); err == nil || !strings.Contains(err.Error(), "sets no spec.source.proxmox") {
		t.Fatalf("a libvirt template on a proxmox cluster: %v, want a refusal naming spec.source.proxmox", err)
	}
	unknown := &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: "vsphere"}}
	if err := CheckSource(onLibvirt, unknown); err != nil {
		t.Fatalf("a cluster of an unregistered kind: %v", err)
	}
}
