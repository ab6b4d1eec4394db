package sweeper

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// vanishedRetry is how soon an unfinished destruction of a vanished claim's
// VM is advanced again: DeleteVM takes one step per call (stop, wait for a
// running clone's lock, destroy, remove the ISO) and never waits.
const vanishedRetry = 2 * time.Second

// Vanished hands the sweeper the VM of a claim that left the API server
// while it still carried the operator's finalizer: the API server removed
// it without a deletion pass (a delete that read the claim before the
// finalizer's write lands after it; kubernetes/kubernetes#77988), so
// nothing released its VM, and the claim controller, which saw the claim's
// last state in its DELETED event, says which VM that is. The claim is
// known gone, so the VM is destroyed without the grace period, as soon as
// the sweeper's loop runs (on the leader, like the claim controller),
// after the same checks as any orphan's: the claim is confirmed gone on
// the API server, and DeleteVM touches the VM only if its ownership marker
// names the claim's UID. In dry-run mode it is only reported.
func (s *Sweeper) Vanished(ctx context.Context, cluster string, owner provider.Owner, progress provider.Progress) {
	s.defaults()
	k := key(cluster, progress.ID)
	s.mu.Lock()
	if o, ok := s.orphans[k]; ok {
		// Already an orphan of a sweep: skip its grace period.
		o.vanished = true
	} else {
		s.orphans[k] = &orphan{firstSeen: s.Clock.Now(), owner: owner, progress: progress, vanished: true}
	}
	s.mu.Unlock()
	metrics.OrphansFound.WithLabelValues(cluster).Inc()
	mode := "destroying it now"
	if s.DryRun {
		mode = "dry-run: it will not be destroyed"
	}
	s.event(ctx, cluster, corev1.EventTypeWarning, "ClaimVanished", fmt.Sprintf(
		"MachineClaim %s/%s (uid %s) was removed by the API server while it still carried finalizer %s, so its deletion never ran; its VM %s is an orphan; %s",
		owner.Namespace, owner.Name, owner.UID, hfv1.MachineClaimFinalizer, progress.ID, mode))
	s.wake()
}

// wake asks the loop to run removeVanished; a wake-up already pending
// covers this one.
func (s *Sweeper) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// removeVanished advances the destruction of every VM handed over by
// Vanished by one step, and reports whether any is unfinished.
func (s *Sweeper) removeVanished(ctx context.Context) (unfinished bool) {
	type item struct {
		k, cluster string
		o          *orphan
	}
	var items []item
	s.mu.Lock()
	for k, o := range s.orphans {
		if o.vanished {
			// Cluster names have no slash (they are DNS labels).
			cluster, _, _ := strings.Cut(k, "/")
			items = append(items, item{k: k, cluster: cluster, o: o})
		}
	}
	s.mu.Unlock()
	if s.DryRun {
		return false
	}
	log := ctrl.LoggerFrom(ctx)
	for _, it := range items {
		o := it.o
		var claim hfv1.MachineClaim
		err := s.APIReader.Get(ctx, client.ObjectKey{Namespace: o.owner.Namespace, Name: o.owner.Name}, &claim)
		switch {
		case err == nil && string(claim.UID) == o.owner.UID:
			// Not gone after all: the claim deletes its own VM.
			s.mu.Lock()
			delete(s.orphans, it.k)
			s.mu.Unlock()
			log.Info("A claim reported vanished is on the API server; leaving its VM to it", "claim", o.owner.Namespace+"/"+o.owner.Name, "vmid", o.progress.ID)
			continue
		case err != nil && !apierrors.IsNotFound(err):
			log.Error(err, "Confirm a vanished claim is gone", "claim", o.owner.Namespace+"/"+o.owner.Name)
			unfinished = true
			continue
		}
		p, health, ok := s.Registry.Provider(it.cluster)
		if !ok || !health.Ready {
			// Its cluster is away: the sweeps finish it once it is back.
			continue
		}
		s.mu.Lock()
		vmid := o.progress.ID
		s.mu.Unlock()
		if err := s.remove(ctx, p, it.cluster, vmid, o); err != nil {
			log.Error(err, "Remove the VM of a vanished claim", "vmid", vmid, "HypervisorCluster", it.cluster)
		}
		s.mu.Lock()
		_, left := s.orphans[it.k]
		s.mu.Unlock()
		unfinished = unfinished || left
	}
	return unfinished
}
