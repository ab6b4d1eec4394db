package proxmox

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/nocloud"
	"github.com/hyperfleet/hyperfleet/pkg/provider/pace"
)

// Task operations written into Progress.Task.Operation.
const (
	opClone     = "clone"
	opUpload    = "upload"
	opResize    = "resize"
	opStart     = "start"
	opISODelete = "delete-iso"
	opStop      = "stop"
	opShutdown  = "shutdown"
	opDestroy   = "destroy"
	// opBoot is not a hypervisor task: Task names the finished start task
	// while EnsureVM waits for the guest. It records, in the caller's
	// Progress, that the VM has been started, so a VM that stops before its
	// guest reported is seen as Stopped rather than started again. It is
	// never polled.
	opBoot = "boot"
)

// Poll intervals: a task is polled just before the typical duration of its
// kind on this cluster (pkg/provider/pace); a task of a kind not seen yet, or one
// that is late, after a quarter of the time it has run so far, between
// minPoll and maxPoll. The guest agent is polled after an
// eighth of the boot so far, between bootPoll and maxBootPoll: every agent
// call costs QMP work on the node, yet a runner's job waits on the boot, so
// the delay after the guest is up stays under a second.
const (
	minPoll     = pace.MinPoll
	maxPoll     = pace.MaxPoll
	bootPoll    = 500 * time.Millisecond
	maxBootPoll = time.Second
	slotPoll    = time.Second
	lockedVM    = 2 * time.Second
	cloneWait   = time.Second
)

// ensureCall is one EnsureVM call.
type ensureCall struct {
	p    *Provider
	spec *provider.VMSpec
	prog progress
	log  logr.Logger
	// after is the operation whose task has just succeeded, "" when the
	// step must be read back from the hypervisor; finished is that task.
	after    string
	finished *provider.Task
	// marker writes and verifies the ownership blocks (Provider.marker).
	marker *ownership.Signer
}

// EnsureVM implements provider.Provider. See the package documentation for
// the steps; each call issues at most one write to the hypervisor, except
// where one step needs no answer before the next: configure is followed by
// resize or start, and the ISO's eject by its deletion, in the same call
// (each of those writes is safe to repeat when a Progress is lost).
func (p *Provider) EnsureVM(ctx context.Context, spec *provider.VMSpec, prev provider.Progress) (*provider.EnsureResult, error) {
	if err := p.validateSpec(spec); err != nil {
		return nil, err
	}
	marker, err := p.marker(ctx)
	if err != nil {
		return nil, err
	}
	prog, err := progressOf(prev)
	if err != nil {
		return nil, err
	}
	c := &ensureCall{p: p, spec: spec, prog: prog, marker: marker,
		log: p.log.WithValues("MachineClaim", spec.Owner.Namespace+"/"+spec.Owner.Name, "vmid", prog.VMID, "node", prog.Node)}
	if prog.VMID == 0 {
		return c.place(ctx, 0)
	}
	if prog.Node == "" {
		node, err := p.locate(ctx, prog.VMID)
		if err != nil && !isNotFound(err) {
			return nil, err
		}
		if node == "" {
			// Nothing exists and the node was never recorded: place again.
			return c.place(ctx, 0)
		}
		c.prog.Node = node
	}
	p.adopt(spec, c.prog)
	if c.prog.Task == nil {
		// A Progress that lost its task (the caller did not persist the
		// last result): follow the task this process started rather than
		// repeating its operation.
		c.prog.Task = p.inflightTask(c.prog.VMID, spec.Owner.UID)
	}
	if t := c.prog.Task; t != nil {
		if t.Operation == opBoot {
			return c.booting(ctx)
		}
		res, done, err := c.poll(ctx)
		if !done {
			return res, err
		}
	}
	return c.next(ctx)
}

// validateSpec rejects specs Proxmox would reject, before any call.
func (p *Provider) validateSpec(spec *provider.VMSpec) error {
	bad := func(field, format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, "InvalidSpec", field+": "+format, args...)
	}
	switch {
	case spec == nil:
		return bad("spec", "is nil")
	case spec.Owner.UID == "":
		return bad("owner.uid", "is empty; the ownership marker needs the claim's UID")
	case templateRefOf(spec.Source).ID == 0 && templateRefOf(spec.Source).Name == "" && templateRefOf(spec.Source).Selector == "":
		return bad(fieldTemplateID, "set templateID, templateName or templateSelector")
	case !dnsNameRE.MatchString(spec.Name):
		return bad("name", "%q is not a DNS name (letters, digits and '-', no underscores)", spec.Name)
	case spec.CPUCores < 0 || spec.CPUCores > 1024:
		return bad("spec.resources.cpu", "%d is out of range 1-1024", spec.CPUCores)
	case spec.MemoryBytes != 0 && spec.MemoryBytes < 16<<20:
		return bad("spec.resources.memory", "%d bytes is below Proxmox's 16 MiB minimum", spec.MemoryBytes)
	case spec.Network.VLAN < 0 || spec.Network.VLAN > 4094:
		return bad("spec.network.vlan", "%d is out of range 1-4094", spec.Network.VLAN)
	case spec.Network.Model != "" && !netModels[spec.Network.Model]:
		return bad("spec.network.model", "%q is not a Proxmox NIC model (virtio, e1000, vmxnet3 ...)", spec.Network.Model)
	case spec.Network.MACAddress != "" && !macRE.MatchString(spec.Network.MACAddress):
		return bad("spec.network.macAddress", "%q is not a MAC address", spec.Network.MACAddress)
	case len(spec.Description) > 4096:
		return bad("description", "is %d characters; Proxmox keeps 8192 including the ownership block, keep it under 4096", len(spec.Description))
	case len(specDevices(spec)) > maxHostPCI:
		return bad(fieldDevices, "%d devices; a Proxmox VM has at most %d (hostpci0-hostpci15)", len(specDevices(spec)), maxHostPCI)
	case spec.SuspendsToDisk && len(specDevices(spec)) > 0:
		// qemu-server's vm_suspend: "cannot suspend VM to disk due to
		// passed-through PCI device(s)".
		return bad(fieldDevices, "a standby VM is suspended to disk, which Proxmox refuses for a VM with passed-through PCI devices; take the standby tier off the RunnerPool or the devices off the template")
	}
	for _, t := range spec.Tags {
		if !tagRE.MatchString(strings.ToLower(t)) {
			return bad("tags", "%q is not a legal Proxmox tag (letters, digits, _ - + . only)", t)
		}
	}
	if spec.Isolation != nil {
		if err := spec.Isolation.Check(); err != nil {
			return bad("isolation", "%v", err)
		}
	}
	if err := spec.Hardware.Check(); err != nil {
		return bad("spec.hardware", "%v", err)
	}
	if spec.Native != nil {
		return checkNative(spec.Native, bad)
	}
	return nil
}

// result builds an EnsureResult with the call's current Progress.
func (c *ensureCall) result(phase provider.Phase, retry time.Duration, format string, args ...any) *provider.EnsureResult {
	prog := c.prog
	if prog.Task != nil {
		t := *prog.Task
		prog.Task = &t
	}
	return &provider.EnsureResult{Progress: prog.public(), Phase: phase, RetryAfter: retry, Message: fmt.Sprintf(format, args...)}
}

func (c *ensureCall) setTask(op, upid string) {
	c.prog.Task = &provider.Task{ID: upid, Operation: op, StartTime: c.p.clock.Now()}
	c.p.setInflight(c.prog.VMID, c.spec.Owner.UID, c.prog.Task)
}

// pollDelay is when to look at a task again.
func (c *ensureCall) pollDelay() time.Duration {
	return pollDelay(c.p, c.prog.Task)
}

func pollDelay(p *Provider, t *provider.Task) time.Duration {
	if t == nil {
		return minPoll
	}
	return p.pace.Next(t.Operation, p.clock.Since(t.StartTime))
}

// phaseOf is the phase a running task stands for.
func phaseOf(op string) provider.Phase {
	switch op {
	case opClone:
		return provider.PhaseCloning
	case opUpload, opResize:
		return provider.PhaseConfiguring
	case opStart:
		return provider.PhaseStarting
	case opISODelete:
		return provider.PhaseBooting
	}
	return provider.PhaseConfiguring
}

// place reserves an id and a node; nothing is written to the hypervisor,
// so the caller persists the VM id before anything carries it.
func (c *ensureCall) place(ctx context.Context, exclude int) (*provider.EnsureResult, error) {
	pl, err := c.p.place(ctx, c.spec, exclude)
	if err != nil {
		return nil, err
	}
	c.prog = progress{VMID: pl.vmid, Node: pl.node}
	c.log.V(1).Info("Placed VM", "newVMID", pl.vmid, "newNode", pl.node)
	res := c.result(provider.PhasePlaced, 0, "VM id %d reserved on node %s", pl.vmid, pl.node)
	res.Waits = c.p.holdCloneSlot(ctx, c.spec, pl.node, pl.vmid)
	return res, nil
}

// poll reads the task in Progress once. done is true when it succeeded
// (c.after is set) or is gone, and the next step may run in this call.
func (c *ensureCall) poll(ctx context.Context) (*provider.EnsureResult, bool, error) {
	t := c.prog.Task
	st, err := c.p.api.task(ctx, t.ID)
	if isNotFound(err) {
		// The node lost the task (rebooted or pruned its task list): read
		// the state back from the VM.
		c.log.Info("Task is unknown to Proxmox; reading the VM's state instead", "operation", t.Operation)
		c.release(t)
		c.prog.Task = nil
		c.p.clearInflight(c.prog.VMID, t.ID)
		return nil, true, nil
	}
	if err != nil {
		return nil, false, err
	}
	if st.running() {
		return c.result(phaseOf(t.Operation), c.pollDelay(), "waiting for the %s task", t.Operation), false, nil
	}
	c.release(t)
	c.prog.Task = nil
	c.p.clearInflight(c.prog.VMID, t.ID)
	if st.ok() {
		c.p.pace.Observe(t.Operation, c.p.clock.Since(t.StartTime))
		if t.Operation == opClone || t.Operation == opStart {
			// A success ends the run of failures its backoff counted.
			c.p.resetBackoff(c.prog.VMID)
		}
		c.after, c.finished = t.Operation, t
		return nil, true, nil
	}
	res, err := c.taskFailed(ctx, t, st.ExitStatus)
	if res == nil && err == nil {
		return nil, true, nil
	}
	return res, false, err
}

// release frees what a finished task held.
func (c *ensureCall) release(t *provider.Task) {
	if t.Operation == opClone {
		c.p.slots.Release(c.prog.VMID)
	}
}

// taskFailed decides what a failed task means. It returns (nil, nil) when
// the next step should be read back from the hypervisor in this call. A
// failure a retry can fix is a result with a backoff; any other is an error
// of class Permanent wrapping ErrTaskFailed, returned again on every call
// with the same Progress (the failed task stays in it).
func (c *ensureCall) taskFailed(_ context.Context, t *provider.Task, exit string) (*provider.EnsureResult, error) {
	err := taskFailure(t.Operation, exit)
	log := c.log.WithValues("operation", t.Operation, "exitStatus", exit)
	if t.Operation == opClone {
		// A failed clone leaves the id to whoever takes it next.
		c.prog.Building = false
	}
	switch {
	case t.Operation == opISODelete && isNotFound(err):
		// Already gone: what the task was for.
		c.after, c.finished = opISODelete, t
		return nil, nil
	case t.Operation == opClone && reasonOf(err) == "AlreadyExists":
		// Someone holds the id: derive decides whether it is us.
		return nil, nil
	case t.Operation == opStart && strings.Contains(exit, "already running"):
		// A start issued twice (a lost Progress): the VM runs.
		c.after, c.finished = opStart, t
		return nil, nil
	case retryable(err):
		wait := c.p.backoffAfterFailure(c.prog.VMID, fmt.Sprintf("%s task failed (%s)", t.Operation, exit))
		log.Info("Task failed; retrying after a backoff", "reason", reasonOf(err), "retryAfter", wait)
		phase := provider.PhaseQueued
		if t.Operation != opClone {
			phase = phaseOf(t.Operation)
		}
		return c.result(phase, wait, "%s task failed (%s); retrying in %s", t.Operation, exit, wait.Round(time.Millisecond)), nil
	}
	log.Info("Task failed for good", "reason", reasonOf(err))
	c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
	// Keep the failed task in the caller's Progress: the next call reads it
	// again and returns the same error.
	c.prog.Task = t
	hint := ""
	switch {
	case reasonOf(err) == "TemplateStart":
		hint = fmt.Sprintf("; VM %d is a template and cannot be started", c.prog.VMID)
	case t.Operation == opClone && isNotFound(err):
		hint = "; check " + fieldTemplateID + ": the template or a storage it uses is gone"
	case t.Operation == opUpload:
		hint = "; check spec.proxmox.isoStorage of the HypervisorCluster"
	}
	return nil, provider.Errorf(provider.ClassPermanent, reasonOf(err), "VM %d on node %s: %w%s", c.prog.VMID, c.prog.Node, err, hint)
}

// retryable reports task failures a later attempt can overcome: locks,
// timeouts, unreachable daemons, full storages.
func retryable(err error) bool {
	switch provider.Classify(err) {
	case provider.ClassTransient, provider.ClassResource:
		return true
	}
	return false
}

// next runs the step that follows the task that just succeeded, or reads
// the state back from the hypervisor.
func (c *ensureCall) next(ctx context.Context) (*provider.EnsureResult, error) {
	switch c.after {
	case opClone:
		// Our clone exists and carries our marker.
		if c.spec.Native != nil {
			return c.configure(ctx, nil)
		}
		return c.upload(ctx)
	case opUpload:
		return c.configure(ctx, nil)
	case opResize:
		return c.start(ctx)
	case opStart:
		c.prog.Task = &provider.Task{ID: c.finished.ID, Operation: opBoot, StartTime: c.p.clock.Now()}
		return c.booting(ctx)
	case opISODelete:
		c.p.noteISOGone(c.prog.VMID)
		return c.running(ctx)
	}
	if c.p.unsentClone(c.spec.Owner.UID, c.prog.VMID) {
		// Placed by this process, no clone sent: nothing to read back.
		return c.clone(ctx)
	}
	return c.derive(ctx)
}

// derive reads where the VM stands and runs the step that follows:
//
//	no VM                          -> clone
//	lock: clone                    -> wait (a clone runs; maybe ours)
//	marker not ours                -> place again at another id
//	lock: suspended                -> Suspended (no write)
//	lock: suspending, vmstate set  -> wait (the memory is being saved)
//	other lock                     -> wait (but for a suspend that failed:
//	                                  read on, the lock stays for an admin)
//	no operator tag (unconfigured) -> upload the ISO if missing, else configure
//	stopped, ISO attached          -> resize if the disk must grow, else start
//	running, ISO attached          -> wait for the guest, then eject the ISO
//	ISO detached                   -> delete the ISO file if present, then
//	                                  Running (or Stopped when powered off)
func (c *ensureCall) derive(ctx context.Context) (*provider.EnsureResult, error) {
	cfg, err := c.p.api.config(ctx, c.prog.Node, c.prog.VMID)
	if isNotFound(err) {
		// Nothing holds the id: no build of the claim's stands there.
		c.prog.Building = false
		return c.clone(ctx)
	}
	if err != nil {
		return nil, err
	}
	if cfg["lock"] == "clone" {
		return c.foreignCloneWait(), nil
	}
	rec, err := c.p.verifyOwner(c.marker, cfg, c.prog.VMID, c.spec.Owner)
	if err != nil {
		return c.replace(ctx, err)
	}
	c.prog.Building = true
	c.p.slots.Release(c.prog.VMID)
	if res := c.suspendedResult(cfg); res != nil {
		return res, nil
	}
	if l := cfg["lock"]; l != "" && suspensionOf(cfg) != suspendFailed {
		return c.result(provider.PhaseConfiguring, lockedVM, "VM %d is locked (%s); waiting", c.prog.VMID, l), nil
	}
	if !c.p.signer.HasOperatorTag(cfg.tags()) {
		if c.spec.Native != nil {
			return c.configure(ctx, &verified{cfg: cfg, rec: rec})
		}
		// Not configured yet. The ISO's name is this claim's, so a file of
		// that name is this claim's finished upload.
		present, err := c.isoPresent(ctx)
		if err != nil {
			return nil, err
		}
		if !present {
			return c.upload(ctx)
		}
		return c.configure(ctx, &verified{cfg: cfg, rec: rec})
	}
	st, err := c.p.api.status(ctx, c.prog.Node, c.prog.VMID)
	if err != nil {
		return nil, err
	}
	slot := c.seedSlot(cfg)
	switch {
	case slot != "" && st.Status == "running":
		// Started by a call whose Progress was lost: no boot marker (no
		// start task id to name); the next call reads the VM again.
		return c.booting(ctx)
	case slot != "":
		if key, size := cfg.bootDisk(); key != "" && c.spec.DiskBytes > size {
			return c.resize(ctx, key)
		}
		return c.start(ctx)
	case c.spec.Native != nil:
		// Proxmox's drive is detached: the guest has run. No file of
		// this install's is left to delete.
		if st.Status == "running" {
			return c.running(ctx)
		}
		c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
		return c.result(provider.PhaseStopped, 0, "VM %d has run and is powered off", c.prog.VMID), nil
	}
	return c.cleanupISO(ctx, st.Status == "running")
}

// seedSlot is the drive that holds the VM's cloud-init seed while the VM
// has not run: the NoCloud ISO, or Proxmox's own cloud-init drive under a
// native spec. Detaching it once the guest reports an address is what
// tells, after a restart, a VM that ran from one that was never started.
func (c *ensureCall) seedSlot(cfg vmConfig) string {
	if c.spec.Native != nil {
		return cfg.cloudInitSlot()
	}
	return cfg.isoSlot(c.p.isoVolid(c.prog.VMID, c.spec.Owner.UID))
}

// verified is a config whose marker verified for the owner.
type verified struct {
	cfg vmConfig
	rec ownership.Record
}

// verifyOwner checks with marker (Provider.marker) that cfg's block was
// written by this install on this cluster for owner and VM vmid.
func (p *Provider) verifyOwner(marker *ownership.Signer, cfg vmConfig, vmid int, owner provider.Owner) (ownership.Record, error) {
	rec, err := marker.Verify(cfg["description"], vmid)
	if err != nil {
		return rec, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: VM %d: %w", provider.ErrNotOwned, vmid, err)
	}
	if rec.UID != owner.UID {
		return rec, provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: VM %d belongs to claim %s/%s (uid %s), not %s/%s (uid %s)",
			provider.ErrNotOwned, vmid, rec.Namespace, rec.Name, rec.UID, owner.Namespace, owner.Name, owner.UID)
	}
	return rec, nil
}

// foreignCloneWait is the wait while a clone this call has no task for
// (no task in the claim's Progress, or its own clone call refused) holds
// the claim's VM id. Proxmox's clone writes only "lock: clone" until it
// finishes, so whose VM it becomes is read afterwards: the claim's own
// clone goes on to Configuring, another claim's makes derive place this
// one again. When the Progress says the build is the claim's (Building:
// the claim saw its clone start, and an id its clone holds is taken by
// no one else) the clone is its own, whose task a restart lost: Cloning.
// Otherwise Queued, not Cloning, because the claim may start over at
// Placed, and a phase never goes back past a clone that was its own.
func (c *ensureCall) foreignCloneWait() *provider.EnsureResult {
	if c.prog.Building {
		return c.result(provider.PhaseCloning, cloneWait, "VM %d is being cloned (its task was started before this process); waiting for the clone to finish", c.prog.VMID)
	}
	return c.result(provider.PhaseQueued, cloneWait, "VM id %d is held by a clone in progress that this claim's progress does not name; waiting to read whose VM it is", c.prog.VMID)
}

// replace moves the claim to another VM id because its id is held by a VM
// it does not own. That VM is never touched.
func (c *ensureCall) replace(ctx context.Context, why error) (*provider.EnsureResult, error) {
	old := c.prog.VMID
	c.log.Info("VM id is taken by a VM this claim does not own; placing the claim again", "reason", why.Error())
	res, err := c.place(ctx, old)
	if err != nil {
		return nil, err
	}
	res.Message = fmt.Sprintf("VM id %d is taken by a VM this claim does not own; %s", old, res.Message)
	return res, nil
}

// clone starts the clone of the template to the reserved id, when a clone
// slot is free and no backoff is pending.
func (c *ensureCall) clone(ctx context.Context) (*provider.EnsureResult, error) {
	vmid := c.prog.VMID
	if wait, at, cause := c.p.backoffWait(vmid); wait > 0 {
		// The cause again, not only in the call that failed: the claim's
		// condition is this message for as long as the wait lasts.
		return c.result(provider.PhaseQueued, wait, "retrying the clone at %s after: %s", retryTime(at), cause), nil
	}
	copies, err := c.p.templateCopies(ctx, c.spec.Source)
	if err != nil {
		return nil, err
	}
	view, err := c.p.clusterView(ctx, time.Hour)
	if err != nil {
		return nil, err
	}
	tmpl := c.p.cloneSource(view, copies, c.prog.Node)
	if tmpl == nil {
		// The node's copy of a selected template went away after the VM
		// was placed there; nothing was cloned yet, so place it again.
		c.log.Info("The node's template copy is gone; placing the VM again", "node", c.prog.Node)
		c.p.release(c.spec.Owner.UID, vmid, false)
		return c.place(ctx, 0)
	}
	storages := c.p.cloneStorageKeys(view, tmpl, c.spec, c.prog.Node)
	if !c.p.slots.Take(vmid, c.spec.Owner, c.prog.Node, storages) {
		res := c.result(provider.PhaseQueued, slotPoll, "%s", c.p.slotWait(c.prog.Node))
		res.Waits = res.Message
		return res, nil
	}
	// The marker's time is the claim's creation time, stable across
	// retries, so a re-signed marker is identical.
	created := c.spec.Owner.CreatedAt
	if created.IsZero() {
		created = c.p.clock.Now()
	}
	rec := ownership.Record{
		Namespace: c.spec.Owner.Namespace, Name: c.spec.Owner.Name, UID: c.spec.Owner.UID, Pool: c.spec.Owner.Pool,
		VMID: vmid, CreatedAt: created.UTC().Truncate(time.Second),
	}
	body := map[string]any{
		"newid": vmid,
		// Not the spec's name yet: the hypervisor writes the clone's name
		// before any tag, so this install-keyed name is what lets the
		// orphan sweep find a clone whose configuration never happens
		// (docs/security.md, "Orphans: VMs, ISOs, runners"). configure
		// renames the VM together with its tags.
		"name":        c.marker.VMName(vmid),
		"description": c.marker.Description(c.spec.Description, rec),
		"full":        boolParam(!c.spec.Source.Linked),
	}
	if c.prog.Node != tmpl.node {
		body["target"] = c.prog.Node
	}
	ref := templateRefOf(c.spec.Source)
	if ref.ResourcePool != "" {
		body["pool"] = ref.ResourcePool
	}
	if target := c.p.fullCloneStorage(c.spec); target != "" {
		body["storage"] = target
	}
	if !c.spec.Source.Linked && ref.Format != "" {
		body["format"] = ref.Format
	}
	path := fmt.Sprintf("/nodes/%s/qemu/%d/clone", tmpl.node, tmpl.id)
	c.p.cloneSent(c.spec.Owner.UID, vmid)
	upid, err := c.p.api.upid(ctx, http.MethodPost, path, nil, body)
	if err != nil {
		c.p.slots.Release(vmid)
		return c.cloneFailed(ctx, tmpl, err)
	}
	c.setTask(opClone, upid)
	c.prog.Building = true
	c.log.Info("Cloning VM", "template", tmpl.id, "linked", c.spec.Source.Linked)
	return c.result(provider.PhaseCloning, c.pollDelay(), "cloning %s to VM %d on node %s", fmtTemplate(tmpl), vmid, c.prog.Node), nil
}

// cloneFailed handles a clone call Proxmox refused before starting a task.
func (c *ensureCall) cloneFailed(ctx context.Context, tmpl *templateInfo, err error) (*provider.EnsureResult, error) {
	msg := apiMessage(err)
	switch {
	case strings.Contains(msg, "config file already exists"):
		// The id is held: by our own earlier clone (a lost Progress) or by
		// someone else. Read it.
		cfg, gerr := c.p.api.config(ctx, c.prog.Node, c.prog.VMID)
		if isNotFound(gerr) {
			// Not on our node: a clone starting, or a VM on another node
			// (ids are cluster-wide, config files per node).
			node, lerr := c.p.locate(ctx, c.prog.VMID)
			if lerr != nil {
				// No node lists the id yet (a clone starting) or the listing
				// failed: wait and look again, saying why.
				return c.result(provider.PhaseQueued, cloneWait, "VM id %d is held by a clone in progress that this claim's progress does not name; waiting (%v)", c.prog.VMID, lerr), nil
			}
			if node == c.prog.Node {
				return c.foreignCloneWait(), nil
			}
			c.log.Info("VM id is held on another node", "otherNode", node)
			c.prog.Node = node
			if cfg, gerr = c.p.api.config(ctx, c.prog.Node, c.prog.VMID); isNotFound(gerr) {
				return c.foreignCloneWait(), nil
			}
		}
		switch {
		case gerr != nil:
			return nil, gerr
		case cfg["lock"] == "clone":
			return c.foreignCloneWait(), nil
		}
		if _, verr := c.p.verifyOwner(c.marker, cfg, c.prog.VMID, c.spec.Owner); verr != nil {
			return c.replace(ctx, verr)
		}
		c.prog.Building = true
		return c.result(provider.PhaseConfiguring, 0, "VM %d exists", c.prog.VMID), nil
	case isLock(err):
		wait := c.p.backoffAfterFailure(c.prog.VMID, fmt.Sprintf("clone refused on a lock (%s)", msg))
		return c.result(provider.PhaseQueued, wait, "clone refused on a lock (%s); retrying in %s", msg, wait.Round(time.Millisecond)), nil
	case strings.Contains(msg, "Linked clone feature is not supported"):
		return nil, withField(err, fieldCloneMode, "the template's storage cannot hold linked clones; use a full clone")
	case strings.Contains(msg, "pool '"):
		return nil, withField(err, fieldPool, "create the resource pool or clear pool")
	case strings.Contains(msg, "storage '"):
		return nil, withField(err, fieldStorage, "name a storage with images content on the template's node")
	case reasonOf(err) == "InvalidParameter":
		return nil, withField(err, "spec", "fix the named parameter")
	}
	return nil, fmt.Errorf("clone %s to VM %d: %w", fmtTemplate(tmpl), c.prog.VMID, err)
}

func boolParam(b bool) int {
	if b {
		return 1
	}
	return 0
}

// isoPresent reports whether the VM's ISO file exists.
func (c *ensureCall) isoPresent(ctx context.Context) (bool, error) {
	return c.p.isoPresent(ctx, c.prog.Node, c.prog.VMID, c.spec.Owner.UID)
}

func (p *Provider) isoPresent(ctx context.Context, node string, vmid int, owner string) (bool, error) {
	p.mu.Lock()
	gone := p.isoGone[vmid]
	p.mu.Unlock()
	if gone {
		return false, nil
	}
	return p.api.volumeExists(ctx, node, p.isoStorage, p.isoVolid(vmid, owner))
}

func (p *Provider) noteISOGone(vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isoGone[vmid] = true
}

func (p *Provider) forgetISO(vmid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.isoGone, vmid)
}

// upload renders the NoCloud ISO and uploads it to the VM's node. It runs
// after the clone, so a VM waiting for a clone slot has no secret lying on
// storage, and a claim moved to another id leaves no ISO behind.
func (c *ensureCall) upload(ctx context.Context) (*provider.EnsureResult, error) {
	ci, err := provider.RenderCloudInit(ctx, c.spec)
	if err != nil {
		return nil, fmt.Errorf("render the cloud-init of VM %d: %w", c.prog.VMID, err)
	}
	iso, err := nocloud.ISO(nocloud.Files(c.spec, ci, c.prog.VMID))
	if err != nil {
		return nil, provider.Errorf(provider.ClassPermanent, "CloudInitISO", "render the cloud-init ISO of VM %d: %w", c.prog.VMID, err)
	}
	upid, err := c.p.api.upload(ctx, c.prog.Node, c.p.isoStorage, c.p.isoName(c.prog.VMID, c.spec.Owner.UID), iso)
	if err != nil {
		if msg := apiMessage(err); strings.Contains(msg, "storage '") || strings.Contains(msg, "storage type '") || reasonOf(err) == "InvalidParameter" {
			return nil, withField(err, "spec.proxmox.isoStorage of the HypervisorCluster", "name a file-based storage with iso content on every allowed node")
		}
		return nil, fmt.Errorf("upload the cloud-init ISO of VM %d: %w", c.prog.VMID, err)
	}
	c.p.forgetISO(c.prog.VMID)
	c.setTask(opUpload, upid)
	return c.result(provider.PhaseConfiguring, c.pollDelay(), "uploading the cloud-init ISO"), nil
}

// configure applies resources, network, the ISO, tags and description in
// one synchronous config update. v is nil when the config must be read.
func (c *ensureCall) configure(ctx context.Context, v *verified) (*provider.EnsureResult, error) {
	if v == nil {
		cfg, err := c.p.api.config(ctx, c.prog.Node, c.prog.VMID)
		if err != nil {
			return nil, err
		}
		rec, err := c.p.verifyOwner(c.marker, cfg, c.prog.VMID, c.spec.Owner)
		if err != nil {
			return c.replace(ctx, err)
		}
		v = &verified{cfg: cfg, rec: rec}
	}
	body, err := c.configBody(v)
	if err != nil {
		return nil, err
	}
	if err := c.hardwareConfig(ctx, body, v.cfg); err != nil {
		return nil, err
	}
	if iso := c.spec.Isolation; iso != nil {
		// Before the update that tags the VM configured (and turns on
		// firewall=1): a VM is never started with half a firewall.
		if err := c.p.isolateVM(ctx, c.prog.Node, c.prog.VMID, iso); err != nil {
			return nil, fmt.Errorf("isolate VM %d (policy %s): %w", c.prog.VMID, iso.Policy, err)
		}
	}
	err = c.p.api.call(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/config", c.prog.Node, c.prog.VMID), nil, body, nil)
	switch {
	case err == nil:
	case isLock(err):
		return c.result(provider.PhaseConfiguring, lockedVM, "VM %d is locked; retrying the configuration", c.prog.VMID), nil
	case isNotFound(err) && strings.Contains(apiMessage(err), c.p.isoName(c.prog.VMID, c.spec.Owner.UID)):
		// The ISO vanished between upload and configure: upload again.
		return c.upload(ctx)
	case reasonOf(err) == "InvalidParameter":
		return nil, withField(err, paramField(err, c.spec.Native != nil), "fix the value Proxmox rejected")
	case c.spec.Native != nil && strings.Contains(apiMessage(err), "does not support content-type 'images'"):
		// Proxmox allocates the drive in the update and fails it with a
		// 500; no retry makes the storage take images.
		return nil, provider.Errorf(provider.ClassConfiguration, "NoCloudInitStorage", "%s: %w; name a storage with images content on the VM's node", fieldDriveStorage, err)
	default:
		return nil, fmt.Errorf("configure VM %d: %w", c.prog.VMID, err)
	}
	c.log.V(1).Info("Configured VM")
	c.p.noteDevices(c.prog.VMID, c.prog.Node, specDevices(c.spec), true)
	// The config read before the update is current for the disk: the
	// update does not touch it.
	if key, size := v.cfg.bootDisk(); key != "" && c.spec.DiskBytes > size {
		return c.resize(ctx, key)
	}
	return c.start(ctx)
}

// paramField maps a rejected config parameter to the field to fix; native
// says the update carried Proxmox's cloud-init drive and fields.
func paramField(err error, native bool) string {
	fields := map[string]string{
		"cores": "spec.resources.cpu", "memory": "spec.resources.memory", "net0": "spec.network",
		"tags": "tags", "description": "description", "name": "name", tpmKey: fieldAddTPM,
		"cpu": fieldCPUType + " or " + fieldCPUFlags,
	}
	for i := 1; i <= maxSCSI; i++ {
		// The update carries scsiN only for an extra disk.
		fields["scsi"+strconv.Itoa(i)] = fieldExtraDisks
	}
	if native {
		maps.Copy(fields, map[string]string{
			"ide0": fieldDriveStorage, "ide1": fieldDriveStorage, "ide2": fieldDriveStorage, "ide3": fieldDriveStorage,
			"ipconfig0": "spec.network", "nameserver": "spec.dns.servers", "searchdomain": "spec.dns.domain",
			"ciuser": "spec.cloudInit.proxmox.user", "sshkeys": "spec.cloudInit.proxmox.sshAuthorizedKeys",
			"cicustom": "spec.cloudInit.proxmox.vendorSnippet or userSnippet",
		})
	}
	for param, field := range fields {
		if paramMessage(err, param) != "" {
			return field
		}
	}
	return "spec"
}

// configBody is the config update of the configure step.
func (c *ensureCall) configBody(v *verified) (map[string]any, error) {
	body := map[string]any{}
	if c.spec.CPUCores > 0 {
		body["cores"] = c.spec.CPUCores
	}
	if c.spec.MemoryBytes > 0 {
		body["memory"] = strconv.FormatInt(c.spec.MemoryBytes>>20, 10)
	}
	n := parseNet(v.cfg["net0"])
	if c.spec.Network.Model != "" || n.model == "" {
		n.model = c.spec.Network.Model
		if n.model == "" {
			n.model = "virtio"
		}
	}
	if c.spec.Network.MACAddress != "" {
		n.mac = strings.ToUpper(c.spec.Network.MACAddress)
	}
	switch {
	case c.spec.Network.Bridge != "":
		n.bridge = c.spec.Network.Bridge
	case c.p.cfg.DefaultBridge != "":
		n.bridge = c.p.cfg.DefaultBridge
	case n.bridge == "":
		n.bridge = "vmbr0"
	}
	n.tag = ""
	if c.spec.Network.VLAN > 0 {
		n.tag = strconv.Itoa(c.spec.Network.VLAN)
	}
	if c.spec.Isolation != nil {
		// Proxmox filters a NIC only with firewall=1.
		n.rest = slices.DeleteFunc(n.rest, func(o string) bool { return strings.HasPrefix(o, "firewall=") })
		n.rest = append(n.rest, "firewall=1")
	}
	body["net0"] = n.String()
	if err := c.tpmConfig(body, v.cfg); err != nil {
		return nil, err
	}
	c.deviceConfig(body, v.cfg)
	if c.spec.Native != nil {
		if err := nativeConfig(body, c.spec.Native, v.cfg); err != nil {
			return nil, err
		}
		return c.finishConfigBody(body, v), nil
	}
	volid := c.p.isoVolid(c.prog.VMID, c.spec.Owner.UID)
	slot := v.cfg.isoSlot(volid)
	if slot == "" {
		var ok bool
		if slot, ok = v.cfg.chooseISOSlot(); !ok {
			return nil, provider.Errorf(provider.ClassConfiguration, "NoFreeIDESlot",
				"%s: every IDE slot of the template is a disk; free one (ide0-ide3) for the cloud-init CD-ROM", fieldTemplateID)
		}
	}
	body[slot] = volid + ",media=cdrom"
	return c.finishConfigBody(body, v), nil
}

// tpmConfig adds a new TPM 2.0 state to the configuration update when the
// spec asks for one, in Proxmox's allocation syntax "<storage>:<size>"
// (qemu-server allocates 4 MiB whatever the size says: TPMSTATE_DISK_SIZE
// in src/PVE/QemuServer/Drive.pm). It goes to the boot disk's storage:
// that storage holds VM images on the VM's node already, and every
// Proxmox storage type holds raw volumes, the TPM state's format. A
// tpmstate0 the clone copied from its template is replaced (Proxmox keeps
// it as unusedN and destroys it with the VM): it may carry the
// template's endorsement key (docs/templates.md, "TPM"). The state is
// empty until the VM's first start, when Proxmox's start_swtpm
// manufactures it with the VM's own endorsement key.
func (c *ensureCall) tpmConfig(body map[string]any, cfg vmConfig) error {
	if c.spec.TPM == nil || !c.spec.TPM.Add {
		return nil
	}
	key, _ := cfg.bootDisk()
	storage := ""
	if key != "" {
		storage = parseDrive(cfg[key]).storage()
	}
	if storage == "" {
		return provider.Errorf(provider.ClassConfiguration, "NoTPMStorage",
			"%s: the VM has no boot disk on a Proxmox storage to hold its TPM state; give the template a boot disk on a storage, or clear addVirtualTPM and add tpmstate0 to the template", fieldAddTPM)
	}
	body[tpmKey] = storage + ":1,version=v2.0"
	return nil
}

// finishConfigBody adds the name, the tags and the description.
func (c *ensureCall) finishConfigBody(body map[string]any, v *verified) map[string]any {
	// The name and the tags change in one update: the VM is findable by
	// one or the other at every moment.
	body["name"] = c.spec.Name
	body["tags"] = strings.Join(normalizeTags(c.p.signer.Tags(), c.p.cfg.Tags, c.spec.Tags), ";")
	// Rewritten with the verified record (same VM id and creation time),
	// so the spec's text is current and the block still verifies.
	body["description"] = c.marker.Description(c.spec.Description, v.rec)
	return body
}

// resize grows the boot disk (a task).
func (c *ensureCall) resize(ctx context.Context, disk string) (*provider.EnsureResult, error) {
	upid, err := c.p.api.upid(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/resize", c.prog.Node, c.prog.VMID), nil,
		map[string]any{"disk": disk, "size": formatSizeArg(c.spec.DiskBytes)})
	if err != nil {
		if isLock(err) {
			return c.result(provider.PhaseConfiguring, lockedVM, "VM %d is locked; retrying the resize", c.prog.VMID), nil
		}
		return nil, fmt.Errorf("resize disk %s of VM %d: %w", disk, c.prog.VMID, err)
	}
	c.setTask(opResize, upid)
	return c.result(provider.PhaseConfiguring, c.pollDelay(), "growing disk %s to %s", disk, formatSizeArg(c.spec.DiskBytes)), nil
}

// start powers the VM on (a task).
func (c *ensureCall) start(ctx context.Context) (*provider.EnsureResult, error) {
	if wait, at, cause := c.p.backoffWait(c.prog.VMID); wait > 0 {
		// A call before the backoff is over (the claim woken by its own
		// status write) must not start again: each refusal doubles the
		// wait, and a claim retried on every wake-up was seen waiting a
		// minute for a lock that lasted 0.7 s (property 8's test,
		// TestRetryAndErrorHandlingProperty in internal/controller).
		return c.result(provider.PhaseStarting, wait, "retrying the start at %s after: %s", retryTime(at), cause), nil
	}
	upid, err := c.p.api.upid(ctx, http.MethodPost, fmt.Sprintf("/nodes/%s/qemu/%d/status/start", c.prog.Node, c.prog.VMID), nil, nil)
	if err != nil {
		if isLock(err) {
			wait := c.p.backoffAfterFailure(c.prog.VMID, fmt.Sprintf("VM %d is locked", c.prog.VMID))
			return c.result(provider.PhaseStarting, wait, "VM %d is locked; retrying the start in %s", c.prog.VMID, wait.Round(time.Millisecond)), nil
		}
		return nil, fmt.Errorf("start VM %d: %w", c.prog.VMID, err)
	}
	c.setTask(opStart, upid)
	c.log.V(1).Info("Starting VM")
	return c.result(provider.PhaseStarting, c.pollDelay(), "starting VM %d", c.prog.VMID), nil
}

// Agent errors that mean "not yet" while a VM boots.
var agentNotYet = []string{"QEMU guest agent is not running", "guest agent is not running", "got timeout", "not ready"}

// booting polls the guest agent of a started VM. Once the guest reports an
// address, the ISO is ejected (the guest has read it); a VM that powered
// off before that is Stopped.
func (c *ensureCall) booting(ctx context.Context) (*provider.EnsureResult, error) {
	addrs, mac, err := c.p.guest(ctx, c.prog.Node, c.prog.VMID, c.spec.Network.MACAddress)
	msg := apiMessage(err)
	switch {
	case err == nil:
	case containsAny(msg, agentNotYet) || reasonOf(err) == "LockTimeout":
		return c.result(provider.PhaseBooting, c.bootDelay(), "waiting for the guest agent"), nil
	case strings.Contains(msg, "is not running"):
		// "VM N is not running": the guest powered off before it reported.
		// Eject the ISO so the hypervisor shows that the VM has run.
		return c.eject(ctx, provider.PhaseStopped, nil, "")
	case strings.Contains(msg, "No QEMU guest agent configured"):
		return nil, provider.Errorf(provider.ClassConfiguration, "NoGuestAgent",
			"%s: the template has no QEMU guest agent (agent: 1), so the VM's addresses cannot be read; enable it in the template: %w", fieldTemplateID, err)
	default:
		return nil, fmt.Errorf("read the guest addresses of VM %d: %w", c.prog.VMID, err)
	}
	if len(addrs) > 0 {
		if err := c.p.allowLeased(ctx, c.prog.Node, c.prog.VMID, c.spec.Isolation, addrs); err != nil {
			return nil, fmt.Errorf("let VM %d send from its leased address: %w", c.prog.VMID, err)
		}
	}
	if len(addrs) == 0 {
		return c.result(provider.PhaseBooting, c.bootDelay(), "the guest agent answers; waiting for an address"), nil
	}
	return c.eject(ctx, provider.PhaseBooting, addrs, mac)
}

// bootDelay is when to ask the guest agent again.
func (c *ensureCall) bootDelay() time.Duration {
	if c.prog.Task == nil {
		return bootPoll
	}
	return min(max(c.p.clock.Since(c.prog.Task.StartTime)/8, bootPoll), maxBootPoll)
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// eject detaches the ISO from the VM (after re-verifying the marker).
func (c *ensureCall) eject(ctx context.Context, phase provider.Phase, addrs []string, mac string) (*provider.EnsureResult, error) {
	cfg, err := c.p.api.config(ctx, c.prog.Node, c.prog.VMID)
	if isNotFound(err) {
		c.prog.Task = nil
		return c.derive(ctx)
	}
	if err != nil {
		return nil, err
	}
	if _, err := c.p.verifyOwner(c.marker, cfg, c.prog.VMID, c.spec.Owner); err != nil {
		return c.replace(ctx, err)
	}
	// Suspended while it booted: no eject until it is resumed (Proxmox
	// changes no config of a suspended VM).
	if res := c.suspendedResult(cfg); res != nil {
		return res, nil
	}
	slot := c.seedSlot(cfg)
	if slot != "" {
		body := map[string]any{slot: "none,media=cdrom"}
		if c.spec.Native != nil {
			// Proxmox's drive is removed, not emptied: it holds no file of
			// this install's. On a running VM Proxmox keeps the removal
			// pending until the VM stops, and its config shows the VM
			// without it (GET config gives pending values).
			body = map[string]any{"delete": slot}
		}
		err := c.p.api.call(ctx, http.MethodPut, fmt.Sprintf("/nodes/%s/qemu/%d/config", c.prog.Node, c.prog.VMID), nil, body, nil)
		if isLock(err) {
			return c.result(phase, lockedVM, "VM %d is locked; retrying to eject the cloud-init ISO", c.prog.VMID), nil
		}
		if err != nil {
			return nil, fmt.Errorf("eject the cloud-init ISO of VM %d: %w", c.prog.VMID, err)
		}
	}
	c.prog.Task = nil
	// The file still holds the cloud-init data: delete it now, without
	// waiting for that task here. This process follows it (the in-flight
	// task of the VM): DeleteVM reads it before the VM goes, and a lost
	// one leaves the file to DeleteVM's own check.
	if c.spec.Native == nil {
		c.deleteISOAfterEject(ctx)
	}
	c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
	if phase == provider.PhaseStopped {
		// A stopped VM may be kept for debugging; the ejected ISO shows
		// that it has run, so it is never started again.
		return c.result(phase, 0, "VM %d powered off before its guest reported an address; its cloud-init ISO is ejected and being deleted", c.prog.VMID), nil
	}
	res := c.result(provider.PhaseRunning, 0, "VM %d is running at %s", c.prog.VMID, strings.Join(addrs, ", "))
	res.Addresses, res.MACAddress = addrs, mac
	c.log.V(1).Info("VM is running", "addresses", addrs)
	return res, nil
}

// deleteISOAfterEject starts the deletion of the VM's ejected ISO file,
// unless this process already deleted it. A refused deletion is not the
// VM's failure: DeleteVM checks for the file and deletes it before the
// claim goes, and the orphan sweep covers a file whose claim is gone.
func (c *ensureCall) deleteISOAfterEject(ctx context.Context) {
	c.p.mu.Lock()
	gone := c.p.isoGone[c.prog.VMID]
	c.p.mu.Unlock()
	if gone {
		return
	}
	upid, err := c.p.deleteISO(ctx, c.prog.Node, c.prog.VMID, c.spec.Owner.UID)
	if err != nil {
		c.log.Info("Could not delete the cloud-init ISO after ejecting it; it is deleted with the VM", "err", err.Error())
		return
	}
	c.p.setInflight(c.prog.VMID, c.spec.Owner.UID, &provider.Task{ID: upid, Operation: opISODelete, StartTime: c.p.clock.Now()})
}

// cleanupISO deletes the ISO file of a VM that has ejected it, then reports
// Running or Stopped.
func (c *ensureCall) cleanupISO(ctx context.Context, running bool) (*provider.EnsureResult, error) {
	present, err := c.isoPresent(ctx)
	if err != nil {
		return nil, err
	}
	if !present {
		c.p.noteISOGone(c.prog.VMID)
		if running {
			return c.running(ctx)
		}
		c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
		return c.result(provider.PhaseStopped, 0, "VM %d has run and is powered off", c.prog.VMID), nil
	}
	upid, err := c.p.deleteISO(ctx, c.prog.Node, c.prog.VMID, c.spec.Owner.UID)
	if err != nil {
		return nil, err
	}
	c.setTask(opISODelete, upid)
	phase := provider.PhaseBooting
	if !running {
		phase = provider.PhaseStopped
	}
	return c.result(phase, c.pollDelay(), "deleting the cloud-init ISO"), nil
}

// startISODelete starts deleting the cloud-init ISO of prog's VM if the
// file is still there, and records the task in prog; started is false when
// there was no file to delete. DeleteVM and media removal share it.
func (p *Provider) startISODelete(ctx context.Context, owner string, prog *progress) (started bool, err error) {
	present, err := p.isoPresent(ctx, prog.Node, prog.VMID, owner)
	if err != nil || !present {
		return false, err
	}
	upid, err := p.deleteISO(ctx, prog.Node, prog.VMID, owner)
	if err != nil {
		return false, err
	}
	prog.Task = &provider.Task{ID: upid, Operation: opISODelete, StartTime: p.clock.Now()}
	return true, nil
}

func (p *Provider) deleteISO(ctx context.Context, node string, vmid int, owner string) (string, error) {
	volid := p.isoVolid(vmid, owner)
	upid, err := p.api.upid(ctx, http.MethodDelete,
		fmt.Sprintf("/nodes/%s/storage/%s/content/%s", node, p.isoStorage, volid), nil, nil)
	if err != nil {
		return "", fmt.Errorf("delete the cloud-init ISO %s: %w", volid, err)
	}
	return upid, nil
}

// running reports the VM's addresses once its ISO is gone.
func (c *ensureCall) running(ctx context.Context) (*provider.EnsureResult, error) {
	addrs, mac, err := c.p.guest(ctx, c.prog.Node, c.prog.VMID, c.spec.Network.MACAddress)
	msg := apiMessage(err)
	switch {
	case err == nil && len(addrs) > 0:
		// A lease renewed after a resume may be a new address.
		if err := c.p.allowLeased(ctx, c.prog.Node, c.prog.VMID, c.spec.Isolation, addrs); err != nil {
			return nil, fmt.Errorf("let VM %d send from its leased address: %w", c.prog.VMID, err)
		}
		c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
		// Running means nothing is in flight: drop the finished ISO
		// deletion task this call may have been continuing from.
		c.prog.Task = nil
		res := c.result(provider.PhaseRunning, 0, "VM %d is running at %s", c.prog.VMID, strings.Join(addrs, ", "))
		res.Addresses, res.MACAddress = addrs, mac
		c.log.V(1).Info("VM is running", "addresses", addrs)
		return res, nil
	case err == nil || containsAny(msg, agentNotYet):
		return c.result(provider.PhaseBooting, bootPoll, "the guest agent reports no address"), nil
	case strings.Contains(msg, "is not running"):
		// Powered off, or suspended to disk: its config says which.
		cfg, err := c.p.api.config(ctx, c.prog.Node, c.prog.VMID)
		if err != nil {
			return nil, err
		}
		if res := c.suspendedResult(cfg); res != nil {
			return res, nil
		}
		c.p.release(c.spec.Owner.UID, c.prog.VMID, true)
		c.prog.Task = nil
		return c.result(provider.PhaseStopped, 0, "VM %d has run and is powered off", c.prog.VMID), nil
	}
	return nil, fmt.Errorf("read the guest addresses of VM %d: %w", c.prog.VMID, err)
}

// guest reads the guest agent's addresses.
func (p *Provider) guest(ctx context.Context, node string, vmid int, mac string) ([]string, string, error) {
	ifaces, err := p.api.agentInterfaces(ctx, node, vmid)
	if err != nil {
		return nil, "", err
	}
	list := make([]agentIface, 0, len(ifaces))
	for _, ifc := range ifaces {
		if ifc == nil {
			continue
		}
		a := agentIface{mac: ifc.HardwareAddress}
		for _, ip := range ifc.IPAddresses {
			if ip != nil {
				a.addrs = append(a.addrs, ip.IPAddress)
			}
		}
		list = append(list, a)
	}
	addrs, hw := guestAddresses(list, mac)
	return addrs, hw, nil
}

// locate finds the node of a VM from the cluster listing.
func (p *Provider) locate(ctx context.Context, vmid int) (string, error) {
	rs, err := p.api.resources(ctx, "vm")
	if err != nil {
		return "", err
	}
	p.noteListing(rs)
	for _, r := range rs {
		if r.VMID == vmid && r.Type == "qemu" {
			return r.Node, nil
		}
	}
	return "", provider.Errorf(provider.ClassPermanent, "NotFound", "%w: VM %d is not in the cluster's VM list", provider.ErrNotFound, vmid)
}
