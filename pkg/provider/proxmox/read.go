package proxmox

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// ListVMs implements provider.Provider with one GET /cluster/resources?type=vm.
func (p *Provider) ListVMs(ctx context.Context) ([]provider.VMSummary, error) {
	// The whole listing (VMs, nodes, storages; a few entries more than the
	// VMs alone) also refreshes the placement view, so that placing a new
	// VM does not wait for a listing of its own while the poller runs.
	rs, err := p.api.resources(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("list the VMs of cluster %q: %w", p.cfg.Name, err)
	}
	p.noteListing(rs)
	p.setView(newView(p.clock.Now(), rs))
	vms := make([]resource, 0, len(rs))
	for _, r := range rs {
		if r.Type == "qemu" {
			vms = append(vms, r)
		}
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].VMID < vms[j].VMID })
	out := make([]provider.VMSummary, len(vms))
	for i, r := range vms {
		out[i] = p.summary(r)
	}
	return out, nil
}

func (p *Provider) summary(r resource) provider.VMSummary {
	tags := splitTags(r.Tags)
	s := provider.VMSummary{
		ID: FormatID(r.VMID), Node: r.Node, Name: r.Name, Power: powerState(r.Status, r.Lock), Template: r.Template == 1,
		Lock: r.Lock, Tags: tags, OperatorTagged: p.signer.HasOperatorTag(tags),
		InstallNamed: p.signer.VerifyVMName(r.Name, r.VMID),
	}
	if s.Power == provider.PowerRunning {
		s.Uptime = time.Duration(r.Uptime) * time.Second
	}
	return s
}

// GetVM implements provider.Provider: the config (for the marker) and the
// current status (for power, lock and uptime).
func (p *Provider) GetVM(ctx context.Context, at provider.VMRef) (*provider.VM, error) {
	ref, node, cfg, err := p.resolveConfig(ctx, at, "")
	if err != nil {
		return nil, err
	}
	st, err := p.api.status(ctx, node, ref.VMID)
	if err != nil {
		return nil, fmt.Errorf("read the status of VM %d on node %s: %w", ref.VMID, node, err)
	}
	tags := splitTags(cfg["tags"])
	vm := &provider.VM{VMSummary: provider.VMSummary{
		ID: at.ID, Node: node, Name: cfg["name"], Power: powerState(st.Status, cfg["lock"]), Template: cfg["template"] == "1",
		Lock: cfg["lock"], Tags: tags, OperatorTagged: p.signer.HasOperatorTag(tags),
		InstallNamed: p.signer.VerifyVMName(cfg["name"], ref.VMID),
	}, TPM: cfg.hasTPM2()}
	if vm.Power == provider.PowerRunning {
		vm.Uptime = time.Duration(st.Uptime) * time.Second
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	vm.SetOwnership(marker.Verify(cfg["description"], ref.VMID))
	return vm, nil
}

// SetPower implements provider.Provider: after the ownership check, the
// VM's status and lock decide (powerCallFor) whether one status/<op>
// request is sent: start, stop, shutdown, suspend (todisk) or resume.
func (p *Provider) SetPower(ctx context.Context, owner provider.Owner, at provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	ref, node, err := p.resolveRef(ctx, at)
	if err != nil {
		return nil, err
	}
	if err := checkPowerAction(action); err != nil {
		return nil, err
	}
	cfg, err := p.api.config(ctx, node, ref.VMID)
	if err != nil {
		return nil, fmt.Errorf("read VM %d on node %s: %w", ref.VMID, node, err)
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := p.verifyOwner(marker, cfg, ref.VMID, owner); err != nil {
		return nil, err
	}
	st, err := p.api.status(ctx, node, ref.VMID)
	if err != nil {
		return nil, fmt.Errorf("read the status of VM %d on node %s: %w", ref.VMID, node, err)
	}
	call, err := powerCallFor(action, cfg, st.Status, ref.VMID)
	if err != nil || call.op == "" {
		return nil, err
	}
	upid, err := p.api.upid(ctx, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/status/%s", node, ref.VMID, call.op), nil, call.body)
	if err != nil {
		if refused := powerRefused(call.op, ref.VMID, err); refused != nil {
			return nil, refused
		}
		return nil, fmt.Errorf("%s VM %d on node %s: %w", call.op, ref.VMID, node, err)
	}
	p.log.V(1).Info("Power change requested", "vmid", ref.VMID, "node", node, "action", string(action), "operation", call.op)
	return &provider.Task{ID: upid, Operation: call.op, StartTime: p.clock.Now()}, nil
}

// Probe implements provider.Provider: GET /version, GET /nodes, the
// storages from GET /cluster/resources?type=storage, once, the cluster
// name from GET /cluster/status and, on a cluster whose VMs are isolated,
// the datacenter firewall's options.
func (p *Provider) Probe(ctx context.Context) (*provider.ClusterInfo, error) {
	var v proxmox.Version
	if err := p.api.call(ctx, http.MethodGet, "/version", nil, nil, &v); err != nil {
		return nil, fmt.Errorf("probe cluster %q: %w", p.cfg.Name, err)
	}
	p.noteVersion(v.Version)
	var nodes proxmox.NodeStatuses
	if err := p.api.call(ctx, http.MethodGet, "/nodes", nil, nil, &nodes); err != nil {
		return nil, fmt.Errorf("list the nodes of cluster %q: %w", p.cfg.Name, err)
	}
	stores, err := p.api.resources(ctx, "storage")
	if err != nil {
		return nil, fmt.Errorf("list the storages of cluster %q: %w", p.cfg.Name, err)
	}
	online := map[string]bool{}
	for _, n := range nodes {
		if n != nil && n.Status == "online" {
			online[n.Node] = true
		}
	}
	p.mu.Lock()
	reserved := p.reservedMemoryLocked()
	freeStorage := p.availableStorageLocked(online, stores)
	p.mu.Unlock()
	info := &provider.ClusterInfo{Version: v.Version, InsecureTLS: p.insecure, AvailableStorageBytes: freeStorage}
	for _, n := range nodes {
		if n == nil {
			continue
		}
		ni := provider.NodeInfo{
			Name: n.Node, Online: n.Status == "online", Allowed: p.allowed(n.Node), CPUs: int64(n.MaxCPU),
			MemoryBytes: int64(n.MaxMem), MemoryUsedBytes: int64(n.Mem), ReservedMemoryBytes: reserved[n.Node],
		}
		for _, s := range stores {
			if s.Node == n.Node && s.Shared == 0 {
				ni.StorageBytes += s.MaxDisk
				ni.StorageUsedBytes += s.Disk
			}
		}
		info.Nodes = append(info.Nodes, ni)
	}
	sort.Slice(info.Nodes, func(i, j int) bool { return info.Nodes[i].Name < info.Nodes[j].Name })
	for _, n := range p.cfg.Nodes {
		found := false
		for _, ni := range info.Nodes {
			found = found || ni.Name == n
		}
		if !found {
			return nil, provider.Errorf(provider.ClassConfiguration, "UnknownNode",
				"nodes: cluster %q has no node %q; fix the node list", p.cfg.Name, n)
		}
	}
	// Learn the cluster name ownership blocks are bound to now, so that a
	// missing privilege shows on the HypervisorCluster rather than as VMs
	// that cannot be verified.
	if _, err := p.marker(ctx); err != nil {
		return nil, err
	}
	if info.IsolationProblem, err = p.isolationProblem(ctx); err != nil {
		return nil, err
	}
	return info, nil
}

// versionTTL is how long the cluster's Proxmox VE version is trusted: an
// upgrade from 8 to 9 changes which CPU flags a VM may set.
const versionTTL = 5 * time.Minute

// majorVersion is the cluster's Proxmox VE major version, from GET
// /version (which every authenticated caller may read), cached for
// versionTTL.
func (p *Provider) majorVersion(ctx context.Context) (int, error) {
	p.mu.Lock()
	major, at := p.pveMajor, p.pveMajorAt
	p.mu.Unlock()
	if major != 0 && p.clock.Since(at) < versionTTL {
		return major, nil
	}
	var v proxmox.Version
	if err := p.api.call(ctx, http.MethodGet, "/version", nil, nil, &v); err != nil {
		return 0, fmt.Errorf("read the Proxmox VE version of cluster %q: %w", p.cfg.Name, err)
	}
	p.noteVersion(v.Version)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pveMajor == 0 {
		return 0, fmt.Errorf("cluster %q reports Proxmox VE version %q, which is not <major>.<minor>", p.cfg.Name, v.Version)
	}
	return p.pveMajor, nil
}

// noteVersion keeps the major version of a /version answer ("8.4.14").
func (p *Provider) noteVersion(version string) {
	major, err := strconv.Atoi(strings.SplitN(version, ".", 2)[0])
	if err != nil || major <= 0 {
		return
	}
	p.mu.Lock()
	p.pveMajor, p.pveMajorAt = major, p.clock.Now()
	p.mu.Unlock()
}
