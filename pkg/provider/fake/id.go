package fake

import (
	"slices"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// ids is the scheme of the provider.IDs the fake writes. It differs from
// every real provider's on purpose: a caller that parses IDs instead of
// passing them through breaks on the fake.
var ids = provider.IntIDs{Prefix: "fake://", Hypervisor: "fake provider"}

// FormatID is the provider.ID of the fake VM with id vmid.
func FormatID(vmid int) provider.ID { return ids.Format(vmid) }

// ParseID returns the fake VM id of id; the empty ID is zero. Anything
// else the fake did not write is ClassPermanent.
func ParseID(id provider.ID) (int, error) { return ids.ParseOptional(id) }

// CheckRef implements provider.Provider.
func (p *Provider) CheckRef(ref provider.VMRef) error {
	if err := ids.CheckInRange(ref.ID, p.cfg.VMIDStart, p.cfg.VMIDEnd); err != nil {
		return err
	}
	if ref.Node != "" && len(p.cfg.Nodes) > 0 && !slices.Contains(p.cfg.Nodes, ref.Node) {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "node %s is not in the cluster's nodes %v", ref.Node, p.cfg.Nodes)
	}
	return nil
}
