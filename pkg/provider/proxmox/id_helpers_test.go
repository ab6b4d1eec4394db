package proxmox

import "github.com/hyperfleet/hyperfleet/pkg/provider"

// mustVMID is the Proxmox VM id of an ID the provider wrote; it panics on
// anything else, which no test passes on purpose.
func mustVMID(id provider.ID) int {
	vmid, err := ParseID(id)
	if err != nil {
		panic(err)
	}
	return vmid
}
