package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Probe implements provider.Provider: every configured host as a node,
// offline when it does not answer before ctx ends, and the version of the
// first host that does.
func (p *Provider) Probe(ctx context.Context) (*provider.ClusterInfo, error) {
	info := &provider.ClusterInfo{InsecureTLS: p.cfg.InsecureSkipVerify}
	var last error
	// counted are the storages whose free space is in the total: a pool
	// shared by hosts (an NFS export each defines) is counted once.
	counted := map[string]bool{}
	probed := p.probeHosts(ctx)
	for i, h := range p.hosts {
		n, storage, version, err := probed[i].node, probed[i].storage, probed[i].version, probed[i].err
		if err != nil {
			last = err
			p.log.V(1).Info("Host offline", "host", h.Name, "error", err.Error())
		}
		if info.Version == "" {
			info.Version = version
		}
		if n.Online && n.Allowed && p.cfg.Isolated && info.IsolationProblem == "" {
			info.IsolationProblem = p.isolationProblem(h)
		}
		if n.Online && n.Allowed && !counted[storage] {
			counted[storage] = true
			info.AvailableStorageBytes += n.StorageBytes - n.StorageUsedBytes
		}
		info.Nodes = append(info.Nodes, n)
	}
	if info.Version == "" {
		return nil, fmt.Errorf("no libvirt host of cluster %q answers: %w", p.cfg.Name, last)
	}
	return info, nil
}

// hostProbe is what probing one host found (probeHost).
type hostProbe struct {
	node             provider.NodeInfo
	storage, version string
	err              error
}

// probeHosts probes every host at once, each for as long as ctx allows
// (the HypervisorCluster's spec.probeTimeout). go-libvirt takes no
// context: a host that has not answered when ctx ends is reported offline
// at once, while its calls run on in the background until the
// connection's watchdog (watchdog.go) closes it at the request timeout.
func (p *Provider) probeHosts(ctx context.Context) []hostProbe {
	out := make([]hostProbe, len(p.hosts))
	results := make([]hostProbe, len(p.hosts))
	done := make(chan int, len(p.hosts))
	for i, h := range p.hosts {
		go func() {
			n, storage, version, err := p.probeHost(h)
			results[i] = hostProbe{node: n, storage: storage, version: version, err: err}
			done <- i
		}()
	}
	answered := make([]bool, len(p.hosts))
	for range p.hosts {
		select {
		case i := <-done:
			out[i], answered[i] = results[i], true
		case <-ctx.Done():
			for i, h := range p.hosts {
				if !answered[i] {
					out[i] = hostProbe{node: p.offlineNode(h), storage: localStorage(h.Name, p.settings.VolumePool),
						err: provider.Errorf(provider.ClassTransient, "Unreachable", "%w: host %s did not answer the probe in time: %w", provider.ErrUnreachable, h.Name, ctx.Err())}
				}
			}
			return out
		}
	}
	return out
}

// offlineNode is host h as a node before anything was read from it.
func (p *Provider) offlineNode(h *host) provider.NodeInfo {
	return provider.NodeInfo{Name: h.Name, Allowed: p.allowed(h.Name), ReservedMemoryBytes: p.reservedOn(h.Name)}
}

// probeHost reads one host's capacity; an unreachable host is offline.
// storage identifies the storage behind the host's volume pool
// (storageKey).
func (p *Provider) probeHost(h *host) (n provider.NodeInfo, storage, version string, err error) {
	n = p.offlineNode(h)
	storage = localStorage(h.Name, p.settings.VolumePool)
	l, err := h.client()
	if err != nil {
		return n, storage, "", err
	}
	_, memKiB, cpus, _, _, _, _, _, err := l.NodeGetInfo()
	if err != nil {
		return n, storage, "", classify(fmt.Errorf("read host %s: %w", h.Name, err))
	}
	avail, err := availableMemory(l)
	if err != nil {
		return n, storage, "", classify(fmt.Errorf("read the memory of host %s: %w", h.Name, err))
	}
	ver, err := l.ConnectGetLibVersion()
	if err != nil {
		return n, storage, "", classify(fmt.Errorf("read the libvirt version of host %s: %w", h.Name, err))
	}
	n.Online, n.CPUs, n.MemoryBytes = true, int64(cpus), int64(memKiB)<<10
	n.MemoryUsedBytes = min(max(n.MemoryBytes-avail+h.ReservedMemoryBytes, 0), n.MemoryBytes)
	if pool, err := l.StoragePoolLookupByName(p.settings.VolumePool); err == nil {
		if _, capacity, allocation, _, err := l.StoragePoolGetInfo(pool); err == nil {
			n.StorageBytes, n.StorageUsedBytes = int64(capacity), int64(allocation)
		}
		if doc, err := l.StoragePoolGetXMLDesc(pool, 0); err == nil {
			storage = storageKey(h.Name, p.settings.VolumePool, doc)
		}
	}
	return n, storage, fmt.Sprintf("%d.%d.%d", ver/1000000, ver/1000%1000, ver%1000), nil
}

// localStorage is the key of a pool that is the host's own.
func localStorage(hostName, pool string) string { return "host " + hostName + " pool " + pool }

// storageKey identifies the storage behind a host's pool from its XML: a
// network pool (NFS, Gluster, Ceph RBD, iSCSI) by its type, source hosts
// and source path or name, so that hosts sharing it count its free space
// once; any other pool as the host's own.
func storageKey(hostName, pool, doc string) string {
	var x libvirtxml.StoragePool
	if err := x.Unmarshal(doc); err != nil || x.Source == nil {
		return localStorage(hostName, pool)
	}
	switch x.Type {
	case "netfs", "gluster", "rbd", "iscsi", "iscsi-direct":
	default:
		return localStorage(hostName, pool)
	}
	var hosts []string
	for _, sh := range x.Source.Host {
		hosts = append(hosts, net.JoinHostPort(strings.ToLower(sh.Name), sh.Port))
	}
	slices.Sort(hosts)
	where := x.Source.Name
	if x.Source.Dir != nil {
		where += ":" + path.Clean(x.Source.Dir.Path)
	}
	for _, d := range x.Source.Device {
		where += ":" + d.Path
	}
	return x.Type + " " + strings.Join(hosts, ",") + " " + where
}

// ListVMs implements provider.Provider: every domain of every reachable
// host, under its number (domain.number); a domain of no install that is
// not running is listed as a template (the shape of one: clones copy an
// inactive definition). A host that does not answer is left out; when
// none answers, the error.
func (p *Provider) ListVMs(_ context.Context) ([]provider.VMSummary, error) {
	var out []provider.VMSummary
	var last error
	answered := false
	for _, h := range p.hosts {
		doms, err := h.list()
		if err != nil {
			last = err
			continue
		}
		answered = true
		for _, d := range doms {
			out = append(out, p.summary(d))
		}
	}
	if !answered {
		return nil, last
	}
	slices.SortFunc(out, func(a, b provider.VMSummary) int { return a.ID.Compare(b.ID) })
	return out, nil
}

// GetVM implements provider.Provider.
func (p *Provider) GetVM(_ context.Context, ref provider.VMRef) (*provider.VM, error) {
	d, err := p.lookup(ref)
	if err != nil {
		return nil, err
	}
	out := &provider.VM{VMSummary: p.summary(d), TPM: hasTPM2(d.xml)}
	out.SetOwnership(p.verify(d))
	return out, nil
}

// CheckRef implements provider.Provider.
func (p *Provider) CheckRef(ref provider.VMRef) error {
	if err := ids.CheckInRange(ref.ID, p.cfg.VMIDStart, p.cfg.VMIDEnd); err != nil {
		return err
	}
	if ref.Node != "" && (p.hostNamed(ref.Node) == nil || !p.allowed(ref.Node)) {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMRef", "host %s is not an allowed host of the cluster", ref.Node)
	}
	return nil
}

// SetPower implements provider.Provider. libvirt's calls return once the
// change is requested, so the task is one this process names. A suspend
// or a resume runs in the background (suspend.go); a suspended domain is
// not running, so PowerOff and PowerShutdown leave it, and PowerOn
// resumes it.
func (p *Provider) SetPower(_ context.Context, owner provider.Owner, ref provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	d, err := p.lookup(ref)
	if err != nil {
		return nil, err
	}
	vmid := d.meta.ID
	if _, err := p.owned(d, owner); err != nil {
		return nil, err
	}
	if handled, err := p.pendingPower(d, action); handled {
		return nil, err
	}
	l, err := d.host.client()
	if err != nil {
		return nil, err
	}
	switch action {
	case provider.PowerOn, provider.PowerResume:
		switch {
		case d.savingElsewhere():
			return nil, busy(vmid, provider.PowerSuspend)
		case d.running():
			return nil, nil
		case d.saved:
			return p.resume(l, d, action), nil
		case action == provider.PowerResume:
			return nil, provider.Errorf(provider.ClassPermanent, "NotSuspended",
				"VM %d is shut off with no saved state to resume from; it is not booted in its place", vmid)
		}
		p.keepShutdown(d.key(), false)
		err = l.DomainCreate(d.dom)
	case provider.PowerSuspend:
		switch {
		case d.saved || d.savingElsewhere():
			return nil, nil
		case !d.running():
			return nil, provider.Errorf(provider.ClassPermanent, "NotRunning", "VM %d does not run: it has no state to save", vmid)
		}
		return p.suspend(l, d), nil
	case provider.PowerOff:
		if !d.running() {
			return nil, nil
		}
		p.keepShutdown(d.key(), false)
		err = l.DomainDestroyFlags(d.dom, golibvirt.DomainDestroyDefault)
	case provider.PowerShutdown:
		if !d.running() {
			return nil, nil
		}
		// The guest agent first, the ACPI power button where there is
		// none; a guest still booting gets it when its agent connects.
		err = p.shutdown(l, d)
	default:
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidPowerAction", "unknown power action %q", action)
	}
	if err != nil {
		return nil, classify(fmt.Errorf("power %s VM %d: %w", action, vmid, err))
	}
	return p.task(d.host, vmid, string(action)), nil
}

func isNotFound(err error) bool { return errors.Is(err, provider.ErrNotFound) }

// isolationProblem says why host h would not hold isolated VMs to their
// filters, "" when it would: it needs libvirt's clean-traffic filter,
// which every isolation filter references (Debian 12:
// libvirt-daemon-config-nwfilter). A VM is refused there anyway
// (defining its filter fails); this says so on the cluster first.
func (p *Provider) isolationProblem(h *host) string {
	l, err := h.client()
	if err != nil {
		return ""
	}
	if _, err := l.NwfilterLookupByName(cleanTraffic); err != nil {
		return fmt.Sprintf("libvirt host %s has no network filter %s, which every isolation filter references: install libvirt's filters (Debian 12: libvirt-daemon-config-nwfilter) and restart libvirtd (docs/networking.md, \"Isolation\")", h.Name, cleanTraffic)
	}
	return ""
}
