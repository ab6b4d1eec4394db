package machineclaim

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// claimMemory is everything this process remembers about a claim beyond
// its stored status, by claim UID: one record per claim, so that Forget
// drops all of it at once and a memory added to claimRecord cannot be left
// behind when the claim goes. Losing it (a restart) costs at most a
// repeated, idempotent step; each field says which. The zero value is
// ready to use.
type claimMemory struct {
	mu     sync.Mutex
	claims map[types.UID]*claimRecord
}

// claimRecord is what is remembered about one claim.
type claimRecord struct {
	// failures counts the claim's transient failures in a row (backoff).
	failures int
	// retryAt is when a claim whose provider step failed transiently may
	// call the provider again: a wake-up before then waits it out
	// (ensureVM).
	retryAt time.Time
	// held holds a claim whose provider step failed for a reason its user
	// must fix: wake-ups that change none of its inputs do not call the
	// provider again (ensureVM).
	held *heldProvision
	// progress is the provider progress of the claim's VM with its
	// hypervisor task in flight, which the status does not record
	// (vm_progress.go); losing it costs the provider a read.
	progress *provider.Progress
	// minted is the runner credential issued and not yet placed in the
	// claim's VM (guestsecrets.go); losing it costs a new registration,
	// which replaces the lost one.
	minted *workload.Credential
	// dnsRegistered is the registration last written (the registrar's
	// key, the name and the addresses), so that a running claim's passes
	// do not ask the DNS server again; dnsRemoveFailures counts the
	// failed removals of an ending claim's records (dns.go).
	dnsRegistered     string
	dnsRemoveFailures int
	// deletedGone is set once a pass deleted the claim without its
	// finalizer (finish): the cache may still show it, and such a copy
	// must not be torn down a second time.
	deletedGone bool
	// heldEnd is the routine end not written to the claim's status, with
	// the status it belongs to (end_held.go).
	heldEnd *hfv1.MachineClaimStatus
	// validating is set while a validation round of the claim runs;
	// validated is the round finished and not yet recorded
	// (validation.go).
	validating bool
	validated  *validationRound
	// addressesReread is set once a resumed claim read its VM's addresses
	// again after the guest renewed its DHCP leases (standby.go).
	addressesReread bool
}

// edit runs f on the claim's record, creating it.
func (m *claimMemory) edit(uid types.UID, f func(*claimRecord)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.claims[uid]
	if !ok {
		if m.claims == nil {
			m.claims = map[types.UID]*claimRecord{}
		}
		rec = &claimRecord{}
		m.claims[uid] = rec
	}
	f(rec)
}

// change runs f on the claim's record if there is one (clearing a memory
// of a claim with none creates nothing).
func (m *claimMemory) change(uid types.UID, f func(*claimRecord)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.claims[uid]; ok {
		f(rec)
	}
}

// recall is a copy of the claim's record; the zero record when nothing is
// remembered.
func (m *claimMemory) recall(uid types.UID) claimRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rec, ok := m.claims[uid]; ok {
		return *rec
	}
	return claimRecord{}
}

// Forget drops everything remembered about the claim: it is gone, or its
// name was taken by a new claim. A validation round still running is
// dropped when it ends (finishRound).
func (m *claimMemory) Forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.claims, uid)
}

// remembers reports whether anything is remembered about the claim.
func (m *claimMemory) remembers(uid types.UID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.claims[uid]
	return ok
}

// failed counts one more transient failure of the claim and returns how
// many came before it.
func (m *claimMemory) failed(uid types.UID) (before int) {
	m.edit(uid, func(r *claimRecord) { before = r.failures; r.failures++ })
	return before
}

// succeeded ends the claim's run of failures: its backoff starts over.
func (m *claimMemory) succeeded(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.failures = 0 })
}

// rereadAddresses reports whether the claim's resumed VM's addresses are
// still to be read again after its lease renewal, and marks them read.
func (m *claimMemory) rereadAddresses(uid types.UID) bool {
	first := false
	m.edit(uid, func(r *claimRecord) { first, r.addressesReread = !r.addressesReread, true })
	return first
}

// provisioned clears what a failed provider step left: the backoff, the
// retry time and a hold for the user.
func (m *claimMemory) provisioned(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.failures, r.retryAt, r.held = 0, time.Time{}, nil })
}

func (m *claimMemory) setRetryAt(uid types.UID, at time.Time) {
	m.edit(uid, func(r *claimRecord) { r.retryAt = at })
}

func (m *claimMemory) hold(uid types.UID, h heldProvision) {
	m.edit(uid, func(r *claimRecord) { r.held = &h })
}

func (m *claimMemory) release(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.held = nil })
}

// keepProgress keeps p as the claim's progress; a progress without a VM
// drops it.
func (m *claimMemory) keepProgress(uid types.UID, p provider.Progress) {
	if p.ID == "" {
		m.change(uid, func(r *claimRecord) { r.progress = nil })
		return
	}
	m.edit(uid, func(r *claimRecord) { r.progress = &p })
}

func (m *claimMemory) putMinted(uid types.UID, cred workload.Credential) {
	m.edit(uid, func(r *claimRecord) { r.minted = &cred })
}

func (m *claimMemory) dropMinted(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.minted = nil })
}

func (m *claimMemory) registeredDNS(uid types.UID, done string) {
	m.edit(uid, func(r *claimRecord) { r.dnsRegistered = done })
}

// dnsRemoveFailed counts one more failed removal of the claim's records
// and returns how many there were, this one included.
func (m *claimMemory) dnsRemoveFailed(uid types.UID) (n int) {
	m.edit(uid, func(r *claimRecord) { r.dnsRemoveFailures++; n = r.dnsRemoveFailures })
	return n
}

// dnsDone forgets the claim's registration and its removal attempts: the
// records are removed, or abandoned to the sweep.
func (m *claimMemory) dnsDone(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.dnsRegistered, r.dnsRemoveFailures = "", 0 })
}

func (m *claimMemory) markDeletedGone(uid types.UID) {
	m.edit(uid, func(r *claimRecord) { r.deletedGone = true })
}

func (m *claimMemory) holdEnd(uid types.UID, st *hfv1.MachineClaimStatus) {
	m.edit(uid, func(r *claimRecord) { r.heldEnd = st })
}

func (m *claimMemory) dropHeldEnd(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.heldEnd = nil })
}

// startRound marks a validation round of the claim running; false when
// one already is.
func (m *claimMemory) startRound(uid types.UID) (started bool) {
	m.edit(uid, func(r *claimRecord) {
		started = !r.validating
		r.validating = true
	})
	return started
}

// finishRound keeps the round as the claim's finished one, unless the
// claim was forgotten, or its round dropped, while it ran.
func (m *claimMemory) finishRound(uid types.UID, round validationRound) {
	m.change(uid, func(r *claimRecord) {
		if r.validating {
			r.validating, r.validated = false, &round
		}
	})
}

// takeRound returns the claim's finished round, once, and whether one
// still runs.
func (m *claimMemory) takeRound(uid types.UID) (round validationRound, finished, running bool) {
	m.change(uid, func(r *claimRecord) {
		if r.validated != nil {
			round, finished = *r.validated, true
			r.validated = nil
		}
		running = r.validating
	})
	return round, finished, running
}

// dropRounds forgets the claim's rounds; one still running is dropped
// when it ends.
func (m *claimMemory) dropRounds(uid types.UID) {
	m.change(uid, func(r *claimRecord) { r.validating, r.validated = false, nil })
}

// mintedFor returns the credential issued for the claim if it is still
// the runner the claim's status records (a status write that was lost
// leaves another id there, and the credential is issued again).
func (m *claimMemory) mintedFor(claim *hfv1.MachineClaim) (workload.Credential, bool) {
	cred := m.recall(claim.UID).minted
	if cred == nil {
		return workload.Credential{}, false
	}
	if b := claim.Status.Bootstrap; b == nil || b.RunnerID != cred.RunnerID || b.RunnerName != cred.RunnerName {
		m.dropMinted(claim.UID)
		return workload.Credential{}, false
	}
	return *cred, true
}

// provisionPaused reports whether the claim must not call the provider
// yet, and for how long at most: its last step failed transiently and
// the backoff is not over (whatever woke the claim early, above all the
// failed pass's own status write whenever the error's text changed, as a
// dropped connection's does, must not call the hypervisor again, or the
// backoff paces nothing: found by property 8's test,
// TestRetryAndErrorHandlingProperty in internal/controller), or it waits
// for its user (heldForUser).
func (m *claimMemory) provisionPaused(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, now time.Time) (time.Duration, bool) {
	if at := m.recall(claim.UID).retryAt; !at.IsZero() {
		if wait := at.Sub(now); wait > 0 {
			return wait, true
		}
	}
	return m.heldForUser(claim, tmpl, cluster, now)
}

// heldForUser reports whether the claim still waits for its user after
// its last provider step failed for a reason only the user can fix, and
// for how long at most. Only a change of the claim, its template or its
// cluster (their specs), or the hold's end, lets it call the hypervisor
// again; the failed pass's own status write, a listing or a clone slot
// freed does not (each was a new attempt before: property 8's test,
// TestRetryAndErrorHandlingProperty in internal/controller, saw three in a
// second under load).
func (m *claimMemory) heldForUser(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, now time.Time) (time.Duration, bool) {
	held := m.recall(claim.UID).held
	if held == nil {
		return 0, false
	}
	if wait := held.until.Sub(now); wait > 0 && held.same(claim, tmpl, cluster) {
		return wait, true
	}
	m.release(claim.UID)
	return 0, false
}

// heldProvision is a claim held after a configuration error: the
// generations of its inputs when it failed, and when the hold ends.
type heldProvision struct {
	claim, template, cluster int64
	until                    time.Time
}

// configurationHold is how long a claim whose provider step failed for a
// reason its user must fix waits for a change before it tries again
// anyway (a fix outside Kubernetes, on the hypervisor or in a Secret).
const configurationHold = 5 * time.Minute

// same reports whether the claim's inputs are those it failed with.
func (h heldProvision) same(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) bool {
	return h.claim == claim.Generation && h.template == tmpl.Generation && h.cluster == cluster.Generation
}
