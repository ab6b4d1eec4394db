package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// EnsureVM implements provider.Provider. Its steps, each at most one
// operation on the cluster: place (in-process), clone (or wait in
// PhaseQueued for a slot), upload the cloud-init ISO, configure (resources,
// network, tags, ISO attached), resize, start, wait for the guest agent,
// detach the ISO, delete the ISO, report PhaseRunning. Where it stands is
// read from the cluster on every call, so a lost or stale Progress.Task only
// costs a repeated, harmless operation.
func (p *Provider) EnsureVM(ctx context.Context, spec *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("ensure VM: %w", err)
	}
	if spec == nil {
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidSpec", "EnsureVM needs a VM spec")
	}
	s := p.session(MethodEnsureVM)
	if err := s.injected(); err != nil {
		return nil, err
	}
	if err := p.checkSpec(spec); err != nil {
		return nil, err
	}
	if prev.VMID == 0 {
		return p.place(s, spec, 0, "")
	}
	res := &provider.EnsureResult{Progress: provider.Progress{VMID: prev.VMID, Node: prev.Node}}
	if prev.Task != nil {
		out, err := p.pollTask(s, prev.Task)
		if err != nil {
			return nil, err
		}
		switch {
		case out.running:
			task := *prev.Task
			res.Progress.Task = &task
			return p.waiting(res, phaseOfTask(task.Operation), fmt.Sprintf("%s task of VM %d is running", task.Operation, prev.VMID)), nil
		case out.failed && !retryableTaskFailure(out.exit):
			return nil, provider.Errorf(provider.ClassPermanent, "TaskFailed", "VM %d of %s/%s: %s task %s failed: %s: %w",
				prev.VMID, spec.Owner.Namespace, spec.Owner.Name, prev.Task.Operation, prev.Task.ID, out.exit, provider.ErrTaskFailed)
		case out.failed && !isAlreadyExists(out.exit):
			res.Phase = phaseOfTask(prev.Task.Operation)
			if prev.Task.Operation == "clone" {
				res.Phase = provider.PhasePlaced
			}
			res.RetryAfter = p.hv.o.RetryBackoff
			res.Message = fmt.Sprintf("%s task of VM %d failed (%s); retrying", prev.Task.Operation, prev.VMID, out.exit)
			return res, nil
		}
		// Done, lost, or a clone that found its id taken: look at the VM.
	}
	return p.advance(ctx, s, spec, res)
}

func (p *Provider) advance(ctx context.Context, s *session, spec *provider.VMSpec, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	vmid := res.Progress.VMID
	p.adopt(spec, res.Progress)
	node, conf, err := p.locate(s, res.Progress.VMRef())
	if errors.Is(err, errNoVM) {
		return p.cloneStep(s, spec, res)
	}
	if err != nil {
		return nil, err
	}
	res.Progress.Node = node
	switch conf.lock {
	case "":
	case "clone":
		// Ours after a lost clone task, or someone else's: nobody can
		// tell until the clone has written the description.
		return p.waiting(res, provider.PhaseCloning, fmt.Sprintf("VM %d is being cloned", vmid)), nil
	case "destroyed":
		return p.waiting(res, provider.PhasePlaced, fmt.Sprintf("VM %d is being destroyed; waiting for its id", vmid)), nil
	default:
		return p.waiting(res, provider.PhaseConfiguring, fmt.Sprintf("VM %d is locked (%s)", vmid, conf.lock)), nil
	}
	if err := p.owns(conf.description, vmid, spec.Owner); err != nil {
		return p.replace(s, spec, vmid, fmt.Sprintf("VM id %d is taken by a VM this claim does not own (%v)", vmid, err))
	}
	res.MACAddress = strings.ToLower(conf.net.mac)
	iso := p.isoVolume(vmid, spec.Owner.UID)
	switch conf.cdrom {
	case iso:
		return p.bootStep(ctx, s, spec, res, node, conf, iso)
	case "none":
		return p.runningStep(s, spec, res, node, iso)
	default:
		return p.deliverStep(ctx, s, spec, res, node, conf, iso)
	}
}

// cloneStep clones the template to the reserved id, or waits for a slot.
func (p *Provider) cloneStep(s *session, spec *provider.VMSpec, res *provider.EnsureResult) (*provider.EnsureResult, error) {
	owner, vmid, node := spec.Owner, res.Progress.VMID, res.Progress.Node
	if node == "" {
		return p.replace(s, spec, 0, "the persisted progress names no node")
	}
	tmpl, err := p.findTemplate(s, spec.Source, false)
	if err != nil {
		return nil, err
	}
	list, err := s.resources()
	if err != nil {
		return nil, classify(err, "list VMs of cluster %q", p.cfg.Name)
	}
	target := p.targetStorage(spec.Source)
	slot := target
	if slot == "" {
		slot = tmpl.storage
	}

	p.mu.Lock()
	inClone := map[int]bool{}
	onNode, onStorage := 0, 0
	for _, r := range list {
		if r.lock == "clone" {
			inClone[r.vmid] = true
			if r.node == node {
				onNode++
			}
		}
	}
	for id, st := range p.cloning {
		if !inClone[id] {
			delete(p.cloning, id)
		} else if st == slot {
			onStorage++
		}
	}
	if (p.cfg.ClonesPerNode > 0 && onNode >= p.cfg.ClonesPerNode) || (p.cfg.ClonesPerStorage > 0 && onStorage >= p.cfg.ClonesPerStorage) {
		p.queued[owner.UID] = true
		waiting := len(p.queued)
		p.mu.Unlock()
		p.obs.CloneQueue(waiting)
		return p.waiting(res, provider.PhaseQueued, fmt.Sprintf("waiting for a clone slot: %d clones on node %s, %d on storage %s",
			onNode, node, onStorage, slot)), nil
	}
	params := cloneParams{
		// The install-keyed name until the configuration renames the VM
		// with its tags, as the Proxmox provider does: a clone is findable
		// by the orphan sweep before it carries a tag.
		newid: vmid, name: p.signer.VMName(vmid), description: p.signer.Description(spec.Description, p.record(owner, vmid)),
		pool: spec.Source.ResourcePool, full: !spec.Source.Linked, target: node,
	}
	if params.full {
		params.storage, params.format = target, spec.Source.Format
	}
	// The clone is sent under the lock so this instance's callers see the
	// slot taken.
	upid, err := s.clone(tmpl.node, tmpl.vmid, params)
	if err == nil {
		p.cloning[vmid] = slot
		delete(p.queued, owner.UID)
	}
	waiting := len(p.queued)
	p.mu.Unlock()
	p.obs.CloneQueue(waiting)
	var ae *apiError
	switch {
	case errors.As(err, &ae) && isAlreadyExists(ae.msg):
		res.Phase = provider.PhasePlaced
		res.Message = fmt.Sprintf("VM id %d was taken meanwhile; checking who owns it", vmid)
		return res, nil
	case isNotExist(err):
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateNotFound",
			"clone template %d to VM %d: %v: %w", tmpl.vmid, vmid, err, provider.ErrNotFound)
	case err != nil:
		return nil, classify(err, "clone template %d to VM %d", tmpl.vmid, vmid)
	}
	return p.started(res, provider.PhaseCloning, upid, "clone", fmt.Sprintf("cloning template %d to VM %d on node %s", tmpl.vmid, vmid, node)), nil
}

// deliverStep uploads the ISO, then applies the hardware and attaches it.
func (p *Provider) deliverStep(ctx context.Context, s *session, spec *provider.VMSpec, res *provider.EnsureResult, node string, conf vmConfig, iso string) (*provider.EnsureResult, error) {
	vmid := res.Progress.VMID
	present, err := p.isoPresent(s, node, iso)
	if err != nil {
		return nil, err
	}
	if !present {
		return p.upload(ctx, s, spec, res, node)
	}
	c := p.hardwareChange(spec, conf)
	c.cdrom = &iso
	upid, err := s.updateConfig(node, vmid, c, true)
	if err != nil {
		return nil, classify(err, "configure VM %d", vmid)
	}
	return p.started(res, provider.PhaseConfiguring, upid, "configure", fmt.Sprintf("configuring VM %d and attaching its cloud-init ISO", vmid)), nil
}

func (p *Provider) upload(ctx context.Context, s *session, spec *provider.VMSpec, res *provider.EnsureResult, node string) (*provider.EnsureResult, error) {
	vmid := res.Progress.VMID
	ci, err := provider.RenderCloudInit(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("render the cloud-init of VM %d: %w", vmid, err)
	}
	upid, _, err := s.upload(node, p.cfg.ISOStorage, p.isoFile(vmid, spec.Owner.UID), ci)
	if err != nil {
		var ae *apiError
		if isNotExist(err) || errors.As(err, &ae) && ae.code == 400 {
			return nil, provider.Errorf(provider.ClassConfiguration, "ISOStorageUnusable",
				"upload the cloud-init ISO of VM %d to storage %q on node %s: %v; set an iso-capable, file-based storage", vmid, p.cfg.ISOStorage, node, err)
		}
		return nil, classify(err, "upload the cloud-init ISO of VM %d", vmid)
	}
	return p.started(res, provider.PhaseConfiguring, upid, "upload", fmt.Sprintf("uploading the cloud-init ISO of VM %d", vmid)), nil
}

// bootStep runs while the ISO is attached: finish the config, start, wait
// for the guest, then detach the ISO.
func (p *Provider) bootStep(ctx context.Context, s *session, spec *provider.VMSpec, res *provider.EnsureResult, node string, conf vmConfig, iso string) (*provider.EnsureResult, error) {
	vmid := res.Progress.VMID
	st, err := s.status(node, vmid)
	if err != nil {
		return nil, classify(err, "read the status of VM %d", vmid)
	}
	if !st.running {
		if c := p.hardwareChange(spec, conf); !c.empty() {
			upid, err := s.updateConfig(node, vmid, c, true)
			if err != nil {
				return nil, classify(err, "configure VM %d", vmid)
			}
			return p.started(res, provider.PhaseConfiguring, upid, "configure", fmt.Sprintf("configuring VM %d", vmid)), nil
		}
		if spec.DiskBytes > conf.disk {
			upid, err := s.resize(node, vmid, spec.DiskBytes)
			if err != nil {
				return nil, classify(err, "resize the disk of VM %d", vmid)
			}
			return p.started(res, provider.PhaseConfiguring, upid, "resize", fmt.Sprintf("growing the disk of VM %d", vmid)), nil
		}
		present, err := p.isoPresent(s, node, iso)
		if err != nil {
			return nil, err
		}
		if !present {
			return p.upload(ctx, s, spec, res, node)
		}
		upid, err := s.power(node, vmid, OpStart)
		if err != nil {
			return nil, classify(err, "start VM %d", vmid)
		}
		return p.started(res, provider.PhaseStarting, upid, "start", fmt.Sprintf("starting VM %d", vmid)), nil
	}
	// The node counts the VM's memory now.
	p.release(spec.Owner.UID)
	addrs, msg, err := p.guestAddresses(s, node, vmid)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return p.waiting(res, provider.PhaseBooting, msg), nil
	}
	none := "none"
	if _, err := s.updateConfig(node, vmid, configChange{cdrom: &none}, false); err != nil {
		return nil, classify(err, "detach the cloud-init ISO of VM %d", vmid)
	}
	res.Phase = provider.PhaseBooting
	res.Message = fmt.Sprintf("the guest of VM %d is up; cloud-init ISO detached", vmid)
	return res, nil
}

// runningStep runs once the ISO is detached: delete it, then report the
// guest's state.
func (p *Provider) runningStep(s *session, spec *provider.VMSpec, res *provider.EnsureResult, node, iso string) (*provider.EnsureResult, error) {
	vmid := res.Progress.VMID
	present, err := p.isoPresent(s, node, iso)
	if err != nil {
		return nil, err
	}
	if present {
		sid, _, _ := strings.Cut(iso, ":")
		upid, err := s.deleteVolume(node, sid, iso)
		if err != nil {
			return nil, classify(err, "delete the cloud-init ISO of VM %d", vmid)
		}
		return p.started(res, provider.PhaseBooting, upid, "delete-iso", fmt.Sprintf("deleting the cloud-init ISO of VM %d", vmid)), nil
	}
	p.release(spec.Owner.UID)
	st, err := s.status(node, vmid)
	if err != nil {
		return nil, classify(err, "read the status of VM %d", vmid)
	}
	if !st.running {
		res.Phase = provider.PhaseStopped
		res.Message = fmt.Sprintf("VM %d powered off after it ran", vmid)
		return res, nil
	}
	addrs, msg, err := p.guestAddresses(s, node, vmid)
	if err != nil {
		return nil, err
	}
	if len(addrs) == 0 {
		return p.waiting(res, provider.PhaseBooting, msg), nil
	}
	res.Phase, res.Addresses = provider.PhaseRunning, addrs
	res.Message = fmt.Sprintf("VM %d is running at %s", vmid, strings.Join(addrs, ", "))
	return res, nil
}

// guestAddresses asks the guest agent for the VM's addresses, leaving out
// loopback and link-local ones. No addresses and a message while the agent
// does not answer yet.
func (p *Provider) guestAddresses(s *session, node string, vmid int) ([]string, string, error) {
	ifaces, err := s.agentInterfaces(node, vmid)
	var ae *apiError
	if errors.As(err, &ae) && ae.code == 500 && (strings.Contains(ae.msg, "agent") || strings.Contains(ae.msg, "not running")) {
		return nil, fmt.Sprintf("waiting for the guest agent of VM %d (%s)", vmid, ae.msg), nil
	}
	if err != nil {
		return nil, "", classify(err, "read the guest addresses of VM %d", vmid)
	}
	var out []string
	for _, i := range ifaces {
		for _, a := range i.addrs {
			ip, err := netip.ParseAddr(a)
			if err != nil || ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() {
				continue
			}
			out = append(out, ip.String())
		}
	}
	if len(out) == 0 {
		return nil, fmt.Sprintf("the guest of VM %d reports no usable address yet", vmid), nil
	}
	return out, "", nil
}

// hardwareChange is what must change on a VM to match spec.
func (p *Provider) hardwareChange(spec *provider.VMSpec, conf vmConfig) configChange {
	var c configChange
	if conf.name != spec.Name {
		c.name = &spec.Name
	}
	if spec.CPUCores > 0 && spec.CPUCores != conf.cores {
		v := spec.CPUCores
		c.cores = &v
	}
	if spec.MemoryBytes > 0 {
		want := (spec.MemoryBytes + 1<<20 - 1) >> 20 << 20 // Proxmox counts MiB
		if want != conf.memory {
			c.memory = &want
		}
	}
	n := conf.net
	if spec.Network.Model != "" {
		n.model = spec.Network.Model
	}
	if spec.Network.MACAddress != "" {
		n.mac = strings.ToUpper(spec.Network.MACAddress)
	}
	if spec.Network.Bridge != "" {
		n.bridge = spec.Network.Bridge
	} else if p.cfg.DefaultBridge != "" {
		n.bridge = p.cfg.DefaultBridge
	}
	n.vlan = spec.Network.VLAN
	if n != conf.net {
		c.net = &n
	}
	if want := p.wantTags(spec); !slices.Equal(want, conf.tags) {
		c.tags = want
	}
	return c
}

// wantTags are the VM's tags: ownership, cluster and spec tags, normalized.
// checkSpec has validated them.
func (p *Provider) wantTags(spec *provider.VMSpec) []string {
	all := append(append(append([]string(nil), p.signer.Tags()...), p.cfg.Tags...), spec.Tags...)
	tags, _ := normalizeTags(all)
	return tags
}

func (p *Provider) checkSpec(spec *provider.VMSpec) error {
	bad := func(format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, "InvalidSpec", "VM spec of %s/%s: "+format,
			append([]any{spec.Owner.Namespace, spec.Owner.Name}, args...)...)
	}
	o := spec.Owner
	switch {
	case o.UID == "" || o.Namespace == "" || o.Name == "":
		return bad("the owner needs a namespace, a name and a UID")
	case len(spec.Name) > 63 || strings.Contains(spec.Name, ".") || !dnsNameRE.MatchString(spec.Name):
		return bad("name %q is not a DNS label", spec.Name)
	case spec.CPUCores < 0 || spec.MemoryBytes < 0 || spec.DiskBytes < 0 || spec.MemoryHint < 0:
		return bad("CPU, memory and disk sizes must not be negative")
	case spec.Network.VLAN < 0 || spec.Network.VLAN > 4094:
		return bad("VLAN %d is outside 1-4094", spec.Network.VLAN)
	}
	if m := spec.Network.MACAddress; m != "" {
		hw, err := net.ParseMAC(m)
		if err != nil || len(hw) != 6 || !strings.Contains(m, ":") {
			return bad("MAC address %q is not six colon-separated bytes", m)
		}
	}
	if _, err := normalizeTags(append(append([]string(nil), p.cfg.Tags...), spec.Tags...)); err != nil {
		return bad("%v", err)
	}
	return nil
}

type taskOutcome struct {
	running bool
	failed  bool
	exit    string
}

// pollTask reads a task's status. A task the cluster does not know (lost,
// or from before the cluster's task log was cleared) counts as finished:
// the caller then looks at the VM itself.
func (p *Provider) pollTask(s *session, t *provider.Task) (taskOutcome, error) {
	ts, err := s.taskStatus(t.ID)
	var ae *apiError
	switch {
	case errors.As(err, &ae) && (strings.Contains(ae.msg, "no such task") || strings.Contains(ae.msg, "unable to parse")):
		return taskOutcome{}, nil
	case err != nil:
		return taskOutcome{}, classify(err, "poll %s task %s", t.Operation, t.ID)
	case ts.running:
		return taskOutcome{running: true}, nil
	case ts.exit == "OK" || strings.HasPrefix(ts.exit, "WARNINGS") || benignTaskFailure(ts.exit):
		return taskOutcome{exit: ts.exit}, nil
	default:
		return taskOutcome{failed: true, exit: ts.exit}, nil
	}
}

// locate finds a VM: on ref.Node if it is there, else wherever the batch
// listing says. errNoVM when it exists nowhere.
func (p *Provider) locate(s *session, ref provider.VMRef) (string, vmConfig, error) {
	if ref.Node != "" {
		conf, err := s.config(ref.Node, ref.VMID)
		if err == nil {
			return ref.Node, conf, nil
		}
		if !isNotExist(err) {
			return "", vmConfig{}, classify(err, "read VM %d on node %s", ref.VMID, ref.Node)
		}
	}
	s.forget()
	list, err := s.resources()
	if err != nil {
		return "", vmConfig{}, classify(err, "list VMs of cluster %q", p.cfg.Name)
	}
	for _, r := range list {
		if r.vmid != ref.VMID || r.node == ref.Node {
			continue
		}
		conf, err := s.config(r.node, r.vmid)
		if isNotExist(err) {
			return "", vmConfig{}, errNoVM
		}
		if err != nil {
			return "", vmConfig{}, classify(err, "read VM %d on node %s", r.vmid, r.node)
		}
		return r.node, conf, nil
	}
	return "", vmConfig{}, errNoVM
}

// isoFile names owner's ISO for vmid as the Proxmox provider does: the
// install, the VM id and the digest of the claim's UID are in the name, so
// a VM id reused by another claim never makes one claim delete another's
// ISO, and the orphan sweep recognises the install's files.
func (p *Provider) isoFile(vmid int, uid string) string {
	return fmt.Sprintf("hf-%s-%d-%s.iso", p.signer.OperatorID(), vmid, provider.OwnerDigest(uid))
}

func (p *Provider) isoVolume(vmid int, uid string) string {
	return p.cfg.ISOStorage + ":iso/" + p.isoFile(vmid, uid)
}

// isoPresent says whether the ISO volume exists on the ISO storage as node
// sees it.
func (p *Provider) isoPresent(s *session, node, volid string) (bool, error) {
	if p.cfg.ISOStorage == "" {
		return false, provider.Errorf(provider.ClassConfiguration, "ISOStorageUnset", "cluster %q names no ISO storage for cloud-init ISOs", p.cfg.Name)
	}
	vols, err := s.storageContent(node, p.cfg.ISOStorage)
	if isNotExist(err) {
		return false, provider.Errorf(provider.ClassConfiguration, "ISOStorageUnusable",
			"ISO storage %q of cluster %q does not exist on node %s: %v", p.cfg.ISOStorage, p.cfg.Name, node, err)
	}
	if err != nil {
		return false, classify(err, "list storage %q on node %s", p.cfg.ISOStorage, node)
	}
	return slices.Contains(vols, volid), nil
}

func (p *Provider) waiting(res *provider.EnsureResult, phase provider.Phase, msg string) *provider.EnsureResult {
	res.Phase, res.RetryAfter, res.Message = phase, p.hv.o.PollInterval, msg
	return res
}

func (p *Provider) started(res *provider.EnsureResult, phase provider.Phase, upid, op, msg string) *provider.EnsureResult {
	res.Progress.Task = &provider.Task{ID: upid, Operation: op, StartTime: p.clock.Now()}
	return p.waiting(res, phase, msg)
}

func phaseOfTask(op string) provider.Phase {
	switch op {
	case "clone":
		return provider.PhaseCloning
	case "start":
		return provider.PhaseStarting
	case "delete-iso":
		return provider.PhaseBooting
	default:
		return provider.PhaseConfiguring
	}
}
