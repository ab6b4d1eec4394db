package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/conditions"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/phase"
	"github.com/hyperfleet/hyperfleet/internal/poolclaims"
	"github.com/hyperfleet/hyperfleet/internal/poolplacement"
)

// A pool with spec.placement builds its VMs from more templates than its
// templateRef, each on its own cluster, and spills to the next when one is
// full, over quota or unreachable (docs/runnerpool.md, "Overflow across
// clusters"). The pool's platform, scope, credentials and listeners stay
// templateRef's: an overflow template must bootstrap exactly as templateRef
// does. Each pass derives every template's state from what it observes
// (poolplacement.StateOf) and chooses the template of each new claim from
// those states (poolplacement.Plan): nothing is remembered between passes,
// so once the first template takes VMs again, pack's next VMs go back to it.

// poolTemplates are the names of the pool's templates in priority order:
// templateRef, then spec.placement.templates (a repeat of templateRef is
// dropped).
func poolTemplates(pool *hfv1.RunnerPool) []string {
	names := []string{pool.Spec.TemplateRef.Name}
	if p := pool.Spec.Placement; p != nil {
		for _, t := range p.Templates {
			if !slices.Contains(names, t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	return names
}

// loadOverflow reads the templates of spec.placement after templateRef
// (s.tmpl, read by load) into s.tmpls, index-aligned with poolTemplates
// (nil for a missing one), and their hashes.
func (r *RunnerPoolReconciler) loadOverflow(ctx context.Context, s *poolScope) error {
	names := poolTemplates(s.pool)
	s.tmpls = make([]*hfv1.HypervisorMachineTemplate, len(names))
	s.tmpls[0] = s.tmpl
	s.hashes = map[string]string{names[0]: s.hash}
	for i, name := range names[1:] {
		t := &hfv1.HypervisorMachineTemplate{}
		switch err := r.Client.Get(ctx, client.ObjectKey{Namespace: s.pool.Namespace, Name: name}, t); {
		case err == nil:
			s.tmpls[i+1] = t
			s.hashes[name] = t.Status.TemplateHash
		case apierrors.IsNotFound(err):
		default:
			return fmt.Errorf("read HypervisorMachineTemplate %s of spec.placement: %w", name, err)
		}
	}
	return nil
}

// derivePlacement sets s.placement: each template's cluster, live
// machines and state, from the templates, their clusters' status and the
// pool's claims waiting on them.
func (r *RunnerPoolReconciler) derivePlacement(ctx context.Context, s *poolScope) error {
	names := poolTemplates(s.pool)
	facts := make([]poolplacement.Facts, len(names))
	s.placement = make([]poolplacement.Template, len(names))
	index := map[string]int{}
	for i, name := range names {
		index[name] = i
		s.placement[i].Name = name
		facts[i].Waiting = map[hfv1.ConditionReason]int{}
	}
	pc := s.claims
	for _, c := range slices.Concat(pc.Starting, pc.Idle, pc.Busy, pc.StandbyReady, pc.StandbyBuilding) {
		i, ok := index[c.Spec.TemplateRef.Name]
		if !ok {
			continue
		}
		s.placement[i].Machines++
		if reason, waits := waitingToPlace(c); waits {
			facts[i].Waiting[reason]++
		}
	}
	polled := make([]time.Time, len(names))
	for i, t := range s.tmpls {
		if t == nil {
			facts[i].Invalid = fmt.Sprintf("HypervisorMachineTemplate %s/%s does not exist", s.pool.Namespace, names[i])
			continue
		}
		s.placement[i].Cluster = t.Spec.HypervisorClusterRef.Name
		if i > 0 {
			facts[i].Invalid = r.overflowMismatch(s, t)
		}
		if facts[i].Invalid != "" {
			continue
		}
		var err error
		if polled[i], err = r.clusterFacts(ctx, t, &facts[i]); err != nil {
			return err
		}
	}
	for i := range s.placement {
		t := &s.placement[i]
		t.State, t.Message = poolplacement.StateOf(facts[i])
		t.State, t.Message, _ = poolplacement.Carry(previousPlacement(s.read, t.Name), t.State, t.Message, t.Machines, polled[i])
	}
	return nil
}

// previousPlacement is the entry of status.placement for template name as
// the pass read it; nil when there is none.
func previousPlacement(pool *hfv1.RunnerPool, name string) *hfv1.TemplatePlacement {
	for i := range pool.Status.Placement {
		if p := &pool.Status.Placement[i]; p.Name == name {
			return p
		}
	}
	return nil
}

// overflowMismatch says why an overflow template t cannot build VMs for
// the pool, "" when it can: its bootstrap must equal templateRef's, since
// the pool's scope, credentials and listeners are verified and run with
// templateRef's (a VM of t is the same runner elsewhere), and it must
// have the pool's platform.
func (r *RunnerPoolReconciler) overflowMismatch(s *poolScope, t *hfv1.HypervisorMachineTemplate) string {
	if msg := platformMismatch(r.Workloads, s.pool, t); msg != "" {
		return msg
	}
	if s.tmpl != nil && !equality.Semantic.DeepEqual(s.tmpl.Spec.Bootstrap, t.Spec.Bootstrap) {
		return fmt.Sprintf("spec.placement.templates: HypervisorMachineTemplate %s has a spec.bootstrap different from templateRef %s's; "+
			"an overflow template must register the same runners with the same credentials, so its spec.bootstrap must be equal", t.Name, s.tmpl.Name)
	}
	return ""
}

// clusterFacts fills f from template t's readiness and its cluster's
// status: not ready because of its cluster, or a cluster not Connected,
// is Unreachable; a template not ready for another reason is Invalid; a
// cluster whose online nodes all lack the template's memory is Full. It
// returns when the cluster's status was last polled (zero when unknown).
func (r *RunnerPoolReconciler) clusterFacts(ctx context.Context, t *hfv1.HypervisorMachineTemplate, f *poolplacement.Facts) (time.Time, error) {
	if msg := notReadyForVMs(t); msg != "" {
		if ready := hfv1.FindCondition(t.Status.Conditions, hfv1.ReadyCondition); ready != nil && ready.Reason == string(hfv1.ClusterUnavailableReason) {
			f.Unreachable = msg
		} else {
			f.Invalid = msg
		}
		return time.Time{}, nil
	}
	cluster := &hfv1.HypervisorCluster{}
	switch err := r.Client.Get(ctx, client.ObjectKey{Name: t.Spec.HypervisorClusterRef.Name}, cluster); {
	case apierrors.IsNotFound(err):
		f.Unreachable = fmt.Sprintf("HypervisorCluster %s does not exist", t.Spec.HypervisorClusterRef.Name)
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, fmt.Errorf("read HypervisorCluster %s of template %s: %w", t.Spec.HypervisorClusterRef.Name, t.Name, err)
	}
	var polled time.Time
	if p := cluster.Status.LastPollTime; p != nil {
		polled = p.Time
	}
	if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterConnectedCondition); c != nil && c.Status == metav1.ConditionFalse {
		f.Unreachable = fmt.Sprintf("HypervisorCluster %s is not connected: %s", cluster.Name, c.Message)
		return polled, nil
	}
	f.Full = memoryShort(cluster, t)
	if f.Full == "" {
		full, err := r.atMaxMachines(ctx, cluster)
		if err != nil {
			return polled, err
		}
		f.Full = full
	}
	return polled, nil
}

// atMaxMachines says that cluster holds as many of the install's VMs as
// its spec.limits.maxMachines allows, counted from the claims whose VM is
// on it (the cap placement enforces counts the install's VMs, which are
// its claims'), so that a template there is Full whether or not one of
// the pool's claims waits on it; "" when it has room or sets no cap.
func (r *RunnerPoolReconciler) atMaxMachines(ctx context.Context, cluster *hfv1.HypervisorCluster) (string, error) {
	lim := cluster.Spec.Limits
	if lim == nil || lim.MaxMachines == nil {
		return "", nil
	}
	var claims hfv1.MachineClaimList
	if err := r.Client.List(ctx, &claims, client.MatchingFields{fieldindex.ClaimCluster: cluster.Name}); err != nil {
		return "", fmt.Errorf("list the MachineClaims on HypervisorCluster %s: %w", cluster.Name, err)
	}
	if n := len(claims.Items); n >= int(*lim.MaxMachines) {
		return fmt.Sprintf("HypervisorCluster %s is at its spec.limits.maxMachines (%d): %d claims' VMs are on it (%s)",
			cluster.Name, *lim.MaxMachines, n, hfv1.MaxMachinesReachedReason), nil
	}
	return "", nil
}

// memoryShort says that no online node of cluster has the memory a VM of
// t needs, as its last status reported it (capacity less allocated, which
// counts the VMs being created: the free memory placement compares with);
// "" when one has, or when the status lists no nodes.
func memoryShort(cluster *hfv1.HypervisorCluster, t *hfv1.HypervisorMachineTemplate) string {
	need := t.Spec.Resources.Memory.Value()
	if need <= 0 || len(cluster.Status.Nodes) == 0 {
		return ""
	}
	var most int64
	for _, n := range cluster.Status.Nodes {
		if n.State != "online" || n.Capacity.Memory == nil {
			continue
		}
		free := n.Capacity.Memory.Value()
		if n.Allocated.Memory != nil {
			free -= n.Allocated.Memory.Value()
		}
		if free >= need {
			return ""
		}
		most = max(most, free)
	}
	return fmt.Sprintf("no online node of HypervisorCluster %s has %d MiB free for a VM of template %s (the most is %d MiB)", cluster.Name, need>>20, t.Name, most>>20)
}

// notReadyForVMs says why no new VM may be built from t, "" when one may.
func notReadyForVMs(t *hfv1.HypervisorMachineTemplate) string {
	ready := hfv1.FindCondition(t.Status.Conditions, hfv1.ReadyCondition)
	switch {
	case !t.DeletionTimestamp.IsZero():
		return fmt.Sprintf("HypervisorMachineTemplate %s is being deleted", t.Name)
	case ready == nil || t.Status.ObservedGeneration != t.Generation:
		return fmt.Sprintf("HypervisorMachineTemplate %s has not been validated yet", t.Name)
	case ready.Status != metav1.ConditionTrue:
		return fmt.Sprintf("HypervisorMachineTemplate %s is not ready: %s: %s", t.Name, ready.Reason, ready.Message)
	}
	return ""
}

// waitingToPlace is the Provisioned reason of a claim that has nothing on
// a hypervisor yet and waits to be placed; false for any other claim.
func waitingToPlace(c *hfv1.MachineClaim) (hfv1.ConditionReason, bool) {
	if !nothingPlaced(c) {
		return "", false
	}
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return "", false
	}
	return hfv1.ConditionReason(cond.Reason), true
}

// nothingPlaced reports whether the claim has nothing that deleting it
// could leave behind: no VM (status.vmRef and status.placementRecord are
// written in the claim's one write before its clone request, and an
// earlier operator's reservation annotations in its), no runner
// credential issued, and no end under way. Its finalizer still releases
// whatever an address or identity it holds.
func nothingPlaced(c *hfv1.MachineClaim) bool {
	if c.Status.VMRef != nil || c.Status.PlacementRecord != "" || c.Status.End != nil || !c.DeletionTimestamp.IsZero() {
		return false
	}
	if _, ok := c.Annotations[hfv1.VMReservationAnnotation]; ok {
		return false
	}
	if _, ok := c.Annotations[hfv1.PlacementAnnotation]; ok {
		return false
	}
	st := c.Status.Bootstrap
	return st == nil || (st.CredentialIssuedAt == nil && st.RunnerName == "")
}

// spill deletes the pool's claims that wait on a template that does not
// take VMs while another does, before scale: the claims scale then
// creates in their place go to an Available template in the same pass. A
// spilled claim had nothing placed (nothingPlaced), so deleting it leaks
// no VM and no runner registration.
func (r *RunnerPoolReconciler) spill(ctx context.Context, s *poolScope) (phase.Result, error) {
	if len(s.placement) < 2 || !s.canSpill() {
		return phase.Next(), nil
	}
	index := map[string]int{}
	for i, t := range s.placement {
		index[t.Name] = i
	}
	keep := func(list []*hfv1.MachineClaim) ([]*hfv1.MachineClaim, error) {
		out := list[:0:0]
		for _, c := range list {
			i, known := index[c.Spec.TemplateRef.Name]
			reason, waits := waitingToPlace(c)
			if !known || !waits || !poolplacement.Spillable(s.placement, i, reason) {
				out = append(out, c)
				continue
			}
			// Only the claim as read: one whose controller has placed it
			// since (its record written, the cache not showing it yet)
			// has another resourceVersion, and stays.
			err := r.Client.Delete(ctx, c, client.Preconditions{UID: &c.UID, ResourceVersion: &c.ResourceVersion})
			switch {
			case apierrors.IsConflict(err):
				out = append(out, c)
				continue
			case err != nil && !apierrors.IsNotFound(err):
				return nil, fmt.Errorf("delete MachineClaim %s to place it on another template: %w", c.Name, err)
			}
			r.expect.Ended(client.ObjectKeyFromObject(s.pool), c.UID, r.Clock.Now())
			s.placement[i].Machines--
			// Its wait no longer holds the pool's capacity back
			// (CapacityAvailable): its replacement goes elsewhere.
			if s.blockers[string(reason)] > 0 {
				s.blockers[string(reason)]--
			}
			ctrl.LoggerFrom(ctx).Info("Spilling a claim to another template", "MachineClaim", c.Name, "template", c.Spec.TemplateRef.Name,
				"state", s.placement[i].State, "reason", reason)
		}
		return out, nil
	}
	var err error
	if s.claims.Starting, err = keep(s.claims.Starting); err != nil {
		return phase.Stop(), err
	}
	if s.claims.StandbyBuilding, err = keep(s.claims.StandbyBuilding); err != nil {
		return phase.Stop(), err
	}
	return phase.Next(), nil
}

// stranded splits starting claims into those stranded on a template the
// pool sees Unreachable while another template takes VMs, and the others.
// A stranded claim has something on its cluster (else spill replaced it):
// its VM cannot come up, nor be removed, until the cluster is back, so it
// serves none of the demand, which gets claims on an Available template
// instead; it still holds its place under maxReplicas (the caller counts
// it with the claims being removed). Without this a pool whose starting
// claims all went to a cluster before it was found partitioned would wait
// for that cluster however many other clusters had room.
func (s *poolScope) stranded(claims []*hfv1.MachineClaim) (stuck, others []*hfv1.MachineClaim) {
	if len(s.placement) < 2 || !slices.ContainsFunc(s.placement, func(t poolplacement.Template) bool { return t.State == hfv1.TemplateAvailable }) {
		return nil, claims
	}
	unreachable := map[string]bool{}
	for _, t := range s.placement {
		unreachable[t.Name] = t.State == hfv1.TemplateUnreachable
	}
	for _, c := range claims {
		if unreachable[c.Spec.TemplateRef.Name] {
			stuck = append(stuck, c)
		} else {
			others = append(others, c)
		}
	}
	return stuck, others
}

// canSpill reports whether the pool would create the spilled claims'
// replacements: a pool that builds nothing (refused, unverified, its feed
// blocked) keeps its waiting claims rather than lose them.
func (s *poolScope) canSpill() bool {
	ok, _, _ := s.canBuild()
	return ok && s.scopeVerified && s.feedBlocked == ""
}

// templateFor chooses the template of the next new claim (templateRef
// without spec.placement) and counts it there.
func (s *poolScope) templateFor() (*hfv1.HypervisorMachineTemplate, int) {
	if len(s.placement) < 2 {
		return s.tmpl, 0
	}
	strategy := hfv1.PlacementPack
	if p := s.pool.Spec.Placement; p != nil && p.Strategy != "" {
		strategy = p.Strategy
	}
	i := poolplacement.Plan(strategy, s.placement, 1)[0]
	if s.tmpls[i] == nil {
		return s.tmpl, 0
	}
	return s.tmpls[i], i
}

// templateHash is the current hash of the claim's own template.
func (s *poolScope) templateHash(c *hfv1.MachineClaim) string {
	if h, ok := s.hashes[c.Spec.TemplateRef.Name]; ok {
		return h
	}
	return s.hash
}

// setPlacementStatus writes status.placement (unset without
// spec.placement), the template-state metric, and a Spilled event when
// claims went to a lower-priority template because a higher one does not
// take VMs, once per change of the states.
func (r *RunnerPoolReconciler) setPlacementStatus(s *poolScope) {
	st := &s.pool.Status
	if s.pool.Spec.Placement == nil || len(s.placement) == 0 {
		st.Placement = nil
		metrics.ForgetPoolTemplates(s.pool.Namespace, s.pool.Name)
		r.spillNoted.Delete(client.ObjectKeyFromObject(s.pool))
		return
	}
	st.Placement = make([]hfv1.TemplatePlacement, len(s.placement))
	gauges := make([]metrics.PoolTemplate, len(s.placement))
	for i, t := range s.placement {
		since := &metav1.Time{Time: s.now}
		if prev := previousPlacement(s.read, t.Name); prev != nil && prev.State == t.State && prev.Since != nil {
			since = prev.Since
		}
		st.Placement[i] = hfv1.TemplatePlacement{Name: t.Name, HypervisorCluster: t.Cluster, Machines: int32(max(t.Machines, 0)),
			State: t.State, Message: conditions.Truncate(t.Message, 1024), Since: since}
		gauges[i] = metrics.PoolTemplate{Name: t.Name, State: string(t.State), Machines: st.Placement[i].Machines}
	}
	metrics.SetPoolTemplates(s.pool.Namespace, s.pool.Name, gauges)
	for to := range s.createdOn {
		from := poolplacement.FirstUnavailable(s.placement, to)
		if from < 0 {
			continue
		}
		f, t := s.placement[from], s.placement[to]
		// One event per change of where and why: a pool that keeps
		// spilling for the same reason says so once.
		key := fmt.Sprintf("%s/%s->%s", f.Name, f.State, t.Name)
		if prev, ok := r.spillNoted.Load(client.ObjectKeyFromObject(s.pool)); ok && prev == key {
			continue
		}
		r.spillNoted.Store(client.ObjectKeyFromObject(s.pool), key)
		r.Recorder.Eventf(s.pool, corev1.EventTypeNormal, "Spilled",
			"New VMs go to template %s (HypervisorCluster %s): template %s (HypervisorCluster %s) is %s: %s",
			t.Name, t.Cluster, f.Name, f.Cluster, f.State, conditions.Truncate(f.Message, 512))
		return
	}
	if _, spilling := s.createdOn[0]; spilling {
		// New VMs are back on templateRef: the next spill is news again.
		r.spillNoted.Delete(client.ObjectKeyFromObject(s.pool))
	}
}

// classifyClaims sorts the pool's claims; with several templates each is
// judged stale against its own template's hash.
func (s *poolScope) classifyClaims(owned []hfv1.MachineClaim, retains bool) *poolclaims.Claims {
	if len(s.tmpls) < 2 {
		return poolclaims.Classify(owned, s.hash, retains)
	}
	return poolclaims.ClassifyTemplates(owned, s.hashes, retains)
}
