package vmspec

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The tests' templates and clusters are Proxmox VE's, whose own sections
// its kind reads: registered as the operator binary's main registers it.
func init() { provider.Register(hfv1.ProviderProxmox, proxmox.Kind) }

// proxmoxCluster is a cluster of the registered kind, whose sections of
// the tests' templates (source.proxmox, cloudInit.proxmox) its kind reads.
func proxmoxCluster() *hfv1.HypervisorCluster {
	return &hfv1.HypervisorCluster{Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}}
}
