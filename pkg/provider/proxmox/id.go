package proxmox

import (
	"context"
	"fmt"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// ids is the scheme of the provider.IDs this provider writes.
var ids = provider.IntIDs{Prefix: "proxmox://", Hypervisor: "Proxmox"}

// FormatID is the provider.ID of the VM with Proxmox id vmid:
// "proxmox://<vmid>". The node is not part of it: a Proxmox VM id is
// unique in its cluster and a VM keeps it when it migrates, so the ID
// names the VM wherever it runs (provider.Progress carries the node as a
// hint).
func FormatID(vmid int) provider.ID { return ids.Format(vmid) }

// ParseID returns the Proxmox VM id of id, or an error (ClassPermanent,
// reason InvalidVMID) when id is not one FormatID writes.
func ParseID(id provider.ID) (int, error) { return ids.Parse(id) }

// progress is provider.Progress with the VM id parsed: what the
// provider's steps work on.
type progress struct {
	VMID     int
	Node     string
	Building bool
	Task     *provider.Task
}

// progressOf parses the caller's Progress; a Progress without an ID has
// VMID zero.
func progressOf(p provider.Progress) (progress, error) {
	out := progress{Node: p.Node, Building: p.Building, Task: p.Task}
	if p.ID == "" {
		return out, nil
	}
	vmid, err := ParseID(p.ID)
	if err != nil {
		return progress{}, fmt.Errorf("progress: %w", err)
	}
	out.VMID = vmid
	return out, nil
}

// public is the Progress the caller persists.
func (p progress) public() provider.Progress {
	out := provider.Progress{Node: p.Node, Building: p.Building, Task: p.Task}
	if p.VMID != 0 {
		out.ID = FormatID(p.VMID)
	}
	return out
}

// vmRef is provider.VMRef with the VM id parsed.
type vmRef struct {
	VMID int
	Node string
}

// refOf parses the caller's VMRef.
func refOf(r provider.VMRef) (vmRef, error) {
	vmid, err := ParseID(r.ID)
	if err != nil {
		return vmRef{}, err
	}
	return vmRef{VMID: vmid, Node: r.Node}, nil
}

// nodeOf is the node ref's VM is on: the ref's own, else where the cluster
// finds the VM id now (a ref may name no node).
func (p *Provider) nodeOf(ctx context.Context, ref vmRef) (string, error) {
	if ref.Node != "" {
		return ref.Node, nil
	}
	return p.locate(ctx, ref.VMID)
}

// resolveRef parses at and finds the node its VM is on (nodeOf).
func (p *Provider) resolveRef(ctx context.Context, at provider.VMRef) (vmRef, string, error) {
	ref, err := refOf(at)
	if err != nil {
		return vmRef{}, "", err
	}
	node, err := p.nodeOf(ctx, ref)
	return ref, node, err
}

// resolveConfig resolves at (resolveRef) and reads its VM's config; why,
// when not empty, says in the error what the config was read for.
func (p *Provider) resolveConfig(ctx context.Context, at provider.VMRef, why string) (vmRef, string, vmConfig, error) {
	ref, node, err := p.resolveRef(ctx, at)
	if err != nil {
		return vmRef{}, "", nil, err
	}
	cfg, err := p.api.config(ctx, node, ref.VMID)
	if err != nil {
		if why != "" {
			why = " " + why
		}
		return vmRef{}, "", nil, fmt.Errorf("read VM %d on node %s%s: %w", ref.VMID, node, why, err)
	}
	return ref, node, cfg, nil
}

// CheckRef implements provider.Provider: ref must be a Proxmox VM id in
// the cluster's vmidRange, on a node placement may use (or no node).
func (p *Provider) CheckRef(at provider.VMRef) error {
	ref, err := refOf(at)
	if err != nil {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "%w", err)
	}
	if ref.VMID < p.cfg.VMIDStart || ref.VMID > p.cfg.VMIDEnd {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "VM id %d is outside the cluster's vmidRange %d-%d", ref.VMID, p.cfg.VMIDStart, p.cfg.VMIDEnd)
	}
	if ref.Node != "" && !p.allowed(ref.Node) {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "node %s is not in the cluster's nodes %v", ref.Node, p.cfg.Nodes)
	}
	return nil
}
