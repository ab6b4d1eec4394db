package machineclaim

import (
	"context"
	"fmt"
	"sync"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// A finished claim (its VM, runner, identity and DNS records released, its
// pool keeping no history) goes with its finalizer's removal, which also
// labels it hyperfleet.io/finished, and then with a collection deletion of
// its namespace's labelled claims: one DELETE for every claim that
// finished while the one before it was on its way. A claim of its own
// cost a DELETE per job; under churn, when the API server is the
// bottleneck, claims finish in bursts and one request deletes them
// together (docs/performance.md). A claim that finishes alone is still
// deleted at once: nothing waits for a batch to fill.
//
// The label decides nothing a tenant could not: a claim that still carries
// its finalizer, labelled by anyone, is only marked for deletion by the
// collection deletion, and its deletion pass tears it down as a deletion
// of any claim (a tenant who may label a claim may delete it); one
// without its finalizer yet (created by a person, before its first pass)
// holds nothing to release: its finalizer is stored before its VM's clone
// request (writeReservation). A restart
// between the label and the deletion leaves the claim labelled and
// without its finalizer; its next reconcile deletes it (finishedPending).

// finishedDeletes deletes the finished claims of a namespace, one
// collection deletion at a time per namespace.
type finishedDeletes struct {
	mu sync.Mutex
	// running: a deletion of the namespace's finished claims is on its
	// way; again: a claim finished after that deletion was sent, and the
	// caller that sent it sends another once it returns.
	running, again map[string]bool
}

// markFinished labels the claim as finished (FinishedLabel), in memory;
// the finalizer's removal writes it.
func markFinished(claim *hfv1.MachineClaim) {
	if claim.Labels == nil {
		claim.Labels = map[string]string{}
	}
	claim.Labels[hfv1.FinishedLabel] = hfv1.FinishedLabelValue
}

// finishedPending reports whether the claim finished and waits for its
// deletion: labelled, its finalizer removed, not yet deleted.
func finishedPending(claim *hfv1.MachineClaim) bool {
	return claim.Labels[hfv1.FinishedLabel] == hfv1.FinishedLabelValue &&
		!controllerutil.ContainsFinalizer(claim, hfv1.MachineClaimFinalizer) && claim.DeletionTimestamp.IsZero()
}

// deleteFinished deletes the finished claims of namespace, this caller's
// among them (its label stored before the call). When a deletion of the
// namespace's finished claims is on its way, the caller leaves its claim
// to the next one, which that deletion's caller sends once its own
// returns, and returns at once: the claim may have been labelled after
// the running deletion read the namespace's claims.
func (r *Reconciler) deleteFinished(ctx context.Context, namespace string) error {
	d := &r.finished
	d.mu.Lock()
	if d.running == nil {
		d.running, d.again = map[string]bool{}, map[string]bool{}
	}
	if d.running[namespace] {
		d.again[namespace] = true
		d.mu.Unlock()
		return nil
	}
	d.running[namespace] = true
	d.mu.Unlock()
	for {
		err := r.Client.DeleteAllOf(ctx, &hfv1.MachineClaim{}, client.InNamespace(namespace),
			client.MatchingLabels{hfv1.FinishedLabel: hfv1.FinishedLabelValue})
		d.mu.Lock()
		again := d.again[namespace]
		delete(d.again, namespace)
		if err != nil || !again {
			delete(d.running, namespace)
			d.mu.Unlock()
			if err != nil {
				// The claims stay labelled; the caller's pass fails and
				// its retry deletes them all (those whose passes
				// returned are deleted with it, or by their own next
				// reconcile: finishedPending).
				return fmt.Errorf("delete the finished MachineClaims of namespace %s: %w", namespace, err)
			}
			return nil
		}
		d.mu.Unlock()
	}
}
