package libvirt

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Operation names, as tasks carry them.
const (
	opClone     = "clone"
	opDisk      = "create-disk"
	opWrite     = "write-cloud-init"
	opConfigure = "configure"
	opStart     = "start"
	opEject     = "eject-cloud-init"
	opDeleteISO = "delete-cloud-init"
	opExtraDisk = "create-extra-disk"
	// opDeleteExtraDisk deletes an extra disk of a VM being deleted.
	opDeleteExtraDisk = "delete-extra-disk"
)

// Pace of the calls a result asks for: a libvirt write is done when it
// returns, so only a guest or a background copy makes the caller wait.
const (
	nextStep    = 0
	bootPoll    = 2 * time.Second
	copyPoll    = 5 * time.Second
	queuedRetry = 2 * time.Second
)

// EnsureVM implements provider.Provider; the package documentation lists
// its steps. Where the VM stands is read from libvirt on every call, never
// from prev.Task.
func (p *Provider) EnsureVM(ctx context.Context, spec *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	vmid, err := ids.ParseEnsure(spec, prev)
	if err != nil {
		return nil, err
	}
	ref, err := templateRef(spec.Source)
	if err != nil {
		return nil, err
	}
	if vmid == 0 {
		return p.place(spec, ref, p.memoryHint(spec, ref))
	}
	d, err := p.find(vmid, prev.Node)
	if errors.Is(err, provider.ErrNotFound) {
		return p.clone(spec, ref, vmid, prev)
	}
	if err != nil {
		return nil, err
	}
	if _, err := p.owned(d, spec.Owner); err != nil {
		// Someone else's VM holds the id (a restarted instance handed it
		// out twice, or an admin took it): never touch it, place again.
		p.forget(spec.Owner)
		res, perr := p.place(spec, ref, p.memoryHint(spec, ref))
		if perr != nil {
			return nil, perr
		}
		res.Message = fmt.Sprintf("VM id %d is taken by a VM this claim does not own; %s", vmid, res.Message)
		return res, nil
	}
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(vmid), Node: d.host.Name, Building: true}, MACAddress: firstMAC(d.xml)}
	p.mu.Lock()
	p.builders[d.key()] = spec.Owner
	p.mu.Unlock()
	return p.step(ctx, spec, ref, d, res)
}

// memoryHint is the memory placement reserves for spec's VM: the spec's
// hint or memory, else the template's (read from its first host).
func (p *Provider) memoryHint(spec *provider.VMSpec, ref *TemplateRef) int64 {
	switch {
	case spec.MemoryHint > 0:
		return spec.MemoryHint
	case spec.MemoryBytes > 0:
		return spec.MemoryBytes
	}
	for _, h := range p.hosts {
		if t, err := p.template(h, ref); err == nil {
			return memoryBytes(t.xml)
		}
	}
	return 0
}

// clone starts the clone of the template to VM vmid, where no domain is
// yet, once a clone slot is free: it defines the domain (named for the
// install, the marker in its metadata, its disk to be created next). A
// restarted instance takes the reservation over from prev.
func (p *Provider) clone(spec *provider.VMSpec, ref *TemplateRef, vmid int, prev provider.Progress) (*provider.EnsureResult, error) {
	o := spec.Owner
	h := p.hostNamed(prev.Node)
	if h == nil || !p.allowed(h.Name) {
		p.forget(o)
		return p.place(spec, ref, p.memoryHint(spec, ref))
	}
	memory := p.memoryHint(spec, ref)
	p.mu.Lock()
	if r := p.reservations[o.UID]; r == nil || r.vmid != vmid {
		p.reservations[o.UID] = &reservation{vmid: vmid, host: h.Name, memory: memory}
	}
	p.mu.Unlock()
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(vmid), Node: h.Name}}
	if pool := p.diskPool(spec); !p.takeSlot(h, pool, vmid, o) {
		res.Phase, res.RetryAfter, res.Message = provider.PhaseQueued, queuedRetry, slotWait(h.Name, pool)
		res.Waits = res.Message
		return res, nil
	}
	tmpl, err := p.template(h, ref)
	if err != nil {
		p.releaseSlot(vmid)
		return nil, err
	}
	rec := ownership.Record{Namespace: o.Namespace, Name: o.Name, UID: o.UID, Pool: o.Pool, VMID: vmid, CreatedAt: o.CreatedAt}
	mac := strings.ToLower(spec.Network.MACAddress)
	if mac == "" {
		mac = macOf(vmid)
	}
	x, err := cloneDomain(tmpl.inactive, cloneSpec{name: p.signer.VMName(vmid), pool: p.diskPool(spec), volume: p.diskName(vmid), mac: mac,
		meta: vmMeta{ID: vmid, Description: p.signer.Description(spec.Description, rec)}})
	if err != nil {
		p.releaseSlot(vmid)
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidTemplate", "source.libvirt.domain: template %s on host %s: %w", ref, h.Name, err)
	}
	if err := p.checkIsolable(spec, x); err != nil {
		p.releaseSlot(vmid)
		return nil, err
	}
	if err := p.applyHardware(h, spec, vmid, x); err != nil {
		p.releaseSlot(vmid)
		if provider.Classify(err) == provider.ClassResource {
			// Its devices were taken while this process was away (a
			// restart forgot the placement): place again.
			p.forget(o)
			return p.place(spec, ref, memory)
		}
		return nil, err
	}
	if err := h.redefine(x); err != nil {
		p.releaseSlot(vmid)
		if provider.ReasonOf(err) == "AlreadyExists" {
			return nil, fmt.Errorf("VM id %d was taken on host %s while it was cloned; placing again on the next call: %w", vmid, h.Name, err)
		}
		return nil, err
	}
	res.Progress.Building, res.Phase, res.RetryAfter = true, provider.PhaseCloning, nextStep
	res.Progress.Task = p.task(h, vmid, opClone)
	res.Message = fmt.Sprintf("cloning template %s to VM %d on host %s", ref, vmid, h.Name)
	return res, nil
}

// step takes the next step for an owned domain. A suspended one is left
// as it is, before anything that could write: it has run, so its disk and
// configuration are done.
func (p *Provider) step(ctx context.Context, spec *provider.VMSpec, ref *TemplateRef, d *domain, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	vmid := d.meta.ID
	if d.saved {
		return p.suspended(spec.Owner, d, res), nil
	}
	done, err := p.ensureDisk(spec, ref, d, res)
	if err != nil || !done {
		return res, err
	}
	if !p.signer.HasOperatorTag(d.meta.Tags) {
		// The extra disks exist before the configuration: a configured
		// VM is one whose volumes are all there.
		if done, err := p.ensureExtraDisks(spec, d, res); err != nil || !done {
			return res, err
		}
		return p.configure(ctx, spec, d, res)
	}
	if !d.running() {
		if p.hasRunSince(d) {
			return p.stopped(spec.Owner, d, res)
		}
		if iso := spec.Isolation; iso != nil && filterRefOf(d.xml) == p.filterName(iso) {
			// Its filter again: a sweep on another deletion may have
			// found it unreferenced between its definition and the
			// domain's.
			if defined, err := p.ensureFilter(d.host, iso); err != nil || defined {
				if err != nil {
					return nil, err
				}
				return p.did(res, d, provider.PhaseConfiguring, opFilter, nextStep, "defined network filter %s of VM %d again", p.filterName(iso), vmid), nil
			}
		}
		l, err := d.host.client()
		if err != nil {
			return nil, err
		}
		if err := l.DomainCreate(d.dom); err != nil {
			return nil, p.startError(vmid, d.host, err)
		}
		return p.did(res, d, provider.PhaseStarting, opStart, bootPoll, "starting VM %d", vmid), nil
	}
	addrs, err := p.addresses(d)
	if err != nil || len(addrs) == 0 {
		res.Phase, res.RetryAfter = provider.PhaseBooting, bootPoll
		res.Message = fmt.Sprintf("waiting for the guest agent of VM %d to report an address", vmid)
		if err != nil && !errors.Is(err, provider.ErrGuestNotReady) {
			return nil, err
		}
		return res, nil
	}
	// The guest is up: it has read its cloud-init, whose ISO goes now.
	if gone, err := p.removeMedium(d, spec.Owner, res); err != nil || !gone {
		if err == nil {
			res.Phase = provider.PhaseBooting
		}
		return res, err
	}
	p.forget(spec.Owner)
	res.Phase, res.Addresses, res.Progress.Task, res.RetryAfter = provider.PhaseRunning, addrs, nil, 0
	res.Message = fmt.Sprintf("VM %d is running at %s", vmid, strings.Join(addrs, ", "))
	return res, nil
}

// startError classifies a failed start; a host short of memory is
// capacity, not a broken VM.
func (p *Provider) startError(vmid int, h *host, err error) error {
	return classify(fmt.Errorf("start VM %d on host %s: %w", vmid, h.Name, err))
}

// did records a write this call made: the phase, its task and the pace.
func (p *Provider) did(res *provider.EnsureResult, d *domain, phase provider.Phase, op string, retry time.Duration, format string, args ...any) *provider.EnsureResult {
	res.Phase, res.RetryAfter, res.Progress.Task = phase, retry, p.task(d.host, d.meta.ID, op)
	res.Message = fmt.Sprintf(format, args...)
	return res
}

// hasRunSince says whether a shut-off domain has run: the lifecycle
// events saw it stop, libvirt gives a reason for its shut-off state that
// only a run leaves (anything but "unknown", which a domain never started
// since libvirtd started has, and "failed", a start that did not happen),
// or its cloud-init ISO is no longer attached, which only happens once it
// ran.
func (p *Provider) hasRunSince(d *domain) bool {
	if p.hasRun(d.host.Name, d.dom.Name) {
		return true
	}
	if reason := golibvirt.DomainShutoffReason(d.reason); reason != golibvirt.DomainShutoffUnknown && reason != golibvirt.DomainShutoffFailed {
		return true
	}
	return d.meta.Medium != "" && mediumDisk(d.xml, d.meta.Medium) == nil
}

// stopped reports a VM that ran and was powered off from inside: its
// medium goes first.
func (p *Provider) stopped(o provider.Owner, d *domain, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	if gone, err := p.removeMedium(d, o, res); err != nil || !gone {
		if err == nil {
			res.Phase = provider.PhaseBooting
		}
		return res, err
	}
	p.forget(o)
	res.Phase, res.Progress.Task, res.RetryAfter = provider.PhaseStopped, nil, 0
	res.Message = fmt.Sprintf("VM %d has run and is powered off", d.meta.ID)
	return res, nil
}

// addresses are the usable IP addresses the guest agent reports, nil
// while it does not answer.
func (p *Provider) addresses(d *domain) ([]string, error) {
	l, err := d.host.client()
	if err != nil {
		return nil, err
	}
	ifaces, err := l.DomainInterfaceAddresses(d.dom, uint32(golibvirt.DomainInterfaceAddressesSrcAgent), 0)
	if err != nil {
		if code := libvirtCode(err); code == golibvirt.ErrAgentUnresponsive || code == golibvirt.ErrAgentUnsynced ||
			code == golibvirt.ErrOperationInvalid || code == golibvirt.ErrOperationTimeout || code == golibvirt.ErrArgumentUnsupported {
			return nil, fmt.Errorf("the guest agent of VM %d: %w: %w", d.meta.ID, provider.ErrGuestNotReady, err)
		}
		return nil, classify(fmt.Errorf("read the addresses of VM %d: %w", d.meta.ID, err))
	}
	var out []string
	for _, i := range ifaces {
		for _, a := range i.Addrs {
			ip, err := netip.ParseAddr(a.Addr)
			if err != nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
				continue
			}
			out = append(out, ip.String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
