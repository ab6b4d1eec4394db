package machineclaim

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Progress is the provider progress persisted in the claim's status.
func Progress(claim *hfv1.MachineClaim) provider.Progress {
	var p provider.Progress
	if ref := claim.Status.VMRef; ref != nil {
		p.ID, p.Node = provider.ID(ref.ID()), ref.Node
	}
	if t := claim.Status.Task; t != nil {
		p.Task = &provider.Task{ID: t.ID, Operation: t.Operation}
		if t.StartTime != nil {
			p.Task.StartTime = t.StartTime.Time
		}
	}
	return p
}

// recordProgress writes the provider's progress into the claim's status
// (persisted by the reconciler's status write before anything waits on
// it), and reports a clone request once.
func (r *Reconciler) recordProgress(ctx context.Context, claim *hfv1.MachineClaim, cluster string, prev, next provider.Progress) {
	if next.ID == "" {
		claim.Status.VMRef = nil
	} else {
		claim.Status.VMRef = hfv1.NewVMReference(cluster, string(next.ID), next.Node)
	}
	claim.Status.Task = nil
	if t := next.Task; t != nil {
		claim.Status.Task = &hfv1.TaskReference{ID: t.ID, Operation: t.Operation}
		if !t.StartTime.IsZero() {
			claim.Status.Task.StartTime = &metav1.Time{Time: t.StartTime}
		}
		if t.Operation == "clone" && (prev.Task == nil || prev.Task.ID != t.ID) {
			// No event of its own: the Provisioning phase event of the same
			// pass says the same (reason Cloning, the template, VM id and
			// node), and every event is a write to the API server.
			metrics.CreatedToCloneRequest.Observe(r.Clock.Since(claim.CreationTimestamp.Time).Seconds())
		}
	}
	if prev.ID != "" && next.ID != "" && prev.ID != next.ID {
		ctrl.LoggerFrom(ctx).Info("VM id changed (the previous one was taken)", "previousVM", prev.ID, "vm", next.ID)
	}
}

// vmRefOf is the provider's reference of the VM ref records; a reference
// written before providerID existed reads as its Proxmox ID
// (hfv1.VMReference.ID).
func vmRefOf(ref *hfv1.VMReference) provider.VMRef {
	return provider.VMRef{ID: provider.ID(ref.ID()), Node: ref.Node}
}
