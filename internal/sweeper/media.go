package sweeper

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// strayMedium is a cloud-init medium seen without a live claim.
type strayMedium struct {
	firstSeen time.Time
	medium    provider.CloudInitMedium
	// deleting is set once a deletion was started: the medium is reported
	// removed only when the provider says it is gone.
	deleting bool
}

// claimDigests returns provider.OwnerDigest of every claim's UID: the
// names of a claim's cloud-init media carry it.
func claimDigests(claims []hfv1.MachineClaim) map[string]bool {
	return claimSet(claims, func(c *hfv1.MachineClaim) (string, bool) { return provider.OwnerDigest(string(c.UID)), true })
}

// sweepMedia deletes the cloud-init media (ISOs) of this install whose
// claim no longer exists. A medium is stray when no claim in the cache has
// its owner digest, it has stayed so for the grace period, no claim read
// from the API server has it either, and the provider finds no VM that
// still needs it (DeleteCloudInitMedium re-checks and answers ErrInUse).
func (s *Sweeper) sweepMedia(ctx context.Context, cluster string, p provider.Provider, live map[string]bool, confirm func() (map[string]bool, error)) error {
	log := ctrl.LoggerFrom(ctx).WithValues("HypervisorCluster", cluster)
	media, err := p.ListCloudInitMedia(ctx)
	if err != nil {
		return fmt.Errorf("list the cloud-init media of cluster %s: %w", cluster, err)
	}
	now := s.Clock.Now()
	listed := map[string]bool{}
	for _, m := range media {
		k := cluster + "/" + m.Node + "/" + m.ID
		listed[k] = true
		if live[m.OwnerDigest] {
			forget(s, s.media, k)
			continue
		}
		o := s.strayMedium(ctx, cluster, k, m, now)
		remove, err := removable(s, s.media, k, o.firstSeen, now, confirm,
			func(confirmed map[string]bool) bool { return confirmed[m.OwnerDigest] })
		if err != nil {
			return err
		}
		if !remove {
			continue
		}
		if err := s.removeMedium(ctx, cluster, p, k, o); err != nil {
			log.Error(err, "Remove stray cloud-init ISO", "medium", m.ID, "node", m.Node)
		}
	}
	// A medium whose deletion this sweeper started is reported removed
	// once the provider says it is gone, not when a listing misses it.
	// Forget the others that are gone: they are not reported removed.
	unfinished := forgetUnlisted(s, s.media, cluster+"/", listed, func(o *strayMedium) bool { return o.deleting && !s.DryRun })
	for k, o := range unfinished {
		if err := s.removeMedium(ctx, cluster, p, k, o); err != nil {
			log.Error(err, "Remove stray cloud-init ISO", "medium", o.medium.ID, "node", o.medium.Node)
		}
	}
	return nil
}

// strayMedium returns the record of a medium without a live claim,
// reporting it the first time.
func (s *Sweeper) strayMedium(ctx context.Context, cluster, k string, m provider.CloudInitMedium, now time.Time) *strayMedium {
	o, first := sighting(s, s.media, k, func() *strayMedium { return &strayMedium{firstSeen: now, medium: m} })
	if !first {
		return o
	}
	metrics.OrphanMediaFound.WithLabelValues(cluster).Inc()
	mode := s.graceMode("it", "deleted")
	ctrl.LoggerFrom(ctx).Info("Found a cloud-init ISO without a MachineClaim", "HypervisorCluster", cluster, "medium", m.ID, "node", m.Node, "vmid", m.VM, "dryRun", s.DryRun)
	s.event(ctx, cluster, corev1.EventTypeWarning, "OrphanISOFound",
		fmt.Sprintf("Cloud-init ISO %s on node %s (VM %s) has no MachineClaim; %s", m.ID, m.Node, m.VM, mode))
	return o
}

// removeMedium advances the deletion of a stray medium by one step.
func (s *Sweeper) removeMedium(ctx context.Context, cluster string, p provider.Provider, k string, o *strayMedium) error {
	res, err := p.DeleteCloudInitMedium(ctx, o.medium)
	switch {
	case errors.Is(err, provider.ErrInUse):
		// Its VM still exists and goes with its medium (a claim's deletion
		// or the VM sweep); look again after another grace period.
		ctrl.LoggerFrom(ctx).V(1).Info("Cloud-init ISO is still its VM's; leaving it", "medium", o.medium.ID, "reason", err.Error())
		s.mu.Lock()
		o.firstSeen, o.deleting = s.Clock.Now(), false
		s.mu.Unlock()
		return nil
	case err != nil:
		return err
	}
	if !res.Done {
		s.mu.Lock()
		o.deleting = true
		s.mu.Unlock()
		return nil
	}
	forget(s, s.media, k)
	if !o.deleting {
		// Gone before this sweeper deleted it: nothing to report.
		return nil
	}
	metrics.OrphanMediaRemoved.WithLabelValues(cluster).Inc()
	s.event(ctx, cluster, corev1.EventTypeNormal, "OrphanISORemoved", fmt.Sprintf("Deleted stray cloud-init ISO %s on node %s (VM %s)", o.medium.ID, o.medium.Node, o.medium.VM))
	ctrl.LoggerFrom(ctx).Info("Removed stray cloud-init ISO", "HypervisorCluster", cluster, "medium", o.medium.ID, "node", o.medium.Node)
	return nil
}

// StrayMedia returns the cloud-init media currently known as stray, as
// "cluster/node/id".
func (s *Sweeper) StrayMedia() []string { return known(s, s.media) }
