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
// condition: True, with a warning event when it becomes so, when the
// credential its VMs receive can serve more than one job on the CI
// platform's side (workloads.ReusableCredential: the back-end of the
// template's platform says so, and what limits it). A job that reads such
// a credential in its VM (from the runner's memory or environment, a kept
// disk) takes more than its own job with it (docs/security.md, "One job
// per credential").
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
		hfv1.MultiJobCredentialReason, msg)
	if !was {
		r.Recorder.Event(tmpl, corev1.EventTypeWarning, string(hfv1.MultiJobCredentialReason), conditions.Truncate(msg, 1024))
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
