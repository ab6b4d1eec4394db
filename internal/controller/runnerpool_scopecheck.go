package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/secretref"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ScopeVerifier checks that a pool's template credentials can manage
// runners in the pool's scope (workload.Provider.VerifyScope). Routing
// gives jobs only to pools it verified (docs/security.md).
type ScopeVerifier interface {
	VerifyPoolScope(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) error
}

const (
	// scopeRecheck is how long a verification stands: credentials rotated
	// to another account, or an App removed from a repository, stop
	// routing within it.
	scopeRecheck = 10 * time.Minute
	// scopeRetry is the next check after one that could not be made.
	scopeRetry = 30 * time.Second
)

// verifyScope sets the pool's ScopeVerified condition and s.scopeVerified.
// Only pools of a CI platform this operator runs have a scope; a
// verification stands while the pool's scope, its template and the
// template's credentials are those it was made for, and for scopeRecheck.
func (r *RunnerPoolReconciler) verifyScope(ctx context.Context, s *poolScope) (phase.Result, error) {
	pool := s.pool
	st := &pool.Status
	be, ps, ok := r.Workloads.Pool(pool, s.tmpl)
	if !ok || !workload.HasRunner(be) {
		// No CI platform (generic): no scope, no credentials to check.
		s.scopeVerified = true
		meta.RemoveStatusCondition(&st.Conditions, string(hfv1.RunnerPoolScopeVerifiedCondition))
		st.ScopeVerification = nil
		return phase.Next(), nil
	}
	if s.tmpl == nil {
		r.scopeNotVerified(s, hfv1.TemplateNotReadyReason, fmt.Sprintf("spec.templateRef: HypervisorMachineTemplate %s does not exist; the pool's scope is checked with its credentials once it does", pool.Spec.TemplateRef.Name))
		return phase.Next(), nil
	}
	if s.mismatch != "" {
		// No scope to check with a template of another platform.
		r.scopeNotVerified(s, hfv1.InvalidSpecReason, s.mismatch)
		return phase.Next(), nil
	}
	t, _ := be.Template(s.tmpl)
	scope := ps.Scope
	if scope.IsZero() {
		r.scopeNotVerified(s, hfv1.ScopeNotReachableReason, fmt.Sprintf("neither %s (repository or organization) nor %s of HypervisorMachineTemplate %s names a scope; set one", ps.Field, t.Field, s.tmpl.Name))
		return phase.Next(), nil
	}
	if refused, err := r.apiHostsRefused(ctx, s.tmpl, t.APIHosts); err != nil {
		return phase.Stop(), err
	} else if refused != "" {
		// Its credentials are not used at a host the platform team did
		// not allow: whatever a server there answers vouches for nothing.
		st.ScopeVerification = nil
		r.scopeNotVerified(s, hfv1.NotAllowedByClusterReason, refused)
		return phase.Next(), nil
	}
	verifiedBefore := verificationMatches(pool, s.tmpl, t.CredentialsKey, scope)
	if verifiedBefore && s.now.Before(st.ScopeVerification.VerifiedAt.Add(scopeRecheck)) {
		// Re-stamped for the current generation: a spec change that
		// kept the scope (maxReplicas, labels) keeps the verification.
		r.scopeVerified(s, scope)
		return phase.Recheck(st.ScopeVerification.VerifiedAt.Add(scopeRecheck).Sub(s.now)), nil
	}
	if r.Scopes == nil {
		r.scopeNotVerified(s, hfv1.ScopeCheckFailedReason, "the manager has no CI platform to check "+ps.Field+"'s scope with; no pool receives jobs without that check")
		return phase.Next(), nil
	}
	err := r.Scopes.VerifyPoolScope(ctx, pool, s.tmpl)
	if err == nil {
		st.ScopeVerification = &hfv1.ScopeVerification{Scope: scope.String(), Template: s.tmpl.Name, Credentials: t.CredentialsKey, VerifiedAt: metav1.Time{Time: s.now}}
		r.scopeVerified(s, scope)
		return phase.Recheck(scopeRecheck), nil
	}
	if wait, transient := scopeCheckTransient(err, s.now); transient {
		// One check that could not be made is no evidence against an
		// earlier one for the same scope and credentials.
		if verifiedBefore {
			ctrl.LoggerFrom(ctx).Info("Could not check the pool's scope again; keeping the earlier verification", "scope", scope.String(), "error", err.Error())
			r.scopeVerified(s, scope)
			return phase.Recheck(wait), nil
		}
		r.scopeNotVerified(s, hfv1.ScopeCheckFailedReason, fmt.Sprintf("could not check that the credentials of HypervisorMachineTemplate %s manage runners in %s (%s); retrying", s.tmpl.Name, scope, err))
		return phase.Recheck(wait), nil
	}
	st.ScopeVerification = nil
	r.scopeNotVerified(s, hfv1.ScopeNotReachableReason, fmt.Sprintf(
		"%s (%s): the credentials of HypervisorMachineTemplate %s (%s.credentials) cannot manage runners there: %s. "+
			"Give the template credentials for that scope or name a scope they reach; until then the pool receives no jobs and creates no VMs",
		ps.ScopeField, scope, s.tmpl.Name, t.Field, err))
	return phase.Recheck(scopeRetry), nil
}

// verificationMatches reports whether status.scopeVerification and a True
// ScopeVerified condition (of any generation) are for scope with tmpl as
// it is now.
func verificationMatches(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, credentials string, scope workload.Scope) bool {
	stamped := pool.DeepCopy()
	if c := hfv1.FindCondition(stamped.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition); c != nil {
		c.ObservedGeneration = stamped.Generation
	}
	return demand.ScopeVerified(stamped, tmpl.Name, credentials, scope)
}

func (r *RunnerPoolReconciler) scopeVerified(s *poolScope, scope workload.Scope) {
	s.scopeVerified = true
	conditions.Set(&s.pool.Status.Conditions, s.pool.Generation, hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionTrue, hfv1.ScopeVerifiedReason,
		fmt.Sprintf("The credentials of HypervisorMachineTemplate %s manage runners in %s", s.tmpl.Name, scope))
}

// scopeNotVerified sets ScopeVerified False, with a warning event when the
// reason is new.
func (r *RunnerPoolReconciler) scopeNotVerified(s *poolScope, reason hfv1.ConditionReason, msg string) {
	s.scopeVerified = false
	conds := &s.pool.Status.Conditions
	if old := hfv1.FindCondition(*conds, hfv1.RunnerPoolScopeVerifiedCondition); old == nil || old.Status != metav1.ConditionFalse || old.Reason != string(reason) {
		r.Recorder.Event(s.pool, corev1.EventTypeWarning, string(reason), msg)
	}
	conditions.Set(conds, s.pool.Generation, hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionFalse, reason, msg)
}

// scopeCheckTransient reports whether a failed check says nothing about
// the credentials (rate limit, platform unavailable, a read that failed),
// and when to check again.
func scopeCheckTransient(err error, now time.Time) (time.Duration, bool) {
	if wait, limited := machineclaim.RetryAfter(err, now); limited {
		return max(wait, time.Second), true
	}
	var classified *errclass.Error
	switch {
	case errors.Is(err, workload.ErrUnavailable):
		return scopeRetry, true
	case errors.As(err, &classified), errors.Is(err, workload.ErrNotFound), errors.Is(err, workload.ErrUnauthorized),
		errors.Is(err, workload.ErrInvalidRequest), errors.Is(err, secretref.ErrMissing):
		return 0, false
	}
	return scopeRetry, true
}

// apiHostsRefused says why the API hosts of tmpl's CI platform
// credentials (workload.Template.APIHosts) may not be used for tmpl's
// namespace: the tenancy rules of tmpl's HypervisorCluster allow the
// platforms' public services and the hosts they list only
// (tenancy.APIHostViolations); "" when they may. Without rules that admit
// the namespace (a cluster that is missing, or does not admit it), only the
// public services are allowed: the template builds no VM then anyway, and
// no host a tenant chose is called.
func (r *RunnerPoolReconciler) apiHostsRefused(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate, hosts []workload.APIHost) (string, error) {
	publicOnly := []hfv1.TenancyRule{{}}
	var cluster hfv1.HypervisorCluster
	name := tmpl.Spec.HypervisorClusterRef.Name
	rules, why := publicOnly, ""
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: name}, &cluster); {
	case apierrors.IsNotFound(err):
		why = fmt.Sprintf("HypervisorCluster %s of HypervisorMachineTemplate %s does not exist, so only the CI platforms' public services are allowed", name, tmpl.Name)
	case err != nil:
		return "", fmt.Errorf("read HypervisorCluster %s of HypervisorMachineTemplate %s: %w", name, tmpl.Name, err)
	default:
		selected, admitted, err := tenancy.RulesFor(ctx, r.Client, &cluster, tmpl.Namespace)
		switch {
		case err != nil && !errors.Is(err, tenancy.ErrInvalidSelector):
			return "", fmt.Errorf("apply the allow-lists of HypervisorCluster %s: %w", name, err)
		case err == nil && admitted:
			rules = selected
		default:
			why = fmt.Sprintf("HypervisorCluster %s does not admit namespace %s, so only the CI platforms' public services are allowed", name, tmpl.Namespace)
		}
	}
	problems := tenancy.APIHostViolations(rules, hosts)
	if len(problems) == 0 {
		return "", nil
	}
	if why == "" {
		why = fmt.Sprintf("HypervisorCluster %s does not allow it in namespace %s (spec.tenancy[].apiHosts)", name, tmpl.Namespace)
	}
	return fmt.Sprintf("HypervisorMachineTemplate %s names a CI platform API host that may not be used: %s; %s. Use the platform's public service, "+
		"or ask the cluster's owner to allow the host; until then the pool's scope is not checked there and the pool receives no jobs",
		tmpl.Name, strings.Join(problems, "; "), why), nil
}
