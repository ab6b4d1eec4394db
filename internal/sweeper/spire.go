package sweeper

import (
	"context"
	"fmt"
	"strings"
	"time"

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
	out := make(map[string]bool, len(claims))
	for i := range claims {
		out[string(claims[i].UID)] = true
	}
	return out
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
			s.keepEntries(cluster, listed)
		}
	}
	s.mu.Lock()
	for k := range s.spireEntries {
		if !listed[k] {
			delete(s.spireEntries, k)
		}
	}
	s.mu.Unlock()
}

// keepEntries marks the known orphan entries of cluster as still listed.
func (s *Sweeper) keepEntries(cluster string, listed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.spireEntries {
		if strings.HasPrefix(k, cluster+"/") {
			listed[k] = true
		}
	}
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
		if now.Sub(o.firstSeen) < s.GracePeriod || s.DryRun {
			continue
		}
		claims, err := confirm()
		if err != nil {
			return err
		}
		if liveUIDs(claims)[uid] {
			continue
		}
		if err := srv.API.DeleteEntries(ctx, e.ID); err != nil {
			return fmt.Errorf("delete SPIRE entry %s: %w", e.ID, err)
		}
		delete(listed, k)
		metrics.OrphanIdentitiesRemoved.WithLabelValues(cluster, "entry").Inc()
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
		claims, err := confirm()
		if err != nil {
			return err
		}
		if liveUIDs(claims)[uid] {
			continue
		}
		if err := srv.API.DeleteAgent(ctx, a.ID); err != nil {
			return fmt.Errorf("delete SPIRE agent %s: %w", a.ID, err)
		}
		metrics.OrphanIdentitiesRemoved.WithLabelValues(cluster, "agent").Inc()
		ctrl.LoggerFrom(ctx).Info("Deleted the banned SPIRE agent of a deleted TPM claim", "HypervisorCluster", cluster, "agent", a.ID.String(), "claimUID", uid)
	}
	return nil
}

// SPIREOrphans returns the SPIRE entries currently known as orphans, by
// "cluster/entry id".
func (s *Sweeper) SPIREOrphans() []string {
	s.defaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.spireEntries))
	for k := range s.spireEntries {
		out = append(out, k)
	}
	return out
}
