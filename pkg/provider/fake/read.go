package fake

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Probe implements provider.Provider.
func (p *Provider) Probe(_ context.Context) (*provider.ClusterInfo, error) {
	defer p.c.lock()()
	info := &provider.ClusterInfo{Version: "fake", InsecureTLS: p.cfg.InsecureSkipVerify}
	for _, n := range p.c.opts.Nodes {
		n.Allowed, n.MemoryUsedBytes, n.ReservedMemoryBytes = p.allowed(n.Name), p.c.memoryUsedLocked(n), p.reservedLocked(n.Name)
		if n.Online && n.Allowed {
			info.AvailableStorageBytes += n.StorageBytes - n.StorageUsedBytes
		}
		info.Nodes = append(info.Nodes, n)
	}
	return info, nil
}

// ValidateTemplate implements provider.Provider.
func (p *Provider) ValidateTemplate(_ context.Context, source provider.TemplateSource) (*provider.TemplateInfo, error) {
	defer p.c.lock()()
	t, err := p.templateLocked(source)
	if err != nil {
		return nil, err
	}
	info := *t
	info.Storages = slices.Clone(t.Storages)
	return &info, nil
}

// templateLocked finds the template source names and checks that the
// clone it asks for is possible. It reads any kind's Settings through
// their record (provider.RecordSource): a template number or name, a full
// clone's storage.
func (p *Provider) templateLocked(src provider.TemplateSource) (*provider.TemplateInfo, error) {
	ref := provider.RecordSource(src)
	if ref.Number == 0 && ref.Name == "" {
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateUnset", "the VM's source names no template")
	}
	var t *provider.TemplateInfo
	storages := map[string]bool{}
	for _, id := range p.c.sortedIDsLocked() {
		v := p.c.vms[id]
		if v.template == nil {
			continue
		}
		for _, s := range v.template.Storages {
			storages[s] = true
		}
		if t == nil && (ref.Number == id || ref.Number == 0 && ref.Name == v.template.Name) {
			t = v.template
		}
	}
	switch {
	case t == nil:
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound", "template %d %q: %w", ref.Number, ref.Name, provider.ErrNotFound)
	case src.Linked && !t.LinkedCloneSupported:
		return nil, provider.Errorf(provider.ClassConfiguration, "LinkedCloneUnsupported", "template %d does not allow linked clones", t.ID)
	case !src.Linked && ref.Storage != "" && !storages[ref.Storage]:
		return nil, provider.Errorf(provider.ClassConfiguration, "StorageNotFound", "full-clone target storage %q does not exist", ref.Storage)
	case src.TPM != nil && !src.TPM.Add && !t.TPM:
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateHasNoTPM",
			"spec.attestation.tpm.addVirtualTPM: template %d has no TPM 2.0; give it one or set addVirtualTPM", t.ID)
	}
	return t, nil
}

// ListVMs implements provider.Provider.
func (p *Provider) ListVMs(_ context.Context) ([]provider.VMSummary, error) {
	defer p.c.lock()()
	out := make([]provider.VMSummary, 0, len(p.c.vms))
	for _, id := range p.c.sortedIDsLocked() {
		out = append(out, p.summaryLocked(p.c.vms[id]))
	}
	return out, nil
}

func (p *Provider) summaryLocked(v *vm) provider.VMSummary {
	s := provider.VMSummary{
		ID: FormatID(v.id), Node: v.node, Name: v.name, Power: provider.PowerStopped, Template: v.template != nil, Tags: slices.Clone(v.tags),
		OperatorTagged: p.signer.HasOperatorTag(v.tags), InstallNamed: p.signer.VerifyVMName(v.name, v.id),
	}
	switch {
	case v.running:
		s.Power, s.Uptime = provider.PowerRunning, p.c.clock.Now().Sub(v.since)
	case v.suspended:
		s.Power = provider.PowerSuspended
	}
	return s
}

// vmLocked is the VM (or template) ref names, ErrNotFound when there is
// none; p.c's lock must be held.
func (p *Provider) vmLocked(ref provider.VMRef) (*vm, error) {
	vmid, err := ParseID(ref.ID)
	if err != nil {
		return nil, err
	}
	v := p.c.vms[vmid]
	if v == nil {
		return nil, fmt.Errorf("VM %s: %w", ref.ID, provider.ErrNotFound)
	}
	return v, nil
}

// GetVM implements provider.Provider.
func (p *Provider) GetVM(_ context.Context, ref provider.VMRef) (*provider.VM, error) {
	defer p.c.lock()()
	v, err := p.vmLocked(ref)
	if err != nil {
		return nil, err
	}
	out := &provider.VM{VMSummary: p.summaryLocked(v), TPM: v.tpm}
	out.SetOwnership(p.signer.Verify(v.description, v.id))
	return out, nil
}

// SetPower implements provider.Provider. A VM with an operation in flight
// refuses with a transient error.
func (p *Provider) SetPower(_ context.Context, owner provider.Owner, ref provider.VMRef, action provider.PowerAction) (*provider.Task, error) {
	defer p.c.lock()()
	v, err := p.vmLocked(ref)
	if err != nil {
		return nil, err
	}
	if err := p.ownedLocked(v, owner); err != nil {
		return nil, err
	}
	if v.op != nil {
		_, left := p.c.inFlightLocked(v)
		return nil, provider.Errorf(provider.ClassTransient, "Busy", "VM %d: %s in progress for %s more", v.id, v.op.task.Operation, left.Round(time.Millisecond))
	}
	switch action {
	case provider.PowerOn, provider.PowerResume:
		switch {
		case v.running:
			return nil, nil
		case v.suspended:
			return p.c.resumeLocked(v), nil
		case action == provider.PowerResume:
			return nil, provider.Errorf(provider.ClassPermanent, "NotSuspended", "VM %d is stopped with no saved state to resume", v.id)
		}
		return p.c.powerOnLocked(v), nil
	case provider.PowerOff, provider.PowerShutdown:
		if !v.running {
			return nil, nil
		}
		return p.c.powerOffLocked(v, string(action)), nil
	case provider.PowerSuspend:
		switch {
		case v.suspended:
			return nil, nil
		case !v.running:
			return nil, provider.Errorf(provider.ClassPermanent, "NotRunning", "VM %d does not run: it has no state to save", v.id)
		}
		return p.c.suspendLocked(v), nil
	}
	return nil, provider.Errorf(provider.ClassConfiguration, "InvalidPowerAction", "unknown power action %q", action)
}
