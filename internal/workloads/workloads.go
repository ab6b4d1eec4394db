// Package workloads is the controllers' side of the CI platforms
// (Platforms): through the back-end of an object's workload type
// (pkg/workload), it issues and removes the runners of claims with the
// account their back-end builds, verifies pools' scopes, cancels jobs,
// resolves runner releases (runner_release.go), lists the scopes the orphan
// sweep checks (runner_scopes.go) and says whether a template's VMs get a
// reusable credential (credential_scope.go). It imports no platform package.
package workloads

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Platforms is the controllers' side of the CI platforms. For each object
// it finds the back-end of its workload type (pkg/workload) and, with the
// account that back-end builds from the template's credentials, issues and
// removes the runners of MachineClaims, verifies RunnerPools' scopes,
// cancels jobs, resolves runner releases and lists the scopes the orphan
// sweep checks. It is internal/controller/machineclaim's CIPlatforms,
// internal/controller's ScopeVerifier, JobCanceller, RunnerReleaseSource
// and PoolProviders, and
// sweeper.RunnerScopes, at once; the
// platforms' own credentials never leave their back-ends.
//
// Issuance is recoverable without keeping the credential anywhere: the
// runner name is derived from the claim, so if the operator restarts
// between registering a runner and delivering or recording it, the next
// attempt finds the name taken, removes that never-started runner and
// registers a new one. Its id is recorded in status.bootstrap with the
// status patch that follows the delivery (or the failed delivery attempt).
// A runner is removed that way only when it is provably this claim's
// (ownsRunner): a name the claim chose itself may be anyone's.
type Platforms struct {
	// Client reads templates' Secrets and RunnerPools.
	Client client.Reader
	// Backends are the CI platforms by workload type.
	Backends *workload.Backends
	// Signer marks default runner names as this install's
	// (ownership.Signer.RunnerName), which lets the orphan sweep remove a
	// runner whose claim is gone; nil leaves names unmarked and the
	// sweep never touches them.
	Signer *ownership.Signer

	// retired are the claims whose registration credential is gone
	// (binding.go).
	retired retired
}

// Workloads implements internal/controller/machineclaim's CIPlatforms:
// the back-ends, by workload type.
func (w *Platforms) Workloads() *workload.Backends { return w.Backends }

// BootstrapVars implements internal/controller/machineclaim's CIPlatforms: it fills
// in the runner part of the VM's cloud-init (the runner's name, marked as
// this install's, and labels), and issues nothing: the single-use
// credential is issued once the VM runs (RunnerCredential) and reaches
// the running VM only, never its seed (docs/security.md, "Nothing
// replayable at rest").
func (w *Platforms) BootstrapVars(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) error {
	be, ok := w.Backends.Claim(claim, tmpl)
	if !ok {
		return nil
	}
	pool, err := w.poolOf(ctx, claim)
	if err != nil {
		return workloadError(be, err)
	}
	vars.Labels = cloudinit.List(w.runnerLabels(be, claim, pool, tmpl))
	vars.RunnerName = w.runnerName(be, claim, vars.RunnerName)
	vars.RunnerGroup = runnerGroup(be, claim, claimScope(be, pool, tmpl), vars.RunnerGroup)
	return nil
}

// RunnerCredential issues the single-use credential of a claim whose VM
// runs: the operator places it in the VM through the hypervisor's guest
// channel, or, for a VM that attested, the credential broker hands it out
// or the secrets store holds it. It records what it issued in
// claim.Status.Bootstrap (the caller persists it).
func (w *Platforms) RunnerCredential(ctx context.Context, claim *hfv1.MachineClaim) (workload.Credential, error) {
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := w.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		return workload.Credential{}, fmt.Errorf("read the claim's HypervisorMachineTemplate: %w", err)
	}
	cluster := &hfv1.HypervisorCluster{}
	name := tmpl.Spec.HypervisorClusterRef.Name
	if ref := claim.Status.VMRef; ref != nil {
		name = ref.HypervisorCluster
	}
	if err := w.Client.Get(ctx, client.ObjectKey{Name: name}, cluster); err != nil {
		return workload.Credential{}, fmt.Errorf("read the claim's HypervisorCluster: %w", err)
	}
	vars := vmspec.ClaimVars(w.Backends, claim, tmpl, cluster, nil)
	cred, ok, err := w.issueFor(ctx, claim, tmpl, &vars)
	if err != nil {
		return workload.Credential{}, err
	}
	if !ok {
		return workload.Credential{}, fmt.Errorf("no CI platform back-end serves the claim's workload")
	}
	return cred, nil
}

// issueFor issues the claim's credential and records it in its status;
// ok is false for a platform this operator does not run (the claim is
// refused by internal/controller/refusal's Claim and gets no credential).
func (w *Platforms) issueFor(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) (workload.Credential, bool, error) {
	be, ok := w.Backends.Claim(claim, tmpl)
	if !ok {
		return workload.Credential{}, false, nil
	}
	pool, err := w.poolOf(ctx, claim)
	if err != nil {
		return workload.Credential{}, true, workloadError(be, err)
	}
	p, err := w.claimProvider(ctx, be, claim, pool, tmpl)
	if err != nil {
		return workload.Credential{}, true, workloadError(be, err)
	}
	labels := w.runnerLabels(be, claim, pool, tmpl)
	vars.RunnerName = w.runnerName(be, claim, vars.RunnerName)
	vars.RunnerGroup = runnerGroup(be, claim, p.Scope(), vars.RunnerGroup)
	spec := workload.RunnerSpec{
		Name: vars.RunnerName, Labels: labels, Group: vars.RunnerGroup,
		Method: workload.Method(vars.BootstrapMethod), WorkFolder: vars.RunnerConfig.WorkDir,
		RunUntagged: be.Claim(claim).RunUntagged,
	}
	if pool != nil {
		// A pool that listens to a job feed (a runner scale set) gets the
		// feed's runners: the platform gives the feed's jobs to them
		// alone. The pool, in the claim's namespace, says so; the claim
		// cannot name a feed itself.
		if ps, ok := be.Pool(pool, tmpl); ok && ps.Feed != nil {
			spec.Feed = ps.Feed
		}
		spec.JobTimeout = poolclaims.Limits(pool).JobTimeout
	}
	if waitsForJob(be, claim, tmpl) {
		// A warm VM: nothing until its pool binds it a job (binding.go).
		return workload.Credential{}, true, errWaitingForJob
	}
	if job := be.Claim(claim).Job; job != "" {
		repo, err := w.boundJob(ctx, claim, job)
		if err == nil {
			err = w.boundElsewhere(ctx, be, claim, job)
		}
		if err != nil {
			return workload.Credential{}, true, workloadError(be, err)
		}
		spec.Job, spec.JobRepository = job, repo
	}
	cred, err := w.issue(ctx, p, spec, w.ownsRunner(be, claim, spec.Name))
	if err != nil {
		return workload.Credential{}, true, workloadError(be, err)
	}
	if cred.RegistrationURL == "" {
		cred.RegistrationURL = vars.RegistrationURL
	}
	vars.Labels = cloudinit.List(labels)
	vars.RunnerName = cred.RunnerName
	st := &hfv1.BootstrapStatus{RunnerName: cred.RunnerName, RunnerID: cred.RunnerID, CredentialIssuedAt: &metav1.Time{Time: cred.IssuedAt}}
	if !cred.ExpiresAt.IsZero() {
		st.CredentialExpiresAt = &metav1.Time{Time: cred.ExpiresAt}
	}
	if old := claim.Status.Bootstrap; old != nil {
		// RegisteredAt stays: a warm VM that stood by (WaitingForJob) until
		// its pool bound it a job is judged by idleTimeout from then.
		st.SPIFFEID, st.JobStartedAt, st.JobRepository, st.RegisteredAt = old.SPIFFEID, old.JobStartedAt, old.JobRepository, old.RegisteredAt
		st.SetJob(old.Job())
		st.CredentialRequestedAt = old.CredentialRequestedAt
	}
	if id := claim.Status.Identity; id != nil {
		st.SPIFFEID = id.SPIFFEID
	}
	claim.Status.Bootstrap = st
	metrics.RunnerCredentials.WithLabelValues(string(cred.Method)).Inc()
	ctrl.LoggerFrom(ctx).Info("Issued a single-use runner credential", "platform", be.Name(), "method", cred.Method,
		"runner", cred.RunnerName, "runnerID", cred.RunnerID, "scope", p.Scope().String())
	return cred, true, nil
}

// issue asks for the credential. A name already taken by a runner that
// never came online is removed once and the request repeated, but only
// when owns proves that runner this install's registration for this
// claim (an earlier attempt the operator did not get to deliver or
// record): a runner someone else registered under the name (another tenant
// of a shared organization, a job) is never touched, and the claim is
// refused with RunnerNameTaken.
func (w *Platforms) issue(ctx context.Context, p workload.Provider, spec workload.RunnerSpec, owns func(workload.Runner) bool) (workload.Credential, error) {
	cred, err := p.IssueCredential(ctx, spec)
	if !errors.Is(err, workload.ErrNameTaken) {
		return cred, err
	}
	old, gerr := p.GetRunner(ctx, spec.Name)
	switch {
	case errors.Is(gerr, workload.ErrNotFound):
		// Removed in between: try again.
	case gerr != nil:
		return workload.Credential{}, gerr
	case old.State != workload.RunnerOffline:
		return workload.Credential{}, fmt.Errorf("runner name %s is taken by a runner that is %s (id %d) in %s: %w; "+
			"give the claim another runner name (spec.workloadConfig)", spec.Name, old.State, old.ID, p.Scope(), errRunnerNameTaken)
	case !owns(old):
		return workload.Credential{}, fmt.Errorf("runner name %s is taken by an offline runner (id %d) in %s that this operator cannot prove it registered for this claim "+
			"(the name is not this claim's install-marked default name, and status.bootstrap.runnerID does not record that runner): %w; HyperFleet never removes it. "+
			"Remove runner %d yourself if it is this claim's, or give the claim another runner name (spec.workloadConfig)",
			spec.Name, old.ID, p.Scope(), errRunnerNameTaken, old.ID)
	default:
		if err := p.DeregisterRunner(ctx, old.ID, old.Name); err != nil {
			return workload.Credential{}, err
		}
		ctrl.LoggerFrom(ctx).Info("Removed an earlier, never started registration of this claim's runner", "runner", old.Name, "runnerID", old.ID)
	}
	return p.IssueCredential(ctx, spec)
}

// ownsRunner is what proves a runner found under name, the claim's runner
// name, this install's registration for this claim: its id is the one the
// claim's status recorded when it was issued (status.bootstrap.runnerID),
// or name is the claim's default name as this install marks it
// (ownership.Signer.RunnerName: an HMAC under the install's key over the
// claim's host name and the start of its UID, which nobody without the
// key can make). A name the claim chose itself (spec.workloadConfig)
// proves nothing: anyone who may register runners in the scope may use
// it.
func (w *Platforms) ownsRunner(be workload.Backend, claim *hfv1.MachineClaim, name string) func(workload.Runner) bool {
	return func(r workload.Runner) bool {
		if r.Name != name {
			return false
		}
		if st := claim.Status.Bootstrap; st != nil && st.RunnerID != 0 && st.RunnerID == r.ID && st.RunnerName == name {
			return true
		}
		if w.Signer == nil || be.Claim(claim).Name != "" {
			return false
		}
		_, marked := w.Signer.VerifyRunnerName(name)
		return marked
	}
}

// Release implements internal/controller/machineclaim's CIPlatforms: it removes the claim's runner from
// its CI platform. A runner the platform already removed (ephemeral
// runners go after their job) is success; a busy one returns
// workload.ErrRunnerBusy.
func (w *Platforms) Release(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) error {
	w.retired.forget(claim.UID)
	st := claim.Status.Bootstrap
	if st == nil || st.RunnerName == "" && st.RunnerID == 0 {
		return nil
	}
	_, p, err := w.runnerProvider(ctx, claim, tmpl)
	if err != nil {
		return err
	}
	if err := p.DeregisterRunner(ctx, st.RunnerID, st.RunnerName); err != nil {
		return err
	}
	metrics.RunnersDeregistered.Inc()
	return nil
}

// runnerProvider is the back-end of the claim's runner and the account it
// registered with (claimProvider), for a call about a runner the claim
// already has.
func (w *Platforms) runnerProvider(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) (workload.Backend, workload.Provider, error) {
	be, ok := w.Backends.Claim(claim, tmpl)
	if !ok {
		return nil, nil, fmt.Errorf("runner of MachineClaim %s: %w", claim.Name, errNoBackend)
	}
	pool, err := w.poolOf(ctx, claim)
	if err != nil {
		return nil, nil, err
	}
	p, err := w.claimProvider(ctx, be, claim, pool, tmpl)
	if err != nil {
		return nil, nil, workloadError(be, err)
	}
	return be, p, nil
}

// boundJob checks that the job a claim was made for is a queued job of the
// claim's own pool, as its CIJob record (written by the operator alone,
// from the platform's signed webhooks and API) says, and returns the job's
// repository; the back-end then checks the job on the platform itself.
// Anything else is workload.ErrJobNotBindable: a claim names its job in
// its spec, and must not take another pool's.
func (w *Platforms) boundJob(ctx context.Context, claim *hfv1.MachineClaim, job string) (string, error) {
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return "", fmt.Errorf("the claim names job %s but no RunnerPool; only a pool binds its claims to its jobs: %w", job, workload.ErrJobNotBindable)
	}
	var cj hfv1.CIJob
	name := hfv1.CIJobName(claim.Spec.WorkloadConfig.Type, job)
	switch err := w.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &cj); {
	case apierrors.IsNotFound(err):
		return "", fmt.Errorf("job %s has no CIJob %s in namespace %s: %w", job, name, claim.Namespace, workload.ErrJobNotBindable)
	case err != nil:
		return "", fmt.Errorf("read CIJob %s: %w", name, err)
	}
	if cj.Spec.RunnerPoolRef.Name != ref.Name {
		return "", fmt.Errorf("job %s is not a job of RunnerPool %s (CIJob %s): %w", job, ref.Name, name, workload.ErrJobNotBindable)
	}
	if s := cj.Status.State; s != hfv1.CIJobQueued && s != "" {
		return "", fmt.Errorf("job %s is %s, not queued (CIJob %s): %w", job, s, name, workload.ErrJobNotBindable)
	}
	return cj.Spec.Repository, nil
}

// errRunnerNameTaken: a live runner already has the claim's runner name.
var errRunnerNameTaken = errors.New("runner name taken")

// errNoBackend: the object's workload type has no back-end in this
// operator.
var errNoBackend = errors.New("this operator runs no CI platform of that workload type")

// workloadError classifies an error of be's platform for the claim's
// conditions (workload.Classified), and the controller's own: a missing
// Secret and a taken runner name are for the user to fix.
func workloadError(be workload.Backend, err error) error {
	var classified *errclass.Error
	switch {
	case errors.As(err, &classified):
		return err
	case errors.Is(err, secretref.ErrMissing):
		return newConfigError(string(hfv1.SecretNotFoundReason), err)
	case errors.Is(err, errRunnerNameTaken):
		return newConfigError("RunnerNameTaken", err)
	case errors.Is(err, workload.ErrJobNotBindable):
		return newConfigError(string(hfv1.JobNotBindableReason), err)
	}
	return workload.Classified(be.Name(), err)
}

// runnerLabels are the labels the claim's runner registers with: the
// claim's own, else its pool's, after the platform's default ones.
func (w *Platforms) runnerLabels(be workload.Backend, claim *hfv1.MachineClaim, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) []string {
	labels := be.Claim(claim).Labels
	if len(labels) == 0 && pool != nil {
		if ps, ok := be.Pool(pool, tmpl); ok {
			labels = ps.Labels
		}
	}
	t, _ := be.Template(tmpl)
	return workload.RunnerLabels(t.DefaultLabels, labels)
}

// poolOf is the claim's RunnerPool; nil for a claim made by hand or whose
// pool is gone.
func (w *Platforms) poolOf(ctx context.Context, claim *hfv1.MachineClaim) (*hfv1.RunnerPool, error) {
	ref := claim.Spec.RunnerPoolRef
	if ref == nil {
		return nil, nil
	}
	var pool hfv1.RunnerPool
	if err := w.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: ref.Name}, &pool); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	return &pool, nil
}

// claimProvider returns the account the claim's runner registers with: its
// pool's scope when the pool names one, else its template's, with the
// template's credentials.
func (w *Platforms) claimProvider(ctx context.Context, be workload.Backend, claim *hfv1.MachineClaim, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Provider, error) {
	t, _ := be.Template(tmpl)
	scope := claimScope(be, pool, tmpl)
	if scope.IsZero() {
		return nil, newConfigError(be.Name()+"ScopeMissing", fmt.Errorf("MachineClaim %s: neither its RunnerPool nor %s of HypervisorMachineTemplate %s names a scope to register its runner in", claim.Name, t.Field, tmpl.Name))
	}
	return be.Provider(ctx, tmpl, scope, w.readSecret)
}

// claimScope is the scope the claim's runner registers in: its pool's when
// the pool names one, else its template's; zero when neither does.
func claimScope(be workload.Backend, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) workload.Scope {
	t, _ := be.Template(tmpl)
	if pool != nil {
		if ps, ok := be.Pool(pool, tmpl); ok {
			return ps.Scope
		}
	}
	return t.Scope
}

// runnerGroup is the runner group the claim's runner joins, given group,
// the one its variables hold (the claim's own, which its pool's is copied
// into, else the template's). The template's is the default of the
// template's organization runners only: a pool that narrows a template of
// organization runners to one repository registers repository runners,
// which have no runner groups, so the template's group does not apply to
// them. Passing it on made every credential of such a pool fail ("remove
// runnerGroup", a field the pool does not even have); property 12's test
// (property_test.go) found it. A group the claim or its pool asks for
// itself is kept: the platform's refusal then names the user's own field.
func runnerGroup(be workload.Backend, claim *hfv1.MachineClaim, scope workload.Scope, group string) string {
	if be.Claim(claim).Group == "" && !scope.IsZero() && !scope.IsOrganization() {
		return ""
	}
	return group
}

// PoolProvider implements internal/controller's PoolProviders: the account of the pool's scope
// (its own, else its template's) with the template's credentials, and a
// key that is equal for pools sharing credentials and scope, so that a
// resync asks the platform once for all of them.
func (w *Platforms) PoolProvider(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Provider, string, error) {
	be, ps, ok := w.Backends.Pool(pool, tmpl)
	if !ok {
		return nil, "", fmt.Errorf("RunnerPool %s (spec.workload.type %s): %w", pool.Name, pool.Spec.Workload.Type, errNoBackend)
	}
	if ps.Scope.IsZero() {
		t, _ := be.Template(tmpl)
		return nil, "", newConfigError(be.Name()+"ScopeMissing", fmt.Errorf("RunnerPool %s: neither %s nor template %s %s names a scope", pool.Name, ps.Field, tmpl.Name, t.Field))
	}
	p, err := be.Provider(ctx, tmpl, ps.Scope, w.readSecret)
	if err != nil {
		return nil, "", workloadError(be, err)
	}
	key := string(pool.Spec.Workload.Type) + " " + tmpl.Namespace + "/" + tmpl.Name + "/" + ps.Scope.String()
	return p, key, nil
}

// CancelJob implements internal/controller's JobCanceller: it cancels the run of job on its CI
// platform.
func (w *Platforms) CancelJob(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, job *hfv1.CIJob) error {
	p, _, err := w.PoolProvider(ctx, pool, tmpl)
	if err != nil {
		return err
	}
	if job.Spec.RunID == 0 {
		return fmt.Errorf("job %s has no run id to cancel: %w", job.Spec.ID(), workload.ErrNotFound)
	}
	return p.CancelRun(ctx, job.Spec.Repository, job.Spec.RunID)
}

// VerifyPoolScope implements internal/controller's ScopeVerifier with the pool's account (its
// scope, its template's credentials).
func (w *Platforms) VerifyPoolScope(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) error {
	p, _, err := w.PoolProvider(ctx, pool, tmpl)
	if err != nil {
		return err
	}
	return p.VerifyScope(ctx)
}

// readSecret is the workload.SecretReader of the back-ends: the Secrets of
// the template's own namespace, through the controllers' client.
func (w *Platforms) readSecret(ctx context.Context, field, namespace string, ref hfv1.LocalSecretKeySelector) ([]byte, error) {
	return secretref.Value(ctx, w.Client, field, namespace, ref.Name, ref.Key)
}

// newConfigError classifies err as a configuration problem the user must
// fix, with reason for the object's condition.
func newConfigError(reason string, err error) error {
	return &errclass.Error{Class: errclass.ClassConfiguration, Reason: reason, Err: err}
}

// runnerName is the name the claim's runner registers under: a name the
// claim sets (spec.workloadConfig) as given, since it is the user's and
// the orphan sweep must never remove that runner; otherwise the default
// name marked as this install's (ownership.Signer.RunnerName), so that the
// sweep can remove the runner once its claim is gone.
func (w *Platforms) runnerName(be workload.Backend, claim *hfv1.MachineClaim, name string) string {
	if w.Signer == nil || be.Claim(claim).Name != "" {
		return name
	}
	return w.Signer.RunnerName(name)
}
