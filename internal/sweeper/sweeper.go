// Package sweeper finds and removes orphaned VMs: VMs whose ownership
// marker proves this HyperFleet install created them but whose MachineClaim
// no longer exists (seed 001 section 8A, seed Property 26).
//
// A VM is destroyed only when all of these hold: it carries this install's
// tag (cheap pre-selection from the batch listing), its signed description
// block verifies for its own VM id, no claim in the cache points at it, the
// claim named in the block does not exist (or has another UID) when read
// directly from the API server, and it has been seen orphaned for longer
// than the grace period. Foreign VMs, forged or copied markers and templates
// are never touched. In dry-run mode the sweeper only reports.
package sweeper

import (
	"context"
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
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
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

	mu       sync.Mutex
	orphans  map[string]*orphan // by cluster/vmid
	reported map[string]bool    // foreign VMs already logged
	// unverified are, by cluster, the VMs of the latest sweep that carry
	// this install's tag but whose ownership block does not verify, with
	// the reason.
	unverified map[string]map[int]string
}

type orphan struct {
	firstSeen time.Time
	owner     provider.Owner
	progress  provider.Progress
	counted   bool
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
		}
	}
}

func (s *Sweeper) defaults() {
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
	if s.orphans == nil {
		s.orphans = map[string]*orphan{}
		s.reported = map[string]bool{}
		s.unverified = map[string]map[int]string{}
	}
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
			inUse[key(ref.HypervisorCluster, int(ref.VMID))] = true
		}
	}
	for _, name := range s.Registry.Names() {
		if err := s.Sweep(ctx, name, inUse); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Orphan sweep failed", "HypervisorCluster", name)
		}
	}
}

// Sweep checks one cluster's latest listing for orphans.
func (s *Sweeper) Sweep(ctx context.Context, cluster string, inUse map[string]bool) error {
	log := ctrl.LoggerFrom(ctx).WithValues("HypervisorCluster", cluster)
	p, health, ok := s.Registry.Provider(cluster)
	listing := s.Registry.Listing(cluster)
	if !ok || !health.Ready || listing == nil {
		return nil
	}
	now := s.Clock.Now()
	live := map[string]bool{}
	unverified := map[int]string{}
	defer s.setUnverified(cluster, unverified)
	for _, vm := range listing.VMs {
		k := key(cluster, vm.VMID)
		if !vm.OperatorTagged || vm.Template || inUse[k] {
			continue
		}
		live[k] = true
		o, err := s.candidate(ctx, p, cluster, vm, now, unverified)
		if err != nil {
			log.Error(err, "Check orphan candidate", "vmid", vm.VMID)
			continue
		}
		if o == nil || now.Sub(o.firstSeen) < s.GracePeriod {
			continue
		}
		if s.DryRun {
			continue
		}
		if err := s.remove(ctx, p, cluster, vm.VMID, o); err != nil {
			log.Error(err, "Remove orphaned VM", "vmid", vm.VMID)
		}
	}
	// Forget orphans that disappeared or were adopted.
	s.mu.Lock()
	for k := range s.orphans {
		if len(k) > len(cluster) && k[:len(cluster)+1] == cluster+"/" && !live[k] {
			delete(s.orphans, k)
		}
	}
	s.mu.Unlock()
	return nil
}

// candidate verifies a tagged VM and returns its orphan record, or nil when
// the VM is not an orphan (foreign, or its claim lives). A VM whose block
// does not verify is added to unverified with the reason.
func (s *Sweeper) candidate(ctx context.Context, p provider.Provider, cluster string, summary provider.VMSummary, now time.Time, unverified map[int]string) (*orphan, error) {
	log := ctrl.LoggerFrom(ctx)
	k := key(cluster, summary.VMID)
	s.mu.Lock()
	o := s.orphans[k]
	s.mu.Unlock()
	if o != nil {
		return o, nil
	}
	vm, err := p.GetVM(ctx, provider.VMRef{VMID: summary.VMID, Node: summary.Node})
	if err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if vm.Owner == nil {
		unverified[summary.VMID] = fmt.Sprint(vm.OwnershipError)
		s.mu.Lock()
		first := !s.reported[k]
		s.reported[k] = true
		s.mu.Unlock()
		if first {
			log.Info("VM carries this install's tag but its ownership marker does not verify; never touching it",
				"vmid", summary.VMID, "reason", fmt.Sprint(vm.OwnershipError))
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
	o = &orphan{firstSeen: now, owner: *vm.Owner, progress: provider.Progress{VMID: summary.VMID, Node: summary.Node}}
	s.mu.Lock()
	s.orphans[k] = o
	s.mu.Unlock()
	metrics.OrphansFound.WithLabelValues(cluster).Inc()
	mode := "it will be destroyed after the grace period"
	if s.DryRun {
		mode = "dry-run: it will not be destroyed"
	}
	msg := fmt.Sprintf("VM %d (claim %s/%s, uid %s) has no MachineClaim; %s", summary.VMID, vm.Owner.Namespace, vm.Owner.Name, vm.Owner.UID, mode)
	log.Info("Found orphaned VM", "vmid", summary.VMID, "claim", vm.Owner.Namespace+"/"+vm.Owner.Name, "dryRun", s.DryRun)
	s.event(ctx, cluster, corev1.EventTypeWarning, "OrphanFound", msg)
	return o, nil
}

// setUnverified records a sweep's unverifiable VMs of cluster.
func (s *Sweeper) setUnverified(cluster string, vms map[int]string) {
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
func (s *Sweeper) Unverified(cluster string) (vms map[int]string, swept bool) {
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
func (s *Sweeper) remove(ctx context.Context, p provider.Provider, cluster string, vmid int, o *orphan) error {
	res, err := p.DeleteVM(ctx, o.owner, o.progress)
	if err != nil {
		return err
	}
	o.progress = res.Progress
	if !res.Done {
		return nil
	}
	s.mu.Lock()
	delete(s.orphans, key(cluster, vmid))
	s.mu.Unlock()
	metrics.OrphansRemoved.WithLabelValues(cluster).Inc()
	s.event(ctx, cluster, corev1.EventTypeNormal, "OrphanRemoved", fmt.Sprintf("Destroyed orphaned VM %d of deleted claim %s/%s", vmid, o.owner.Namespace, o.owner.Name))
	ctrl.LoggerFrom(ctx).Info("Removed orphaned VM", "vmid", vmid, "HypervisorCluster", cluster)
	return nil
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
func (s *Sweeper) Orphans() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.orphans))
	for k := range s.orphans {
		out = append(out, k)
	}
	return out
}

func key(cluster string, vmid int) string { return fmt.Sprintf("%s/%d", cluster, vmid) }
