package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// reportReusableCredential sets the template's ReusableCredential
// condition: True, with a warning event when it becomes so, when its VMs
// receive a registration token of organization scope. Such a token
// registers any number of runners anywhere in the organization for an
// hour, so a VM that leaks it (a job reading cloud-init's data, a kept
// disk) leaks more than its own runner (docs/security.md).
func (r *HypervisorMachineTemplateReconciler) reportReusableCredential(ctx context.Context, tmpl *hfv1.HypervisorMachineTemplate) {
	var pools hfv1.RunnerPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(tmpl.Namespace)); err != nil {
		// The template's own scope still tells; pools are seen next time.
		ctrl.LoggerFrom(ctx).Info("Cannot list RunnerPools to check their credential scope", "err", err.Error())
	}
	risky, msg := reusableCredential(r.Workloads, tmpl, pools.Items)
	was := hfv1.IsConditionTrue(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateReusableCredentialCondition)
	if !risky {
		setCondition(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionFalse,
			hfv1.SingleUseCredentialReason, msg)
		return
	}
	setCondition(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionTrue,
		hfv1.OrganizationRegistrationTokenReason, msg)
	if !was {
		r.Recorder.Event(tmpl, corev1.EventTypeWarning, string(hfv1.OrganizationRegistrationTokenReason), truncate(msg, 1024))
	}
}

// reusableCredential says whether tmpl's VMs (through the template's own
// scope or the pools using it) receive an organization registration
// token, and explains the answer naming the fields to change.
func reusableCredential(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate, pools []hfv1.RunnerPool) (bool, string) {
	b := tmpl.Spec.Bootstrap
	if b.Method != hfv1.BootstrapRunnerToken {
		return false, "Each VM receives a single-use credential for its own runner only (spec.bootstrap.method " + string(orDefaultMethod(b.Method)) + ")"
	}
	var where []string
	if _, t, ok := ws.Template(tmpl); ok && organizationScope(t.Scope) {
		where = append(where, fmt.Sprintf("%s (%s)", t.ScopeField, t.Scope.Owner))
	}
	for i := range pools {
		p := &pools[i]
		if p.Spec.TemplateRef.Name != tmpl.Name {
			continue
		}
		if _, ps, ok := ws.Pool(p, tmpl); ok && ps.OwnScope && organizationScope(ps.Scope) {
			where = append(where, fmt.Sprintf("RunnerPool %s %s (%s)", p.Name, ps.ScopeField, ps.Scope.Owner))
		}
	}
	if len(where) == 0 {
		return false, "spec.bootstrap.method is runner-token with repository scope: a VM's registration token registers runners of that repository only, for an hour"
	}
	slices.Sort(where)
	return true, fmt.Sprintf("spec.bootstrap.method is runner-token with organization scope (%s): each VM receives a registration token that, for an hour, "+
		"registers any number of runners anywhere in the organization; set spec.bootstrap.method: jit-config, which gives each VM one pre-registered, single-job runner",
		strings.Join(where, ", "))
}

// organizationScope reports whether s is a whole organization (and not no
// scope at all).
func organizationScope(s workload.Scope) bool { return !s.IsZero() && s.IsOrganization() }

func orDefaultMethod(m hfv1.BootstrapMethod) hfv1.BootstrapMethod {
	if m == "" {
		return hfv1.BootstrapJITConfig
	}
	return m
}

// templateOfRunnerPool wakes the template a RunnerPool uses.
func templateOfRunnerPool(_ context.Context, o client.Object) []reconcile.Request {
	pool, ok := o.(*hfv1.RunnerPool)
	if !ok || pool.Spec.TemplateRef.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}}}
}
