package devenv

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/libvirt"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The world's hypervisor is Proxmox VE's simulator, or a libvirt host
// with Options.Libvirt: its operator, run in this process, needs the
// kinds registered as the operator binary's main registers them
// (registering them again there changes nothing).
func init() {
	provider.Register(hfv1.ProviderProxmox, proxmox.Kind)
	provider.Register(hfv1.ProviderLibvirt, libvirt.Kind)
}
