package sweeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// strayIsolation is an isolation object (a Proxmox security group, a
// libvirt filter) seen without a claim whose policy needs it.
type strayIsolation struct {
	firstSeen time.Time
	object    provider.IsolationObject
}

// isolationDigests returns the RulesDigest of every isolation policy the
// claims' placement records hold: the hypervisor objects of those rules
// are in use. A record is read, not verified: one a tenant forged only
// keeps an object longer.
func isolationDigests(claims []hfv1.MachineClaim) []string {
	var out []string
	for i := range claims {
		raw := claims[i].Status.PlacementRecord
		if raw == "" {
			continue
		}
		var rec struct {
			Isolation string `json:"isolation"`
		}
		if json.Unmarshal([]byte(raw), &rec) != nil || rec.Isolation == "" {
			continue
		}
		var iso provider.Isolation
		if json.Unmarshal([]byte(rec.Isolation), &iso) != nil {
			continue
		}
		out = append(out, iso.RulesDigest())
	}
	return out
}

// needed reports whether one of digests is o's.
func needed(o provider.IsolationObject, digests []string) bool {
	for _, d := range digests {
		if o.For(d) {
			return true
		}
	}
	return false
}

// sweepIsolation deletes the isolation objects of a cluster whose
// provider writes them (provider.IsolationObjects) once no claim's
// placement record needs them: not in the cache, not for the grace
// period, not on the API server either. A placement record is written
// before its VM's object is made, so a claim being placed is never missed.
func (s *Sweeper) sweepIsolation(ctx context.Context, cluster string, p provider.Provider, live []string, confirm func() ([]hfv1.MachineClaim, error)) error {
	objects, ok := p.(provider.IsolationObjects)
	if !ok {
		return nil
	}
	list, err := objects.ListIsolationObjects(ctx)
	if err != nil {
		return fmt.Errorf("list the isolation objects of cluster %s: %w", cluster, err)
	}
	now := s.Clock.Now()
	listed := map[string]bool{}
	for _, o := range list {
		k := cluster + "/" + o.ID
		listed[k] = true
		if needed(o, live) {
			forget(s, s.isolation, k)
			continue
		}
		rec, first := sighting(s, s.isolation, k, func() *strayIsolation { return &strayIsolation{firstSeen: now, object: o} })
		if first {
			ctrl.LoggerFrom(ctx).Info("Found an isolation object no MachineClaim needs", "HypervisorCluster", cluster, "object", o.ID, "dryRun", s.DryRun)
		}
		remove, err := removable(s, s.isolation, k, rec.firstSeen, now, confirm,
			func(claims []hfv1.MachineClaim) bool { return needed(o, isolationDigests(claims)) })
		if err != nil {
			return err
		}
		if !remove {
			continue
		}
		switch err := objects.DeleteIsolationObject(ctx, o); {
		case errors.Is(err, provider.ErrInUse):
			s.mu.Lock()
			rec.firstSeen = s.Clock.Now()
			s.mu.Unlock()
		case err != nil:
			ctrl.LoggerFrom(ctx).Error(err, "Remove an isolation object no MachineClaim needs", "HypervisorCluster", cluster, "object", o.ID)
		default:
			forget(s, s.isolation, k)
			metrics.OrphanIsolationObjectsRemoved.WithLabelValues(cluster).Inc()
			s.event(ctx, cluster, corev1.EventTypeNormal, "IsolationObjectRemoved", fmt.Sprintf("Deleted %s, written for an isolation policy no MachineClaim uses any more", o.ID))
		}
	}
	forgetUnlisted(s, s.isolation, cluster+"/", listed, nil)
	return nil
}

// StrayIsolationObjects lists the isolation objects the sweep found
// unneeded and has not removed yet, as cluster/object.
func (s *Sweeper) StrayIsolationObjects() []string { return known(s, s.isolation) }
