package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
)

// reportReusableCredential sets the template's ReusableCredential
// condition: True, with a warning event when it becomes so, when its VMs
// receive a registration token of organization scope. Such a token
// registers any number of runners anywhere in the organization for an
// hour, so a VM that leaks it (a job reading cloud-init's data, a kept
// disk) leaks more than its own runner (docs/security.md).
func (r *HypervisorMachineTemplateReconciler) reportReusableCredential(ctx context.Context, s *templateScope) (phase.Result, error) {
	tmpl := s.tmpl
	var pools hfv1.RunnerPoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(tmpl.Namespace)); err != nil {
		// The template's own scope still tells; pools are seen next time.
		ctrl.LoggerFrom(ctx).Info("Cannot list RunnerPools to check their credential scope", "err", err.Error())
	}
	risky, msg := workloads.ReusableCredential(r.Workloads, tmpl, pools.Items)
	was := hfv1.IsConditionTrue(tmpl.Status.Conditions, hfv1.HypervisorMachineTemplateReusableCredentialCondition)
	if !risky {
		conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionFalse,
			hfv1.SingleUseCredentialReason, msg)
		return phase.Next(), nil
	}
	conditions.Set(&tmpl.Status.Conditions, tmpl.Generation, hfv1.HypervisorMachineTemplateReusableCredentialCondition, metav1.ConditionTrue,
		hfv1.OrganizationRegistrationTokenReason, msg)
	if !was {
		r.Recorder.Event(tmpl, corev1.EventTypeWarning, string(hfv1.OrganizationRegistrationTokenReason), conditions.Truncate(msg, 1024))
	}
	return phase.Next(), nil
}

// templateOfRunnerPool wakes the template a RunnerPool uses.
func templateOfRunnerPool(_ context.Context, o client.Object) []reconcile.Request {
	pool, ok := o.(*hfv1.RunnerPool)
	if !ok || pool.Spec.TemplateRef.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}}}
}
