package tenancy

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
)

// The tests' templates and clusters are Proxmox VE's, whose own sections
// its kind reads: registered as the operator binary's main registers it.
func init() { provider.Register(hfv1.ProviderProxmox, proxmox.Kind) }
