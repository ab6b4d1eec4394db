package sweeper

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// spireSweepTimeout bounds one server's sweep.
const spireSweepTimeout = 30 * time.Second

// devIDAgentRetention is how long a banned agent of a gone TPM claim is
// kept after its last SVID expired before it is deleted: the longest
// DevID certificate lifetime (spec.spire.tpm.devIDCertificateTTL, at most
// 168h), so that no certificate that could attest again outlives its ban,
// whichever cluster or install signed it.
const devIDAgentRetention = 168 * time.Hour

// orphanEntry is a registration entry of this install without a claim.
type orphanEntry struct {
	firstSeen time.Time
}

// liveUIDs are the UIDs of the claims given.
func liveUIDs(claims []hfv1.MachineClaim) map[string]bool {
	return claimSet(claims, func(c *hfv1.MachineClaim) (string, bool) { return string(c.UID), true })
}

// sweepSPIRE removes from every connected SPIRE server what claims that
// no longer exist left there: their registration entries and TPM alias
// entries, known as this install's by their hint (spire.InstallHint;
// entries of other installs sharing the server, and entries written
// before hints, are never touched), once gone for the grace period and
// confirmed on the API server; and the banned tpm_devid agents of gone
// claims once no DevID certificate could make them attest again
// (devIDAgentRetention). A claim's end releases all of it itself; this is
// for claims whose finalizer was removed by hand.
func (s *Sweeper) sweepSPIRE(ctx context.Context, live map[string]bool, confirm func() ([]hfv1.MachineClaim, error)) {
	if s.Identity == nil || s.Signer == nil {
		return
	}
	listed := map[string]bool{}
	for cluster, srv := range s.Identity.Servers() {
		if err := s.sweepSPIREServer(ctx, cluster, srv, live, confirm, listed); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "SPIRE sweep failed", "HypervisorCluster", cluster)
			keepListed(s, s.spireEntries, cluster+"/", listed)
		}
	}
	forgetUnlisted(s, s.spireEntries, "", listed, nil)
}

func (s *Sweeper) sweepSPIREServer(ctx context.Context, cluster string, srv *identity.Server, live map[string]bool, confirm func() ([]hfv1.MachineClaim, error), listed map[string]bool) error {
	ctx, cancel := context.WithTimeout(ctx, spireSweepTimeout)
	defer cancel()
	entries, err := srv.API.ListEntries(ctx)
	if err != nil {
		return fmt.Errorf("list the entries of the SPIRE server of HypervisorCluster %s: %w", cluster, err)
	}
	hint := spire.InstallHint(s.Signer.OperatorID())
	now := s.Clock.Now()
	for _, e := range entries {
		uid, ok := spire.EntryClaimUID(e.ID)
		if !ok || e.Hint != hint || live[uid] {
			continue
		}
		k := cluster + "/" + e.ID
		listed[k] = true
		o, first := sighting(s, s.spireEntries, k, func() *orphanEntry { return &orphanEntry{firstSeen: now} })
		if first {
			metrics.OrphanIdentitiesFound.WithLabelValues(cluster, "entry").Inc()
			ctrl.LoggerFrom(ctx).Info("Found a SPIRE entry without a MachineClaim", "HypervisorCluster", cluster, "entry", e.ID, "spiffeID", e.SPIFFEID.String(), "dryRun", s.DryRun)
			s.event(ctx, cluster, corev1.EventTypeWarning, "OrphanSPIREEntryFound",
				fmt.Sprintf("SPIRE entry %s (%s) was created for claim %s, which no longer exists; %s", e.ID, e.SPIFFEID, uid, s.graceMode("the entry", "deleted")))
		}
		if !s.due(o.firstSeen, now) {
			continue
		}
		removed, err := deleteConfirmed(confirm, uid, metrics.OrphanIdentitiesRemoved.WithLabelValues(cluster, "entry"),
			func() error { return srv.API.DeleteEntries(ctx, e.ID) })
		if err != nil {
			return fmt.Errorf("delete SPIRE entry %s: %w", e.ID, err)
		}
		if !removed {
			continue
		}
		delete(listed, k)
		s.event(ctx, cluster, corev1.EventTypeNormal, "OrphanSPIREEntryRemoved", fmt.Sprintf("Deleted SPIRE entry %s (%s) of deleted claim %s", e.ID, e.SPIFFEID, uid))
	}
	return s.sweepDevIDAgents(ctx, cluster, srv, live, confirm, now)
}

// sweepDevIDAgents deletes the banned tpm_devid agents of gone claims once
// their certificates cannot attest any more.
func (s *Sweeper) sweepDevIDAgents(ctx context.Context, cluster string, srv *identity.Server, live map[string]bool, confirm func() ([]hfv1.MachineClaim, error), now time.Time) error {
	agents, err := srv.API.ListAgents(ctx)
	if err != nil {
		return fmt.Errorf("list the agents of the SPIRE server of HypervisorCluster %s: %w", cluster, err)
	}
	for _, a := range agents {
		uid, ok := spire.DevIDAgentClaimUID(a)
		if !ok || !a.Banned || live[uid] || now.Before(a.X509SVIDExpiresAt.Add(devIDAgentRetention)) || s.DryRun {
			continue
		}
		removed, err := deleteConfirmed(confirm, uid, metrics.OrphanIdentitiesRemoved.WithLabelValues(cluster, "agent"),
			func() error { return srv.API.DeleteAgent(ctx, a.ID) })
		if err != nil {
			return fmt.Errorf("delete SPIRE agent %s: %w", a.ID, err)
		}
		if removed {
			ctrl.LoggerFrom(ctx).Info("Deleted the banned SPIRE agent of a deleted TPM claim", "HypervisorCluster", cluster, "agent", a.ID.String(), "claimUID", uid)
		}
	}
	return nil
}

// deleteConfirmed deletes, with del, what the claim with uid left on a
// SPIRE server once the claims read from the API server (confirm) show it
// is gone, and counts the removal; removed is false when the claim is
// there after all.
func deleteConfirmed(confirm func() ([]hfv1.MachineClaim, error), uid string, removals prometheus.Counter, del func() error) (removed bool, err error) {
	claims, err := confirm()
	if err != nil {
		return false, err
	}
	if liveUIDs(claims)[uid] {
		return false, nil
	}
	if err := del(); err != nil {
		return false, err
	}
	removals.Inc()
	return true, nil
}

// SPIREOrphans returns the SPIRE entries currently known as orphans, by
// "cluster/entry id".
func (s *Sweeper) SPIREOrphans() []string {
	s.defaults()
	return known(s, s.spireEntries)
}
