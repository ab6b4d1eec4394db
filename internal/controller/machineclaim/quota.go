// The quota service is a claim's namespace quota on its cluster
// (spec.tenancy[].limits; docs/operations.md "Quotas per namespace"): a
// claim is admitted by the ledger (internal/quota) right before its
// placement record is written, and waits with Provisioned False, reason
// QuotaExceeded, while its VM would take the namespace over a limit. A VM
// of the namespace destroyed on the cluster wakes the claims that wait
// there (quotaHandler).

package machineclaim

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/quota"
	"github.com/hyperfleet/hyperfleet/internal/tenancy"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// quotaRecheck is how often a claim waiting for quota is looked at again
// without a wake-up: a backstop for what no watch reports (a raised limit,
// a namespace relabelled). A VM of the namespace destroyed wakes it at
// once.
const quotaRecheck = 5 * time.Minute

// ledger is the claims' quota ledger, made on first use over the cache.
func (r *Reconciler) ledger() *quota.Ledger {
	r.quotaOnce.Do(func() {
		if r.Quota == nil {
			r.Quota = quota.NewLedger(r.quotaClaims)
		}
	})
	return r.Quota
}

// quotaRules are the limits that bound the claim's namespace on cluster
// for tmpl's VMs: those of the tenancy rule that admits the template
// (tenancy.AdmittingRule); nil when that rule sets none, or no rule
// applies.
func (r *Reconciler) quotaRules(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster) ([]quota.Rule, error) {
	i, err := tenancy.AdmittingRule(ctx, r.Client, cluster, claim.Namespace, tmpl, r.workloads().APIHosts(tmpl))
	if err != nil || i < 0 {
		return nil, err
	}
	rules := []quota.Rule{{Field: fmt.Sprintf("spec.tenancy[%d].limits", i), Limits: cluster.Spec.Tenancy[i].Limits}}
	if !quota.Limited(rules) {
		return nil, nil
	}
	return rules, nil
}

// admitQuota asks the ledger to admit the claim's VM, built as call says,
// before its placement record is written. charged is set when the ledger
// charged the claim (the caller releases the charge unless the record is
// written); stop, with its result, when the claim must wait: its
// namespace's quota is exceeded (recorded in its Provisioned condition,
// with a warning event when it starts waiting), or the check failed.
func (r *Reconciler) admitQuota(ctx context.Context, s *claimScope, call *vmCall) (charged, stop bool, res phase.Result, err error) {
	claim := s.claim
	rules, err := r.quotaRules(ctx, claim, call.tmpl, s.cluster)
	if err != nil {
		res, err := r.provisionError(ctx, s, provider.Errorf(provider.ClassTransient, "QuotaNotChecked", "check the namespace's quota: %v", err))
		return false, true, res, err
	}
	if rules == nil {
		// Unlimited (now): nothing to wait for.
		r.ledger().Forget(claim.UID)
		return false, false, phase.Result{}, nil
	}
	ex, err := r.ledger().Admit(ctx, s.cluster.Name, client.ObjectKeyFromObject(claim), claim.UID, rules, quota.Of(call.spec))
	switch {
	case err != nil:
		res, err := r.provisionError(ctx, s, provider.Errorf(provider.ClassTransient, "QuotaNotChecked", "check the namespace's quota: %v", err))
		return false, true, res, err
	case ex != nil:
		msg := ex.Error()
		if cur := s.facts.condition(claim, hfv1.MachineClaimProvisionedCondition); cur == nil || cur.Reason != string(hfv1.QuotaExceededReason) {
			r.Recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.QuotaExceededReason), conditions.Truncate(msg, 1024))
			ctrl.LoggerFrom(ctx).Info("Waiting for the namespace's quota", "limit", ex.Field, "usage", ex.Usage, "need", ex.Need)
		}
		s.facts.record(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.QuotaExceededReason, msg)
		return false, true, phase.StopAndRequeue(quotaRecheck), nil
	}
	return true, false, phase.Result{}, nil
}

// releaseQuota drops the charge of a claim whose placement record was not
// written in this pass, and wakes the claims its charge held back.
func (r *Reconciler) releaseQuota(uid types.UID) {
	r.wakeQuota(r.ledger().Release(uid))
}

// wakeQuota enqueues claims waiting for quota. A full channel drops the
// wake-up: the claim's recheck finds the room.
func (r *Reconciler) wakeQuota(claims []types.NamespacedName) {
	if r.quotaWake == nil {
		return
	}
	for _, n := range claims {
		select {
		case r.quotaWake <- event.GenericEvent{Object: &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: n.Namespace, Name: n.Name}}}:
		default:
		}
	}
}

// quotaClaims are a namespace's claims as the cache shows them, for the
// ledger: each with the cluster of its VM and what the VM uses.
func (r *Reconciler) quotaClaims(ctx context.Context, namespace string) ([]quota.Claim, error) {
	var list hfv1.MachineClaimList
	if err := r.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	out := make([]quota.Claim, 0, len(list.Items))
	for i := range list.Items {
		c := &list.Items[i]
		qc := quota.Claim{UID: c.UID}
		if ref := c.Status.VMRef; ref != nil {
			qc.Cluster, qc.Use = ref.HypervisorCluster, r.placedUse(ctx, c)
		}
		out = append(out, qc)
	}
	return out, nil
}

// placedUse is what a claim's VM counts against its namespace's quota:
// what its verified placement record says; with a record that does not
// verify (removed, edited), what its template says now, so that a tenant
// cannot lower its usage by editing its records; only the machine when the
// template is gone too.
func (r *Reconciler) placedUse(ctx context.Context, claim *hfv1.MachineClaim) quota.Use {
	if p, err := r.reservations().readPlacement(claim); err == nil {
		if hw, err := PlacedHardware(p); err == nil {
			return quota.Of(&provider.VMSpec{CPUCores: p.CPUCores, MemoryBytes: p.MemoryBytes, DiskBytes: p.DiskBytes, Hardware: hw})
		}
	}
	tmpl := &hfv1.HypervisorMachineTemplate{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Spec.TemplateRef.Name}, tmpl); err != nil {
		return quota.Use{quota.Machines: 1}
	}
	res := tmpl.Spec.Resources
	spec := &provider.VMSpec{CPUCores: int(res.CPU), MemoryBytes: res.Memory.Value(), Hardware: vmspec.Hardware(tmpl, &hfv1.HypervisorCluster{})}
	if res.Disk != nil {
		spec.DiskBytes = res.Disk.Value()
	}
	return quota.Of(spec)
}

// quotaHandler wakes the claims waiting for quota in a namespace on a
// cluster when the cache shows a VM of the namespace there destroyed (the
// claim's status.vmRef cleared) or its claim gone: the cache the woken
// claims are counted from already shows the room.
func (r *Reconciler) quotaHandler() handler.EventHandler {
	freed := func(ctx context.Context, claim *hfv1.MachineClaim, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		waiting, err := r.ledger().Freed(ctx, claim.Status.VMRef.HypervisorCluster, claim.Namespace)
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Recount a namespace's quota usage", "namespace", claim.Namespace)
		}
		for _, n := range waiting {
			q.Add(reconcile.Request{NamespacedName: n})
		}
	}
	return handler.Funcs{
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			old, okOld := e.ObjectOld.(*hfv1.MachineClaim)
			cur, okNew := e.ObjectNew.(*hfv1.MachineClaim)
			if okOld && okNew && old.Status.VMRef != nil && (cur.Status.VMRef == nil || cur.Status.VMRef.HypervisorCluster != old.Status.VMRef.HypervisorCluster) {
				freed(ctx, old, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if claim, ok := e.Object.(*hfv1.MachineClaim); ok && claim.Status.VMRef != nil {
				freed(ctx, claim, q)
			}
		},
	}
}
