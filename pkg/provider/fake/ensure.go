package fake

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Operation names, as tasks carry them.
const (
	opClone     = "clone"
	opWrite     = "write-cloud-init"
	opConfigure = "configure"
	opStart     = "start"
)

// EnsureVM implements provider.Provider. Its steps, one operation each:
// place (in-process), clone (or wait in PhaseQueued for a clone slot),
// write the cloud-init medium, configure (name, tags, memory, network, the
// medium attached), start, wait for the guest, then remove the medium and
// report PhaseRunning. Where the VM stands is read from the cluster on
// every call, never from prev.Task, so a lost or repeated Progress only
// repeats a look.
func (p *Provider) EnsureVM(ctx context.Context, spec *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	vmid, err := ids.ParseEnsure(spec, prev)
	if err != nil {
		return nil, err
	}
	defer p.c.lock()()
	tmpl, err := p.templateLocked(spec.Source)
	if err != nil {
		return nil, err
	}
	if vmid == 0 {
		return p.placeLocked(spec, tmpl)
	}
	v := p.c.vms[vmid]
	if v == nil {
		return p.cloneLocked(spec, tmpl, vmid, prev.Node)
	}
	if err := p.ownedLocked(v, spec.Owner); err != nil {
		// Someone else's VM holds the id (a restarted instance handed it
		// out twice, or an admin took it): never touch it, place again.
		delete(p.reservations, spec.Owner.UID)
		res, perr := p.placeLocked(spec, tmpl)
		if perr != nil {
			return nil, perr
		}
		res.Message = fmt.Sprintf("VM id %d is taken by a VM this claim does not own; %s", v.id, res.Message)
		return res, nil
	}
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(v.id), Node: v.node, Building: true}, MACAddress: v.mac}
	if v.op != nil {
		res.Progress.Task, res.RetryAfter = p.c.inFlightLocked(v)
		res.Phase = phaseOf(v)
		res.Message = fmt.Sprintf("%s of VM %d is in progress", v.op.task.Operation, v.id)
		return res, nil
	}
	return p.stepLocked(ctx, spec, v, res)
}

// phaseOf is the creation phase of a VM with an operation in flight.
func phaseOf(v *vm) provider.Phase {
	switch {
	case v.op.task.Operation == opClone:
		return provider.PhaseCloning
	case v.op.task.Operation == opStart:
		return provider.PhaseStarting
	case !v.started:
		return provider.PhaseConfiguring
	}
	return provider.PhaseBooting
}

// cloneLocked clones the template to the id prev reserved, where nothing
// exists yet, once a clone slot is free. A restarted instance takes the
// reservation over from prev.
func (p *Provider) cloneLocked(spec *provider.VMSpec, tmpl *provider.TemplateInfo, vmid int, node string) (*provider.EnsureResult, error) {
	o := spec.Owner
	if !p.c.hasNode(node) {
		delete(p.reservations, o.UID)
		return p.placeLocked(spec, tmpl)
	}
	p.reservations[o.UID] = reservation{vmid: vmid, node: node, memory: memoryHint(spec, tmpl)}
	res := &provider.EnsureResult{Progress: provider.Progress{ID: FormatID(vmid), Node: node}}
	storage := cloneStorage(spec, tmpl)
	if !p.cloneSlotFreeLocked(node, storage) {
		res.Phase, res.RetryAfter = provider.PhaseQueued, p.c.opts.OperationTime
		res.Message = slotWait(node, storage)
		res.Waits = res.Message
		return res, nil
	}
	rec := ownership.Record{Namespace: o.Namespace, Name: o.Name, UID: o.UID, Pool: o.Pool, VMID: vmid, CreatedAt: o.CreatedAt}
	// The install's keyed name until the configuration, so that the orphan
	// sweep finds a clone whose configuration never happens.
	v := &vm{id: vmid, node: node, name: p.signer.VMName(vmid), description: p.signer.Description(spec.Description, rec),
		storage: storage, memory: tmpl.MemoryBytes, guestAgent: tmpl.GuestFiles, tpm: tmpl.TPM}
	p.c.vms[v.id] = v
	res.Progress.Building = true
	return p.operate(res, provider.PhaseCloning, p.c.startLocked(v, opClone, func(time.Time) {}),
		fmt.Sprintf("cloning template %d to VM %d on node %s", tmpl.ID, v.id, v.node)), nil
}

// stepLocked takes the next step for an owned VM with nothing in flight.
func (p *Provider) stepLocked(ctx context.Context, spec *provider.VMSpec, v *vm, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	c := p.c
	id := p.mediumID(v.id, spec.Owner.UID)
	m := c.media[id]
	switch {
	case !v.configured && m == nil && spec.Native == nil:
		// Rendered only now that the clone exists: the data holds a
		// single-use credential.
		data, err := provider.RenderCloudInit(ctx, spec)
		if err != nil {
			return nil, fmt.Errorf("render the cloud-init of VM %d: %w", v.id, err)
		}
		c.media[id] = &medium{id: id, node: v.node, digest: provider.OwnerDigest(spec.Owner.UID), vmid: v.id, data: data}
		return p.operate(res, provider.PhaseConfiguring, c.startLocked(v, opWrite, func(time.Time) {}),
			fmt.Sprintf("writing the cloud-init medium of VM %d", v.id)), nil
	case !v.configured:
		name, memory, mac := spec.Name, v.memory, strings.ToLower(spec.Network.MACAddress)
		tags := slices.Concat(p.signer.Tags(), p.cfg.Tags, spec.Tags)
		if spec.MemoryBytes > 0 {
			memory = spec.MemoryBytes
		}
		if mac == "" {
			mac = macOf(v.id)
		}
		attach, native := id, (*provider.NativeCloudInit)(nil)
		if spec.Native != nil {
			// The hypervisor's own cloud-init: no medium of the
			// provider's, the fields kept in the VM's config.
			attach, native = "", cloneNative(spec.Native)
		}
		addTPM := spec.TPM != nil && spec.TPM.Add
		return p.operate(res, provider.PhaseConfiguring, c.startLocked(v, opConfigure, func(time.Time) {
			v.configured, v.name, v.tags, v.memory, v.mac, v.attached, v.native = true, name, tags, memory, mac, attach, native
			v.tpm = v.tpm || addTPM
		}), fmt.Sprintf("configuring VM %d", v.id)), nil
	case !v.started:
		return p.operate(res, provider.PhaseStarting, c.powerOnLocked(v), fmt.Sprintf("starting VM %d", v.id)), nil
	case v.running && c.clock.Now().Before(v.guestUpAt):
		res.Phase, res.RetryAfter = provider.PhaseBooting, v.guestUpAt.Sub(c.clock.Now())
		res.Message = fmt.Sprintf("waiting for the guest of VM %d", v.id)
		return res, nil
	}
	// The guest has read its cloud-init (it is up, or it powered off after
	// its start): the medium goes, and with it the credential.
	v.attached = ""
	delete(c.media, id)
	delete(p.reservations, spec.Owner.UID)
	if v.suspended {
		res.Phase, res.Message = provider.PhaseSuspended, fmt.Sprintf("VM %d is suspended to disk", v.id)
		return res, nil
	}
	if !v.running {
		res.Phase, res.Message = provider.PhaseStopped, fmt.Sprintf("VM %d has run and is powered off", v.id)
		return res, nil
	}
	res.Phase, res.Addresses = provider.PhaseRunning, []string{cmp.Or(v.address, addressOf(v.id))}
	res.Message = fmt.Sprintf("VM %d is running at %s", v.id, res.Addresses[0])
	return res, nil
}

// operate reports the operation task has just started.
func (p *Provider) operate(res *provider.EnsureResult, phase provider.Phase, task *provider.Task, msg string) *provider.EnsureResult {
	res.Progress.Task, res.Phase, res.RetryAfter, res.Message = task, phase, p.c.opts.OperationTime, msg
	return res
}

// macOf is the MAC of VM id when its spec asks for none (locally
// administered).
func macOf(id int) string {
	return fmt.Sprintf("02:00:00:%02x:%02x:%02x", id>>16&0xff, id>>8&0xff, id&0xff)
}

// addressOf is the address the guest of VM id reports.
func addressOf(id int) string {
	return fmt.Sprintf("10.%d.%d.%d", id>>16&0xff, id>>8&0xff, id&0xff)
}

// cloneNative copies n, lists included, so that a caller's later change
// to its spec does not reach the VM's config.
func cloneNative(n *provider.NativeCloudInit) *provider.NativeCloudInit {
	c := *n
	c.Nameservers, c.SearchDomains = slices.Clone(n.Nameservers), slices.Clone(n.SearchDomains)
	c.SSHAuthorizedKeys = slices.Clone(n.SSHAuthorizedKeys)
	return &c
}
