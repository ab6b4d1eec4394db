package machineclaim

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// A runner and its one job. Claims bound to one job (docs/buildkite.md,
// "One job per VM"): on a
// platform that gives every VM a credential for one job only (Buildkite's
// job acquisition token), a warm claim, bound to no job, gets none. Its VM
// boots and stands by; its RunnerPool binds it a queued job when one
// arrives, and only then is the job's credential issued and placed, as
// for any claim. Once the claim's runner registered, what the operator
// keeps on the platform for issuing it (Buildkite: the claim's cluster
// agent token) is deleted. A runner whose credential could serve more
// than one job is sealed to the first it takes (seal).

// JobBinder is implemented by the CI platforms (CIPlatforms) that bind
// every VM to one job (internal/workloads): WaitsForJob reports whether
// the claim's VM is to wait, with no credential, for its pool to bind it a
// job.
type JobBinder interface {
	WaitsForJob(claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) bool
}

// RegistrationRetirer is implemented by the CI platforms (CIPlatforms)
// whose provider keeps a credential of its own for issuing a runner's
// (internal/workloads): RetireRegistration deletes it once the runner
// registered, and reports whether it deleted anything.
type RegistrationRetirer interface {
	RetireRegistration(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (bool, error)
}

// waitsForJob reports whether the claim's VM waits for its pool to bind it
// a job (JobBinder): no credential is asked for, issued or placed for it
// until then.
func (s *claimScope) waitsForJob() bool {
	b, ok := s.ci.(JobBinder)
	return ok && s.tmpl != nil && b.WaitsForJob(s.claim, s.tmpl)
}

// standBy records a warm VM that stands by for a job: its VM runs (and,
// in a template that attests, attested), and its claim is bound to no job.
// The claim is then Bootstrapped, reason WaitingForJob, which its pool
// counts as idle capacity and binds a job to; status.bootstrap.registeredAt
// says since when, and idleTimeout counts from there (the credential
// issued once it is bound keeps it). A claim bound since it stood by says
// so until its credential's way to the VM (or its runner) speaks.
func (rs runnerService) standBy(s *claimScope) {
	claim := s.claim
	if !s.facts.isTrue(claim, hfv1.MachineClaimProvisionedCondition) || claim.Status.End != nil || claim.EndRequested() {
		return
	}
	if !s.waitsForJob() {
		if c := s.facts.condition(claim, hfv1.MachineClaimBootstrappedCondition); c != nil && c.Status == metav1.ConditionTrue && c.Reason == string(hfv1.WaitingForJobReason) {
			s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.WaitingForRunnerReason,
				"Bound to a job by its RunnerPool (spec.workloadConfig); waiting for the job's credential to reach the VM and its runner to come online")
		}
		return
	}
	if id := claim.Status.Identity; id != nil && id.AttestedAt == nil {
		// Standing by once it attested: the VM's agent asks for its
		// credential only then.
		return
	}
	st := claim.Status.Bootstrap
	if st == nil {
		st = &hfv1.BootstrapStatus{}
		claim.Status.Bootstrap = st
	}
	if st.RegisteredAt == nil {
		st.RegisteredAt = &metav1.Time{Time: s.clock.Now()}
	}
	if c := s.facts.condition(claim, hfv1.MachineClaimBootstrappedCondition); c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(hfv1.WaitingForJobReason) {
		msg := "The VM is up and stands by with no credential until its RunnerPool binds it a queued job (spec.workloadConfig); it then receives that job's credential"
		if claim.Spec.RunnerPoolRef == nil {
			msg = "The VM is up and stands by with no credential, but the claim has no RunnerPool, which alone binds claims to jobs: it never receives one. Delete it, and let a RunnerPool make the VMs of its jobs"
		}
		s.facts.record(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionTrue, hfv1.WaitingForJobReason, msg)
		s.recorder.Event(claim, corev1.EventTypeNormal, string(hfv1.WaitingForJobReason), msg)
	}
}

// retireRegistration deletes what the platform issued the claim's runner
// credential with (RegistrationRetirer), once the runner registered: its
// Bootstrapped condition says it came online (reason RunnerOnline), or it
// took a job. A platform that cannot be asked now is asked again after
// the claim's backoff (or its rate limit), and the pass goes on; the
// claim's end deletes it in any case (Release).
func (rs runnerService) retireRegistration(ctx context.Context, s *claimScope) phase.Result {
	claim := s.claim
	st := claim.Status.Bootstrap
	if st == nil || st.CredentialIssuedAt == nil || s.tmpl == nil || claim.Status.End != nil {
		return phase.Next()
	}
	c := s.facts.condition(claim, hfv1.MachineClaimBootstrappedCondition)
	if st.Job() == "" && (c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(hfv1.RunnerOnlineReason)) {
		return phase.Next()
	}
	rr, ok := s.ci.(RegistrationRetirer)
	if !ok {
		return phase.Next()
	}
	retired, res := s.askPlatform(ctx, func() (bool, error) { return rr.RetireRegistration(ctx, claim, s.tmpl) },
		"Cannot delete the registered runner's issuing credential yet; retrying", "runner", st.RunnerName)
	if retired {
		s.recorder.Event(claim, corev1.EventTypeNormal, "RegistrationRetired",
			fmt.Sprintf("Runner %s registered: the credential its runner credential was issued with is deleted, and neither registers anything again", st.RunnerName))
	}
	return res
}

// askPlatform makes one request of the claim's CI platform that may do
// nothing (done false). A platform that cannot be asked now is asked
// again after the claim's backoff or its rate limit (platformRetry), with
// the log line retrying and its keys; the pass goes on either way.
func (s *claimScope) askPlatform(ctx context.Context, call func() (bool, error), retrying string, keys ...any) (done bool, res phase.Result) {
	done, err := call()
	if err != nil {
		wait := s.platformRetry(err)
		ctrl.LoggerFrom(ctx).Info(retrying, append(keys, "retryIn", wait, "err", err.Error())...)
		return false, phase.Recheck(wait)
	}
	return done, phase.Next()
}

// RunnerSealer is implemented by the CI platforms (CIPlatforms) that seal a
// claim's runner to the job it took (internal/workloads): on a platform
// whose runner credential any process may poll with for more jobs
// (workload.Sealer), SealRunner stops the platform giving the runner
// another job, and reports whether there was anything to seal.
type RunnerSealer interface {
	SealRunner(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (bool, error)
}

// seal seals the claim's runner as soon as it is seen with its first
// job: the job's CIJob names the runner (a webhook or the resync said the
// job runs on it; runnerService.observe recorded the job), or the latest runner
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
	sealed, res := s.askPlatform(ctx, func() (bool, error) { return sealer.SealRunner(ctx, claim, s.tmpl) },
		"Cannot seal the runner to the job it took yet; retrying", "runner", st.RunnerName, "seen", how)
	if sealed {
		st.RunnerSealedAt = &metav1.Time{Time: s.clock.Now()}
	}
	return res
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
// the job runnerService.observe recorded, else a busy runner in the latest runner
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
