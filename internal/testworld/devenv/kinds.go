package devenv

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The world's hypervisor is Proxmox VE's simulator: its operator, run in
// this process, needs the kind registered as the operator binary's main
// registers it (registering it again there changes nothing).
func init() { provider.Register(hfv1.ProviderProxmox, proxmox.Kind) }
