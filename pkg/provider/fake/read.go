package fake

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Probe implements provider.Provider.
func (p *Provider) Probe(ctx context.Context) (*provider.ClusterInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	s := p.session(MethodProbe)
	if err := s.injected(); err != nil {
		return nil, err
	}
	version, err := s.version()
	if err != nil {
		return nil, classify(err, "read the version of cluster %q", p.cfg.Name)
	}
	nodes, err := s.nodes()
	if err != nil {
		return nil, classify(err, "list nodes of cluster %q", p.cfg.Name)
	}
	info := &provider.ClusterInfo{Version: version, InsecureTLS: p.cfg.InsecureSkipVerify}
	p.mu.Lock()
	p.expireLocked()
	for _, n := range nodes {
		info.Nodes = append(info.Nodes, provider.NodeInfo{
			Name: n.name, Online: n.online, Allowed: p.allowed(n.name), CPUs: n.cpus,
			MemoryBytes: n.mem, MemoryUsedBytes: n.memUsed, ReservedMemoryBytes: p.reservedLocked(n.name),
			StorageBytes: n.disk, StorageUsedBytes: n.diskUsed,
		})
	}
	p.mu.Unlock()
	return info, nil
}

// ValidateTemplate implements provider.Provider.
func (p *Provider) ValidateTemplate(ctx context.Context, source provider.TemplateSource) (*provider.TemplateInfo, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("validate template: %w", err)
	}
	s := p.session(MethodValidateTemplate)
	if err := s.injected(); err != nil {
		return nil, err
	}
	t, err := p.findTemplate(s, source, true)
	if err != nil {
		return nil, err
	}
	info := &provider.TemplateInfo{
		ID: t.vmid, Name: t.name, Node: t.node, Storages: []string{t.storage}, DiskBytes: t.disk, LinkedCloneSupported: t.linkedOK,
	}
	if source.Linked && !t.linkedOK {
		return nil, provider.Errorf(provider.ClassConfiguration, "LinkedCloneUnsupported",
			"template %d lies on storage %q, which cannot make linked clones; use a full clone", t.vmid, t.storage)
	}
	if !source.Linked {
		if ts := p.targetStorage(source); ts != "" && ts != t.storage {
			st, err := s.storageStatus(t.node, ts)
			switch {
			case isNotExist(err):
				return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound",
					"full-clone target storage %q does not exist on node %s; name an existing storage", ts, t.node)
			case err != nil:
				return nil, classify(err, "read storage %q", ts)
			case !slices.Contains(st.content, "images"):
				return nil, provider.Errorf(provider.ClassConfiguration, "StorageNoImages",
					"full-clone target storage %q does not hold VM images; name a storage with content images", ts)
			}
		}
		switch source.Format {
		case "", "raw", "qcow2", "vmdk":
		default:
			return nil, provider.Errorf(provider.ClassConfiguration, "InvalidFormat", "disk format %q is none of raw, qcow2, vmdk", source.Format)
		}
	}
	if source.ResourcePool != "" {
		pools, err := s.pools()
		if err != nil {
			return nil, classify(err, "list resource pools")
		}
		if !slices.Contains(pools, source.ResourcePool) {
			return nil, provider.Errorf(provider.ClassConfiguration, "PoolNotFound", "resource pool %q does not exist; create it or name another", source.ResourcePool)
		}
	}
	return info, nil
}

// ListVMs implements provider.Provider.
func (p *Provider) ListVMs(ctx context.Context) ([]provider.VMSummary, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list VMs: %w", err)
	}
	s := p.session(MethodListVMs)
	if err := s.injected(); err != nil {
		return nil, err
	}
	list, err := s.resources()
	if err != nil {
		return nil, classify(err, "list VMs of cluster %q", p.cfg.Name)
	}
	out := make([]provider.VMSummary, 0, len(list))
	for _, r := range list {
		out = append(out, provider.VMSummary{
			VMID: r.vmid, Node: r.node, Name: r.name, Power: provider.PowerState(r.status), Template: r.template,
			Lock: r.lock, Tags: r.tags, OperatorTagged: p.signer.HasOperatorTag(r.tags), Uptime: r.uptime,
			InstallNamed: p.signer.VerifyVMName(r.name, r.vmid),
		})
	}
	return out, nil
}

// GetVM implements provider.Provider.
func (p *Provider) GetVM(ctx context.Context, ref provider.VMRef) (*provider.VM, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("get VM: %w", err)
	}
	s := p.session(MethodGetVM)
	if err := s.injected(); err != nil {
		return nil, err
	}
	node, conf, err := p.locate(s, ref)
	if errors.Is(err, errNoVM) {
		return nil, provider.Errorf(provider.ClassPermanent, "NotFound", "VM %d does not exist on cluster %q: %w", ref.VMID, p.cfg.Name, provider.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	st, err := s.status(node, ref.VMID)
	if isVMMissing(err) {
		return nil, provider.Errorf(provider.ClassPermanent, "NotFound", "VM %d vanished from cluster %q: %w", ref.VMID, p.cfg.Name, provider.ErrNotFound)
	}
	if err != nil {
		return nil, classify(err, "read the status of VM %d", ref.VMID)
	}
	vm := &provider.VM{VMSummary: provider.VMSummary{
		VMID: ref.VMID, Node: node, Name: conf.name, Power: provider.PowerStopped, Template: conf.template,
		Lock: conf.lock, Tags: conf.tags, OperatorTagged: p.signer.HasOperatorTag(conf.tags), Uptime: st.uptime,
		InstallNamed: p.signer.VerifyVMName(conf.name, ref.VMID),
	}}
	if st.running {
		vm.Power = provider.PowerRunning
	}
	rec, err := p.signer.Verify(conf.description, ref.VMID)
	if err != nil {
		vm.OwnershipError = err
		return vm, nil //nolint:nilerr // a bad ownership record is part of the VM read (OwnershipError), not a failure to read it
	}
	vm.Owner = &provider.Owner{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID, Pool: rec.Pool, CreatedAt: rec.CreatedAt}
	vm.CreatedAt = rec.CreatedAt
	return vm, nil
}
