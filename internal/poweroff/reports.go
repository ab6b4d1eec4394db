package poweroff

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// reportTTL bounds how long a report is kept: the pool asks about a claim
// within jobRecordGrace of its VM's power-off (seconds), so anything older
// is of no use.
const reportTTL = 5 * time.Minute

// maxReports bounds the reports kept, whatever the rate of notices.
const maxReports = 10000

// JobReports remembers the claims whose VM said, in its power-off notice,
// that its runner started a job (agentconfig.PowerOffNotice.JobStarted).
// The notice's token proves which claim's VM sent it, not that what it
// says is true, so the report decides nothing: it only lets a RunnerPool
// go on creating replacements while the job's record is on its way
// (docs/runnerpool.md, "Replacement backoff"); the claim still counts as a
// failure if no job record names its runner in time. In memory: after a
// restart the pool just waits for the records, as without reports. Safe
// for concurrent use.
type JobReports struct {
	mu sync.Mutex
	at map[types.UID]time.Time
}

// NewJobReports returns an empty set.
func NewJobReports() *JobReports { return &JobReports{at: map[types.UID]time.Time{}} }

// Add records that claim uid's VM reported a job started, at now.
func (r *JobReports) Add(uid types.UID, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) >= maxReports {
		for k, at := range r.at {
			if now.Sub(at) > reportTTL {
				delete(r.at, k)
			}
		}
		if len(r.at) >= maxReports {
			return
		}
	}
	r.at[uid] = now
}

// JobStarted reports whether claim uid's VM reported a job started within
// reportTTL of now. Nil-safe: a nil set knows nothing.
func (r *JobReports) JobStarted(uid types.UID, now time.Time) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[uid]
	if ok && now.Sub(at) > reportTTL {
		delete(r.at, uid)
		return false
	}
	return ok
}

// ReadyHints remembers the claims whose VM's agent said, in its ready
// hint, that it runs and waits for its secrets. A standby claim's VM is
// suspended once its agent has said so, so that a resume finds the agent
// already waiting and the credential can go in at once
// (internal/controller/machineclaim, standby.go). The hint decides only
// when the suspend happens, never anything secret: kept like JobReports,
// in memory, for reportTTL, bounded. Safe for concurrent use; nil knows
// nothing.
type ReadyHints struct{ r *JobReports }

// NewReadyHints returns an empty set.
func NewReadyHints() *ReadyHints { return &ReadyHints{r: NewJobReports()} }

// Add records that claim uid's agent said it is ready, at now.
func (h *ReadyHints) Add(uid types.UID, now time.Time) { h.r.Add(uid, now) }

// Heard reports whether claim uid's agent said it is ready within
// reportTTL of now.
func (h *ReadyHints) Heard(uid types.UID, now time.Time) bool {
	return h != nil && h.r.JobStarted(uid, now)
}

// TokenRefusals remembers the claims whose VM said, in its power-off
// notice, that the SPIRE server refused its join token
// (agentconfig.AttestationJoinTokenRefused). The VM's word alone decides
// nothing: the claim controller asks the SPIRE server whether an agent
// attested with that token before it reports the identity stolen
// (internal/controller/machineclaim, identity_misuse.go). Kept like JobReports: in memory, for
// reportTTL, bounded. Safe for concurrent use; nil knows nothing.
type TokenRefusals struct{ r *JobReports }

// NewTokenRefusals returns an empty set.
func NewTokenRefusals() *TokenRefusals { return &TokenRefusals{r: NewJobReports()} }

// Add records that claim uid's VM reported its join token refused, at now.
func (t *TokenRefusals) Add(uid types.UID, now time.Time) { t.r.Add(uid, now) }

// Refused reports whether claim uid's VM reported its join token refused
// within reportTTL of now.
func (t *TokenRefusals) Refused(uid types.UID, now time.Time) bool {
	return t != nil && t.r.JobStarted(uid, now)
}

// AttestationErrors remembers what claims' VMs said, in their power-off
// notices, about why they got no identity (agentconfig.PowerOffNotice's
// attestationError: JoinTokenRefused, TPMNotFound, ...). The claim
// controller words the claim's failure with it; like the other reports it
// decides nothing on its own. In memory, for reportTTL, bounded. Safe for
// concurrent use; nil knows nothing.
type AttestationErrors struct {
	mu sync.Mutex
	m  map[types.UID]attestationError
}

type attestationError struct {
	err string
	at  time.Time
}

// NewAttestationErrors returns an empty set.
func NewAttestationErrors() *AttestationErrors {
	return &AttestationErrors{m: map[types.UID]attestationError{}}
}

// Add records that claim uid's VM reported err at now.
func (a *AttestationErrors) Add(uid types.UID, err string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= maxReports {
		for k, e := range a.m {
			if now.Sub(e.at) > reportTTL {
				delete(a.m, k)
			}
		}
		if len(a.m) >= maxReports {
			return
		}
	}
	a.m[uid] = attestationError{err: err, at: now}
}

// Error is what claim uid's VM reported within reportTTL of now; empty
// when nothing.
func (a *AttestationErrors) Error(uid types.UID, now time.Time) string {
	if a == nil {
		return ""
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[uid]
	if !ok || now.Sub(e.at) > reportTTL {
		delete(a.m, uid)
		return ""
	}
	return e.err
}

// GuestRefusals remembers the claims whose VM's agent refused to run the
// job in it, as its power-off notice said (agentconfig.PowerOffNotice's
// guestRefusal: JobUserCanEscalate). The claim controller fails such a
// claim with the reason, so that the image is fixed instead of the pool
// replacing VMs that all refuse; like the other reports it is the VM's
// word, and it only words the end of a claim whose VM powered off anyway.
// Kept like AttestationErrors: in memory, for reportTTL, bounded. Safe for
// concurrent use; nil knows nothing.
type GuestRefusals struct{ said *AttestationErrors }

// NewGuestRefusals returns an empty set.
func NewGuestRefusals() *GuestRefusals { return &GuestRefusals{said: NewAttestationErrors()} }

// Add records that claim uid's VM refused its job for refusal, at now.
func (g *GuestRefusals) Add(uid types.UID, refusal string, now time.Time) {
	g.said.Add(uid, refusal, now)
}

// Refusal is why claim uid's VM refused its job, as it said within
// reportTTL of now; empty when it said nothing.
func (g *GuestRefusals) Refusal(uid types.UID, now time.Time) string {
	if g == nil {
		return ""
	}
	return g.said.Error(uid, now)
}
