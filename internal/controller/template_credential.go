package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
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
	risky, msg := reusableCredential(tmpl, pools.Items)
	was := meta.IsStatusConditionTrue(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateReusableCredentialCondition)
	if !risky {
		setCondition(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionFalse,
			hfv1.SingleUseCredentialReason, msg)
		return
	}
	setCondition(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionTrue,
		hfv1.OrganizationRegistrationTokenReason, msg)
	if !was {
		r.Recorder.Event(tmpl, corev1.EventTypeWarning, hfv1.OrganizationRegistrationTokenReason, truncate(msg, 1024))
	}
}

// reusableCredential says whether tmpl's VMs (through the template's own
// scope or the pools using it) receive an organization registration
// token, and explains the answer naming the fields to change.
func reusableCredential(tmpl *hfv1.HypervisorMachineTemplate, pools []hfv1.RunnerPool) (bool, string) {
	b := tmpl.Spec.Bootstrap
	if b.Method != hfv1.BootstrapRunnerToken {
		return false, "Each VM receives a single-use credential for its own runner only (spec.bootstrap.method " + string(orDefaultMethod(b.Method)) + ")"
	}
	var where []string
	if b.GitHub.Organization != "" {
		where = append(where, fmt.Sprintf("spec.bootstrap.github.organization (%s)", b.GitHub.Organization))
	}
	for i := range pools {
		p := &pools[i]
		gh := p.Spec.Workload.GitHub
		if p.Spec.TemplateRef.Name != tmpl.Name || gh == nil || gh.Organization == "" || gh.Repository != "" {
			continue
		}
		where = append(where, fmt.Sprintf("RunnerPool %s spec.workload.github.organization (%s)", p.Name, gh.Organization))
	}
	if len(where) == 0 {
		return false, "spec.bootstrap.method is runner-token with repository scope: a VM's registration token registers runners of that repository only, for an hour"
	}
	slices.Sort(where)
	return true, fmt.Sprintf("spec.bootstrap.method is runner-token with organization scope (%s): each VM receives a registration token that, for an hour, "+
		"registers any number of runners anywhere in the organization; set spec.bootstrap.method: jit-config, which gives each VM one pre-registered, single-job runner",
		strings.Join(where, ", "))
}

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
