package libvirt

import (
	"fmt"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Suspend to disk is libvirt's managed save. DomainManagedSave pauses the
// guest, writes its memory and device state to a file libvirtd keeps for
// the domain (on a root daemon /var/lib/libvirt/qemu/save/<name>.save),
// ends QEMU and leaves the domain shut off with that image; starting the
// domain restores the guest from the image and deletes it. Both calls
// return only once the memory is written or read back, seconds per
// gigabyte of guest memory: in the caller's call they would hold it past
// the cluster's RequestTimeout, and the watchdog would then close the
// host's connection with every call in flight on it (watchdog.go). They
// run in the background instead, as a full copy does (disk.go), exempt
// from the timeout, and SetPower returns at once with their task. While
// one runs, the domain is active (paused): GetVM reads it paused, EnsureVM
// Booting; a second request for the same change is nil (asked already), a
// request for the opposite one a transient error (the domain is busy),
// and a failed job's error is what the next request for its change gets,
// once (the domain stays as it was: libvirt resumes a guest whose save
// failed, and keeps the image of a restore that failed).
//
// A restore is started with DomainCreateWithFlags, which this provider
// calls for nothing else: the watchdog tells a restore, which it leaves
// unbounded, from a boot (DomainCreate), which it bounds.

// opDeleteSaved is the deletion step that removes a suspended VM's
// managed save image.
const opDeleteSaved = "delete-saved-state"

// suspendedPoll paces EnsureVM's calls for a suspended VM: nothing
// changes until the caller resumes it, so a slow poll only keeps a caller
// that honours RetryAfter from spinning.
const suspendedPoll = time.Minute

// powerJob is a managed save or a restore running in the background.
type powerJob struct {
	// action is PowerSuspend or PowerResume (a PowerOn of a suspended
	// domain is a resume).
	action provider.PowerAction
	// done is closed when libvirt's call returned; err is its error.
	done chan struct{}
	err  error
}

// running says whether the job's call has not returned yet.
func (j *powerJob) running() bool {
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}

// jobAction is the kind of power job action starts or waits for: a
// PowerOn of a suspended domain is a resume.
func jobAction(action provider.PowerAction) provider.PowerAction {
	if action == provider.PowerOn {
		return provider.PowerResume
	}
	return action
}

// pendingPower answers a suspend or a resume of d while this process's
// job for d runs or has failed: handled says it did. A job of the same
// kind in flight is nil (asked already), one of the other kind a
// transient error; a failed job of the same kind returns its error, once.
// A finished job is forgotten.
func (p *Provider) pendingPower(d *domain, action provider.PowerAction) (handled bool, err error) {
	want := jobAction(action)
	if want != provider.PowerSuspend && want != provider.PowerResume {
		return false, nil
	}
	key := d.key()
	p.mu.Lock()
	defer p.mu.Unlock()
	job := p.powerJobs[key]
	switch {
	case job == nil:
		return false, nil
	case job.running() && job.action == want:
		return true, nil
	case job.running():
		return true, busy(d.meta.ID, job.action)
	}
	delete(p.powerJobs, key)
	if job.err != nil && job.action == want {
		return true, job.err
	}
	return false, nil
}

// busy is the answer to a suspend or a resume of VM vmid while the
// opposite change, action, runs.
func busy(vmid int, action provider.PowerAction) error {
	doing := "resumed from its saved state"
	if action == provider.PowerSuspend {
		doing = "suspended to disk"
	}
	return provider.Errorf(provider.ClassTransient, "Busy", "VM %d is being %s; ask again once that has ended", vmid, doing)
}

// startPowerJob runs call, a managed save or a restore of d, in the
// background. A call that fails keeps its error, classified by wrap, for
// the next request of its kind; one that succeeds leaves nothing behind.
func (p *Provider) startPowerJob(d *domain, action provider.PowerAction, call func() error, wrap func(error) error) {
	key := d.key()
	job := &powerJob{action: jobAction(action), done: make(chan struct{})}
	p.mu.Lock()
	p.powerJobs[key] = job
	p.mu.Unlock()
	go func() {
		err := call()
		if err != nil {
			err = wrap(err)
			p.log.Error(err, "Background power change failed; the next request for it returns the error", "host", d.host.Name, "domain", d.dom.Name, "action", job.action)
		}
		p.mu.Lock()
		if job.err = err; err == nil && p.powerJobs[key] == job {
			delete(p.powerJobs, key)
		}
		p.mu.Unlock()
		close(job.done)
	}()
}

// suspend starts the managed save of the running domain d and returns its
// task. A shutdown kept for d's guest agent is dropped first: a guest
// resumed later is not shut down by a request made before it was saved.
// The guest comes back running even if it was paused (DomainSaveRunning).
func (p *Provider) suspend(l *golibvirt.Libvirt, d *domain) *provider.Task {
	vmid := d.meta.ID
	p.keepShutdown(d.key(), false)
	p.startPowerJob(d, provider.PowerSuspend,
		func() error { return l.DomainManagedSave(d.dom, uint32(golibvirt.DomainSaveRunning)) },
		func(err error) error {
			return classify(fmt.Errorf("suspend VM %d to disk on host %s: %w", vmid, d.host.Name, err))
		})
	return p.task(d.host, vmid, string(provider.PowerSuspend))
}

// resume starts the restore of the suspended domain d (action is
// PowerResume or PowerOn) and returns its task.
func (p *Provider) resume(l *golibvirt.Libvirt, d *domain, action provider.PowerAction) *provider.Task {
	vmid := d.meta.ID
	p.keepShutdown(d.key(), false)
	p.startPowerJob(d, action,
		func() error {
			_, err := l.DomainCreateWithFlags(d.dom, 0)
			return err
		},
		func(err error) error {
			return p.startError(vmid, d.host, fmt.Errorf("resume from its saved state: %w", err))
		})
	return p.task(d.host, vmid, string(action))
}

// savingElsewhere says whether d is paused for a managed save this
// process did not start (one of a process before a restart, or an
// admin's virsh managedsave).
func (d *domain) savingElsewhere() bool {
	return d.state == golibvirt.DomainPaused && golibvirt.DomainPausedReason(d.reason) == golibvirt.DomainPausedSave
}

// readSaved sets d.saved from libvirt: whether d, shut off, has a managed
// save image.
func (d *domain) readSaved(l *golibvirt.Libvirt) error {
	d.saved = false
	if d.running() {
		return nil
	}
	has, err := l.DomainHasManagedSaveImage(d.dom, 0)
	if err != nil {
		return classify(fmt.Errorf("read whether domain %s on host %s is suspended: %w", d.dom.Name, d.host.Name, err))
	}
	d.saved = has == 1
	return nil
}

// suspended is EnsureVM's answer for a suspended VM: no write and no
// task. The VM holds no host memory, so a reservation still held for it
// (it was suspended before it ran to Running) goes.
func (p *Provider) suspended(o provider.Owner, d *domain, res *provider.EnsureResult) *provider.EnsureResult {
	p.forget(o)
	res.Phase, res.Progress.Task, res.RetryAfter = provider.PhaseSuspended, nil, suspendedPoll
	res.Message = fmt.Sprintf("VM %d is suspended to disk on host %s", d.meta.ID, d.host.Name)
	return res
}

// releaseSavedState gives the saved state of the suspended domain d the
// release DisownVM writes into its definition: a restore takes the
// domain's live definition, with its metadata, from the image, and a
// guest resumed with the owner's ownership block would read as the
// owner's again. released says it wrote (one write); false when the
// image's block does not verify for owner (released already, or never
// HyperFleet's).
func (p *Provider) releaseSavedState(d *domain, owner provider.Owner) (released bool, err error) {
	l, err := d.host.client()
	if err != nil {
		return false, err
	}
	doc, err := l.DomainManagedSaveGetXMLDesc(d.dom, golibvirt.DomainXMLSecure)
	if err != nil {
		return false, classify(fmt.Errorf("read the saved state of VM %d on host %s: %w", d.meta.ID, d.host.Name, err))
	}
	x, err := parseDomain(doc)
	if err != nil {
		return false, err
	}
	meta, err := parseMeta(x.Metadata)
	if err != nil {
		return false, nil //nolint:nilerr // no HyperFleet metadata in the image: nothing of the install's to release
	}
	rec, err := p.signer.Verify(meta.Description, meta.ID)
	if err != nil || rec.UID != owner.UID {
		return false, nil //nolint:nilerr // the image holds no block of owner's: released already
	}
	if err := setMeta(x, p.releasedMeta(meta, rec)); err != nil {
		return false, err
	}
	if x.Title == "" {
		x.Title = disownedTitle(meta.ID)
	}
	out, err := x.Marshal()
	if err != nil {
		return false, fmt.Errorf("render the saved state of VM %d: %w", d.meta.ID, err)
	}
	if err := l.DomainManagedSaveDefineXML(d.dom, golibvirt.OptString{out}, 0); err != nil {
		return false, classify(fmt.Errorf("write the saved state of VM %d on host %s: %w", d.meta.ID, d.host.Name, err))
	}
	return true, nil
}

// releasedMeta is meta as DisownVM leaves it: without the install's tags,
// the ownership block replaced by the release note of rec.
func (p *Provider) releasedMeta(meta vmMeta, rec ownership.Record) vmMeta {
	out := meta
	out.Tags = withoutInstallTags(p.signer, meta.Tags)
	out.Description = p.signer.ReleasedDescription(meta.Description, rec, p.clock.Now())
	return out
}
