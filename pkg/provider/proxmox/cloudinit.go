package proxmox

import (
	"fmt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// isoName is the cloud-init ISO's file name, deterministic from the
// install, the VM id and the claim: deletion finds it without any state,
// two installs sharing a cluster never collide, and a file of that name can
// only hold this claim's own data, so finding it after a restart means the
// upload is done.
func (p *Provider) isoName(vmid int, owner string) string {
	return fmt.Sprintf("hf-%s-%d-%s.iso", p.signer.OperatorID(), vmid, provider.OwnerDigest(owner))
}

// isoVolid is the ISO's volume id on the ISO storage.
func (p *Provider) isoVolid(vmid int, owner string) string {
	return p.isoStorage + ":iso/" + p.isoName(vmid, owner)
}
