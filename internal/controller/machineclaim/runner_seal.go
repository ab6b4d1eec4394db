package machineclaim

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerSealer is implemented by the CI platforms (CIPlatforms) that seal a
// claim's runner to the job it took (internal/workloads): on a platform
// whose runner credential any process may poll with for more jobs
// (workload.Sealer), SealRunner stops the platform giving the runner
// another job, and reports whether there was anything to seal.
type RunnerSealer interface {
	SealRunner(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (bool, error)
}

// sealRunner seals the claim's runner as soon as it is seen with its first
// job: the job's CIJob names the runner (a webhook or the resync said the
// job runs on it; observeRunner recorded the job), or the latest runner
// list shows it busy. A job that copied its runner's multi-job credential
// out of the VM gets no other job from then on, while its own runs on
// (docs/security.md, "One job per credential"). The claim records it in
// status.bootstrap.runnerSealedAt (written with the pass's status, once),
// so a claim sealed before is not sealed again; one whose record a restart
// lost is sealed once more, which changes nothing. A platform that cannot
// be asked now is asked again after the claim's backoff (or its rate
// limit), and the pass goes on.
func (rs runnerService) seal(ctx context.Context, s *claimScope) phase.Result {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerSealedAt != nil || s.tmpl == nil || !rs.credentialReusable(s, s.tmpl) {
		return phase.Next()
	}
	how, seen := rs.jobSeen(s)
	if !seen {
		return phase.Next()
	}
	sealer, ok := s.ci.(RunnerSealer)
	if !ok {
		return phase.Next()
	}
	sealed, err := sealer.SealRunner(ctx, claim, s.tmpl)
	if err != nil {
		wait := s.platformRetry(err)
		ctrl.LoggerFrom(ctx).Info("Cannot seal the runner to the job it took yet; retrying", "runner", st.RunnerName, "seen", how, "retryIn", wait, "err", err.Error())
		return phase.Recheck(wait)
	}
	if sealed {
		st.RunnerSealedAt = &metav1.Time{Time: s.clock.Now()}
	}
	return phase.Next()
}

// credentialReusable reports whether the claim's runner credential can
// serve more than one job on its platform's side (the template's
// workload.Template.CredentialReuse, as its ReusableCredential condition
// shows it): only such a runner has anything to seal.
func (rs runnerService) credentialReusable(s *claimScope, tmpl *hfv1.HypervisorMachineTemplate) bool {
	claim := s.claim
	be, ok := s.workloads().Claim(claim, tmpl)
	if !ok {
		return false
	}
	t, ok := be.Template(tmpl)
	return ok && t.CredentialReuse != ""
}

// jobSeen says whether, and how, the claim's runner was seen with a job:
// the job observeRunner recorded, else a busy runner in the latest runner
// list.
func (rs runnerService) jobSeen(s *claimScope) (string, bool) {
	claim := s.claim
	if id := claim.Status.Bootstrap.Job(); id != "" {
		return "took job " + id, true
	}
	if obs, ok := rs.observations.Get(claim.UID); ok && obs.Present && obs.State == workload.RunnerBusy {
		return fmt.Sprintf("listed busy at %s", obs.At.UTC().Format("15:04:05")), true
	}
	return "", false
}
