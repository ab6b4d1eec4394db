// Package sweeper finds and removes what deleted MachineClaims left
// behind: orphaned VMs, stray cloud-init ISOs, orphaned CI runners and DNS
// records (docs/architecture.md, "Lifecycle: labels, sweep, retention, stuck
// detection"; docs/security.md, "Orphans: VMs, ISOs, runners").
//
// A VM is destroyed only when all of these hold: it carries this install's
// tag, or the install's keyed clone name (a clone never configured), in the
// batch listing; its signed description block verifies for its own VM id;
// no claim in the cache points at it; the claim named in the block does not
// exist (or has another UID) when read directly from the API server; and it
// has been seen orphaned for longer than the grace period. Foreign VMs,
// forged or copied markers and templates are never touched.
//
// An ISO (media.go), a runner (runners.go) and a DNS name (dns.go) are
// removed under the same rules: a name only this install writes (for DNS,
// its marker TXT), no claim in the cache nor on the API server, the grace
// period; the provider re-checks an ISO against its
// VM before deleting it. Removals are reported only once the thing is gone.
// In dry-run mode the sweeper only reports.
package sweeper

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Sweeper is a manager Runnable; it runs only on the leader.
type Sweeper struct {
	// Client reads claims from the cache; APIReader reads them from the
	// API server, so a claim created a moment ago is never missed.
	Client    client.Reader
	APIReader client.Reader
	Registry  *hypervisors.Registry
	Recorder  record.EventRecorder
	Clock     clock.PassiveClock
	// Interval between sweeps (default 1 minute).
	Interval time.Duration
	// GracePeriod a VM must stay orphaned before it is destroyed (default
	// 10 minutes): it covers a claim whose status has not been written yet.
	GracePeriod time.Duration
	// DryRun reports orphans without destroying them.
	DryRun bool
	// Signer verifies the install's runner names; with Runners it enables
	// the runner sweep.
	Signer *ownership.Signer
	// Runners lists the CI scopes whose runners are swept; nil sweeps no
	// runners.
	Runners RunnerScopes
	// DNS holds the clusters' DNS registrars; with Signer (whose operator
	// id owns the records) it enables the DNS record sweep (dns.go).
	DNS *dnsreg.Clusters
	// Identity holds the clusters' SPIRE servers; with Signer (whose
	// operator id is the entries' hint) it enables the SPIRE sweep
	// (spire.go).
	Identity *identity.Registry

	init     sync.Once
	mu       sync.Mutex
	orphans  map[string]*orphan       // by cluster/vmid
	reported map[string]bool          // foreign VMs already logged
	media    map[string]*strayMedium  // by cluster/node/medium id
	runners  map[string]*orphanRunner // by scope/runner name
	dnsNames map[string]*orphanName   // by cluster/name/claim UID
	// spireEntries are the orphan SPIRE entries, by cluster/entry id.
	spireEntries map[string]*orphanEntry
	// isolation are the isolation objects no claim needs, by
	// cluster/object id (isolation.go).
	isolation map[string]*strayIsolation
	// unverified are, by cluster, the VMs of the latest sweep that carry
	// this install's tag but whose ownership block does not verify, with
	// the reason.
	unverified map[string]map[provider.ID]string
	// kick wakes the loop to destroy VMs handed over by Vanished, without
	// waiting for the next sweep.
	kick chan struct{}
}

type orphan struct {
	firstSeen time.Time
	owner     provider.Owner
	progress  provider.Progress
	// deleting is set once DeleteVM was called: the deletion is finished
	// even after the VM has left the listing.
	deleting bool
	// vanished: handed over by Vanished, its claim known gone; destroyed
	// without the grace period.
	vanished bool
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *Sweeper) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (s *Sweeper) Start(ctx context.Context) error {
	s.defaults()
	log := ctrl.LoggerFrom(ctx).WithName("orphan-sweeper")
	ctx = ctrl.LoggerInto(ctx, log)
	log.Info("Starting orphan sweeper", "interval", s.Interval, "gracePeriod", s.GracePeriod, "dryRun", s.DryRun)
	t := time.NewTicker(s.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.SweepAll(ctx)
		case <-s.kick:
			if s.removeVanished(ctx) {
				// Unfinished (a clone still holds the VM's lock, the
				// cluster is away): look again shortly.
				time.AfterFunc(vanishedRetry, s.wake)
			}
		}
	}
}

// defaults fills in unset options and the sweeper's maps once: Start runs
// it, and so do the cluster controller's calls (Unverified, Forget), which
// can come first or at the same time.
func (s *Sweeper) defaults() {
	s.init.Do(func() {
		if s.Clock == nil {
			s.Clock = clock.RealClock{}
		}
		if s.Interval <= 0 {
			s.Interval = time.Minute
		}
		if s.GracePeriod <= 0 {
			s.GracePeriod = 10 * time.Minute
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.kick = make(chan struct{}, 1)
		if s.orphans == nil {
			s.orphans = map[string]*orphan{}
			s.reported = map[string]bool{}
			s.unverified = map[string]map[provider.ID]string{}
			s.media = map[string]*strayMedium{}
			s.runners = map[string]*orphanRunner{}
			s.dnsNames = map[string]*orphanName{}
			s.spireEntries = map[string]*orphanEntry{}
			s.isolation = map[string]*strayIsolation{}
		}
	})
}

// SweepAll sweeps every connected cluster once.
func (s *Sweeper) SweepAll(ctx context.Context) {
	s.defaults()
	var claims hfv1.MachineClaimList
	if err := s.Client.List(ctx, &claims); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "List MachineClaims for the orphan sweep")
		return
	}
	inUse := map[string]bool{}
	for i := range claims.Items {
		if ref := claims.Items[i].Status.VMRef; ref != nil {
			inUse[key(ref.HypervisorCluster, provider.ID(ref.ID()))] = true
		}
	}
	live := claimDigests(claims.Items)
	liveIsolation := isolationDigests(claims.Items)
	confirm := s.confirmClaims(ctx)
	confirmDigests := func() (map[string]bool, error) {
		claims, err := confirm()
		if err != nil {
			return nil, err
		}
		return claimDigests(claims), nil
	}
	for _, name := range s.Registry.Names() {
		if err := s.Sweep(ctx, name, inUse); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Orphan sweep failed", "HypervisorCluster", name)
		}
		if p, health, ok := s.Registry.Provider(name); ok && health.Ready {
			if err := s.sweepMedia(ctx, name, p, live, confirmDigests); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Cloud-init ISO sweep failed", "HypervisorCluster", name)
			}
			if err := s.sweepIsolation(ctx, name, p, liveIsolation, confirm); err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "Isolation object sweep failed", "HypervisorCluster", name)
			}
		}
	}
	s.sweepRunners(ctx, runnersOf(claims.Items), confirm)
	s.sweepDNS(ctx, liveDNSOwners(claims.Items), confirm)
	s.sweepSPIRE(ctx, liveUIDs(claims.Items), confirm)
}

// confirmClaims returns a function that lists the claims from the API
// server, not the cache, at most once per sweep and only when something is
// about to be deleted: a claim created a moment ago is never missed.
func (s *Sweeper) confirmClaims(ctx context.Context) func() ([]hfv1.MachineClaim, error) {
	var claims *hfv1.MachineClaimList
	return func() ([]hfv1.MachineClaim, error) {
		if claims != nil {
			return claims.Items, nil
		}
		var list hfv1.MachineClaimList
		if err := s.APIReader.List(ctx, &list); err != nil {
			return nil, fmt.Errorf("list MachineClaims from the API server: %w", err)
		}
		claims = &list
		return claims.Items, nil
	}
}

// claimSet is the set of the keys keyOf gives the claims, leaving out
// those for which it says false: what the claims own, as one sweep tells
// it from their names or UIDs.
func claimSet(claims []hfv1.MachineClaim, keyOf func(*hfv1.MachineClaim) (string, bool)) map[string]bool {
	out := make(map[string]bool, len(claims))
	for i := range claims {
		if k, ok := keyOf(&claims[i]); ok {
			out[k] = true
		}
	}
	return out
}

// due reports whether a thing first seen without its claim at firstSeen
// may be removed at now: the grace period has passed, and the sweeper is
// not in dry-run mode.
func (s *Sweeper) due(firstSeen, now time.Time) bool {
	return now.Sub(firstSeen) >= s.GracePeriod && !s.DryRun
}

// Sweep checks one cluster's latest listing for orphans.
func (s *Sweeper) Sweep(ctx context.Context, cluster string, inUse map[string]bool) error {
	log := ctrl.LoggerFrom(ctx).WithValues("HypervisorCluster", cluster)
	p, health, ok := s.Registry.Provider(cluster)
	listing := s.Registry.Listing(cluster)
	if !ok || !health.Ready || listing == nil {
		return nil
	}
	metrics.SweepingCluster(cluster)
	now := s.Clock.Now()
	live := map[string]bool{}
	unverified := map[provider.ID]string{}
	defer s.setUnverified(cluster, unverified)
	for _, vm := range listing.VMs {
		k := key(cluster, vm.ID)
		// A configured VM carries the install's tag; a clone that was never
		// configured carries only the install's keyed name.
		if (!vm.OperatorTagged && !vm.InstallNamed) || vm.Template || inUse[k] {
			continue
		}
		live[k] = true
		o, err := s.candidate(ctx, p, cluster, vm, now, unverified)
		if err != nil {
			log.Error(err, "Check orphan candidate", "vmid", vm.ID)
			continue
		}
		if o == nil || (!o.vanished && now.Sub(o.firstSeen) < s.GracePeriod) {
			continue
		}
		if s.DryRun {
			continue
		}
		if err := s.remove(ctx, p, cluster, vm.ID, o); err != nil {
			log.Error(err, "Remove orphaned VM", "vmid", vm.ID)
		}
	}
	// An orphan whose deletion this sweeper started leaves the listing
	// once destroyed, before its ISO is gone and before DeleteVM reports
	// Done: finish it. Forget the others that disappeared or were adopted.
	// A vanished claim's VM may not be listed yet (its clone was requested
	// after the listing): it is destroyed all the same.
	unfinished := forgetUnlisted(s, s.orphans, cluster+"/", live, func(o *orphan) bool {
		return (o.deleting || o.vanished) && !s.DryRun
	})
	for _, o := range unfinished {
		if err := s.remove(ctx, p, cluster, o.progress.ID, o); err != nil {
			log.Error(err, "Remove orphaned VM", "vmid", o.progress.ID)
		}
	}
	return nil
}

// candidate verifies a tagged VM and returns its orphan record, or nil when
// the VM is not an orphan (foreign, or its claim lives). A VM whose block
// does not verify is added to unverified with the reason.
func (s *Sweeper) candidate(ctx context.Context, p provider.Provider, cluster string, summary provider.VMSummary, now time.Time, unverified map[provider.ID]string) (*orphan, error) {
	log := ctrl.LoggerFrom(ctx)
	k := key(cluster, summary.ID)
	s.mu.Lock()
	o := s.orphans[k]
	s.mu.Unlock()
	if o != nil {
		return o, nil
	}
	vm, err := p.GetVM(ctx, provider.VMRef{ID: summary.ID, Node: summary.Node})
	if errors.Is(err, provider.ErrNotFound) {
		// Gone since the listing was taken (destroyed by its claim, most
		// often): nothing to sweep.
		log.V(1).Info("Orphan candidate is gone", "vmid", summary.ID)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if vm.Owner == nil {
		unverified[summary.ID] = fmt.Sprint(vm.OwnershipError)
		s.mu.Lock()
		first := !s.reported[k]
		s.reported[k] = true
		s.mu.Unlock()
		if first {
			what := "VM carries this install's tag"
			if vm.InstallNamed {
				// Proof enough that this install cloned it, yet not of
				// which claim it is for: without the claim nothing says it
				// is an orphan, so it is reported and left to an admin.
				what = "VM carries this install's clone name"
			}
			log.Info(what+" but its ownership marker does not verify; never touching it",
				"vmid", summary.ID, "name", vm.Name, "reason", fmt.Sprint(vm.OwnershipError))
		}
		return nil, nil
	}
	var claim hfv1.MachineClaim
	err = s.APIReader.Get(ctx, client.ObjectKey{Namespace: vm.Owner.Namespace, Name: vm.Owner.Name}, &claim)
	switch {
	case err == nil && string(claim.UID) == vm.Owner.UID:
		return nil, nil // the claim lives; it will record or adopt the VM
	case err != nil && !apierrors.IsNotFound(err):
		return nil, err
	}
	o = &orphan{firstSeen: now, owner: *vm.Owner, progress: provider.Progress{ID: summary.ID, Node: summary.Node}}
	s.mu.Lock()
	s.orphans[k] = o
	s.mu.Unlock()
	metrics.OrphansFound.WithLabelValues(cluster).Inc()
	mode := s.graceMode("it", "destroyed")
	msg := fmt.Sprintf("VM %s (claim %s/%s, uid %s) has no MachineClaim; %s", summary.ID, vm.Owner.Namespace, vm.Owner.Name, vm.Owner.UID, mode)
	log.Info("Found orphaned VM", "vmid", summary.ID, "claim", vm.Owner.Namespace+"/"+vm.Owner.Name, "dryRun", s.DryRun)
	s.event(ctx, cluster, corev1.EventTypeWarning, "OrphanFound", msg)
	return o, nil
}

// setUnverified records a sweep's unverifiable VMs of cluster.
func (s *Sweeper) setUnverified(cluster string, vms map[provider.ID]string) {
	s.mu.Lock()
	s.unverified[cluster] = vms
	s.mu.Unlock()
	metrics.UnverifiedVMs.WithLabelValues(cluster).Set(float64(len(vms)))
}

// Unverified returns the VMs of cluster that carry this install's tag, are
// not recorded by any claim, and whose ownership block did not verify in
// the latest sweep, with the reason; swept is false until cluster has been
// swept once. VMs that claims record are checked by the claims themselves
// (their OwnershipVerified condition), not here.
func (s *Sweeper) Unverified(cluster string) (vms map[provider.ID]string, swept bool) {
	s.defaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	got, swept := s.unverified[cluster]
	return maps.Clone(got), swept
}

// Forget drops what the sweeper knows about a deleted cluster.
func (s *Sweeper) Forget(cluster string) {
	s.defaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.unverified, cluster)
}

// remove advances the deletion of an orphan by one step per sweep.
func (s *Sweeper) remove(ctx context.Context, p provider.Provider, cluster string, vmid provider.ID, o *orphan) error {
	res, err := p.DeleteVM(ctx, o.owner, o.progress)
	if errors.Is(err, provider.ErrNotOwned) {
		// The VM at that id no longer proves it is the orphan's (its marker
		// was changed, or the id was taken by another VM): nothing of ours
		// is there to remove, and nothing is reported removed.
		forget(s, s.orphans, key(cluster, vmid))
		ctrl.LoggerFrom(ctx).Info("Orphaned VM no longer verifies; leaving it", "vmid", vmid, "HypervisorCluster", cluster, "reason", err.Error())
		return nil
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	o.progress, o.deleting = res.Progress, true
	s.mu.Unlock()
	if !res.Done {
		return nil
	}
	forget(s, s.orphans, key(cluster, vmid))
	metrics.OrphansRemoved.WithLabelValues(cluster).Inc()
	s.event(ctx, cluster, corev1.EventTypeNormal, "OrphanRemoved", fmt.Sprintf("Destroyed orphaned VM %s of deleted claim %s/%s", vmid, o.owner.Namespace, o.owner.Name))
	ctrl.LoggerFrom(ctx).Info("Removed orphaned VM", "vmid", vmid, "HypervisorCluster", cluster)
	return nil
}

// graceMode says, in a found event, what becomes of subject: done after
// the grace period, or nothing in dry-run mode.
func (s *Sweeper) graceMode(subject, done string) string {
	if s.DryRun {
		return "dry-run: " + subject + " will not be " + done
	}
	return subject + " will be " + done + " after the grace period"
}

// event records an event on the HypervisorCluster.
func (s *Sweeper) event(ctx context.Context, cluster, typ, reason, msg string) {
	if s.Recorder == nil {
		return
	}
	var c hfv1.HypervisorCluster
	if err := s.Client.Get(ctx, client.ObjectKey{Name: cluster}, &c); err != nil {
		return
	}
	s.Recorder.Event(&c, typ, reason, msg)
}

// Orphans returns the VMs currently known as orphans, by "cluster/vmid".
func (s *Sweeper) Orphans() []string { return known(s, s.orphans) }

func key(cluster string, vm provider.ID) string { return cluster + "/" + string(vm) }
