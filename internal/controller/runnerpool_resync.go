package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/patch"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// PoolProviders give the CI platform account of a pool: its provider and a
// key shared by pools with the same credentials and scope.
type PoolProviders interface {
	PoolProvider(ctx context.Context, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (workload.Provider, string, error)
}

// PoolResync compares HyperFleet's view with the CI platform at a fixed
// interval (webhooks get lost: docs/architecture.md, "Demand records in the
// API server"), once per credential scope however many pools share it:
//
//   - the runner list gives each claim's runner state (online, busy, gone),
//     which the claim controller turns into Bootstrapped and busy/idle;
//   - the queued jobs of the scope's repositories (repositoriesToScan:
//     those of the pools' recorded jobs at every resync, the scope's other
//     repositories in turns) are recorded as CIJobs exactly as webhooks are
//     (routed by the same rule, de-duplicated by job id), whatever the
//     state of their workflow run, so a lost queued webhook still scales a
//     pool;
//   - recorded jobs the platform no longer lists as queued, and in-progress
//     jobs whose runner is gone, are read one by one and moved forward, so
//     a lost in_progress or completed webhook does not leave demand behind.
//
// Repeated or lost webhooks therefore change nothing: every path writes the
// same CIJob, whose state only moves forward. It runs on the leader only.
type PoolResync struct {
	Client    client.Client
	Providers PoolProviders
	// Backends are the CI platforms whose pools are resynced.
	Backends *workload.Backends
	Router   *demand.Router
	Recorder *demand.Recorder
	Runners  *machineclaim.RunnerObservations
	Events   record.EventRecorder
	Clock    clock.PassiveClock
	// ClaimEvents and PoolEvents wake claims whose runner changed and the
	// pools that were resynced.
	ClaimEvents chan<- event.GenericEvent
	PoolEvents  chan<- event.GenericEvent
	// Interval is the time between resyncs (default 30s).
	Interval time.Duration
	// MaxJobLookups bounds the jobs read one by one per scope and resync
	// (default 50), keeping the API budget for what matters.
	MaxJobLookups int
	// MaxRepositoryScans bounds the repositories of a scope scanned per
	// resync besides those with recorded jobs (default 10): an
	// organization's are scanned in turns (repositoriesToScan).
	MaxRepositoryScans int

	// passes counts the resyncs run since Start.
	passes atomic.Int64

	mu      sync.Mutex
	lastErr map[string]string
	// nextScan is where each scope's turn of repositories starts.
	nextScan map[string]int
}

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *PoolResync) NeedLeaderElection() bool { return true }

// Start implements manager.Runnable.
func (s *PoolResync) Start(ctx context.Context) error {
	if s.Clock == nil {
		s.Clock = clock.RealClock{}
	}
	interval := s.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	log := ctrl.LoggerFrom(ctx).WithName("runnerpool-resync")
	ctx = ctrl.LoggerInto(ctx, log)
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := s.ResyncOnce(ctx); err != nil && ctx.Err() == nil {
			log.Error(err, "RunnerPool resync")
		}
		s.passes.Add(1)
		t.Reset(interval)
	}
}

// Passes is the number of resyncs Start has run: the first runs a second
// after the start (catching up on jobs queued while no operator ran), the
// next ones an interval apart.
func (s *PoolResync) Passes() int64 { return s.passes.Load() }

// resyncGroup is the pools that share one CI platform account and scope.
type resyncGroup struct {
	key   string
	p     workload.Provider
	pools []*hfv1.RunnerPool
}

// ResyncOnce runs one resync of every pool.
func (s *PoolResync) ResyncOnce(ctx context.Context) error {
	var pools hfv1.RunnerPoolList
	if err := s.Client.List(ctx, &pools); err != nil {
		return fmt.Errorf("list RunnerPools: %w", err)
	}
	groups := map[string]*resyncGroup{}
	for i := range pools.Items {
		pool := &pools.Items[i]
		be, served := s.Backends.For(pool.Spec.Workload.Type)
		if !served || !pool.DeletionTimestamp.IsZero() {
			continue
		}
		var tmpl hfv1.HypervisorMachineTemplate
		if err := s.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}, &tmpl); err != nil {
			continue // the pool's own status says its template is missing
		}
		ps, ok := be.Pool(pool, &tmpl)
		if !ok {
			continue
		}
		if t, _ := be.Template(&tmpl); ps.Scope.IsZero() || !demand.ScopeVerified(pool, tmpl.Name, t.CredentialsKey, ps.Scope) {
			// Its ScopeVerified condition explains why; its credentials
			// are not used for a scope they were not shown to reach.
			continue
		}
		p, key, err := s.Providers.PoolProvider(ctx, pool, &tmpl)
		if err != nil {
			s.reportError(pool.Namespace+"/"+pool.Name, []*hfv1.RunnerPool{pool}, err)
			continue
		}
		g := groups[key]
		if g == nil {
			g = &resyncGroup{key: key, p: p}
			groups[key] = g
		}
		g.pools = append(g.pools, pool)
	}
	if len(groups) == 0 {
		return nil
	}
	cands, err := s.Router.Candidates(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(groups)) {
		if err := s.resyncGroup(ctx, groups[k], cands); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// resyncGroup resyncs the pools of one scope.
func (s *PoolResync) resyncGroup(ctx context.Context, g *resyncGroup, cands []demand.Candidate) error {
	start := s.Clock.Now()
	runners, err := g.p.ListRunners(ctx, "")
	if err != nil {
		s.reportError(g.key, g.pools, err)
		return nil
	}
	byName := make(map[string]workload.Runner, len(runners))
	for _, r := range runners {
		byName[r.Name] = r
	}
	repos := map[string]bool{}
	var records []*hfv1.CIJob
	// recorded are the jobs the pools' namespaces already hold a CIJob
	// of: a queued job listed again changes nothing in its record
	// (demand.MergeEvent), and writing it anyway cost a create refused as
	// existing and an uncached read per queued job and resync.
	recorded := map[types.NamespacedName]bool{}
	for _, pool := range g.pools {
		if err := s.observeRunners(ctx, pool, byName, start); err != nil {
			return err
		}
		var jobs hfv1.CIJobList
		if err := s.Client.List(ctx, &jobs, client.InNamespace(pool.Namespace), client.MatchingFields{fieldindex.JobPool: pool.Name}); err != nil {
			return fmt.Errorf("list CIJobs of RunnerPool %s/%s: %w", pool.Namespace, pool.Name, err)
		}
		for i := range jobs.Items {
			j := &jobs.Items[i]
			repos[j.Spec.Repository] = true
			recorded[types.NamespacedName{Namespace: j.Namespace, Name: j.Name}] = true
			if j.Status.State != hfv1.CIJobCompleted {
				records = append(records, j)
			}
		}
	}
	repoList, listErr := s.repositoriesToScan(ctx, g, repos)
	if listErr != nil {
		// The repositories with recorded jobs are still scanned; the
		// listing is tried again at the next resync.
		s.reportError(g.key, g.pools, listErr)
	}

	queued := map[string]bool{}
	if len(repoList) > 0 {
		jobs, err := g.p.QueuedJobs(ctx, repoList)
		if err != nil {
			s.reportError(g.key, g.pools, err)
			return nil
		}
		for _, job := range jobs {
			// The jobs of the scope's account are its host's, whatever
			// other host's pools name the same owner.
			job.Host = g.p.Scope().Host
			queued[job.ID] = true
			d := demand.Choose(cands, job)
			if !d.Matched() || recorded[types.NamespacedName{Namespace: d.Pool.Pool.Namespace, Name: hfv1.CIJobName(job.Platform, job.ID)}] {
				continue
			}
			out, err := s.Recorder.Apply(ctx, d.Pool.Pool, workload.JobEvent{Action: "queued", Job: job}, demand.SourceResync)
			if errors.Is(err, demand.ErrOtherHostsJob) {
				ctrl.LoggerFrom(ctx).Info("A queued job has the id of another API host's job recorded in its pool's namespace; it is not recorded", "job", job.ID, "repository", job.Repository, "RunnerPool", d.Pool.Pool, "reason", err.Error())
				continue
			}
			if err != nil {
				return err
			}
			if out == demand.Created {
				metrics.ResyncRecoveredJobs.Inc()
				ctrl.LoggerFrom(ctx).Info("Resync found a queued job no webhook reported", "job", job.ID, "repository", job.Repository, "RunnerPool", d.Pool.Pool)
			}
		}
	}
	if err := s.advanceRecords(ctx, g, records, queued, byName, start); err != nil {
		return err
	}
	if listErr == nil {
		s.reportError(g.key, g.pools, nil)
	}
	for _, pool := range g.pools {
		s.markResynced(ctx, pool, start)
	}
	return nil
}

// repositoriesToScan are the repositories of g's scope whose queued jobs
// this resync lists: every repository of a recorded job (recorded), and of
// the scope's other repositories (Provider.Repositories: a repository
// scope's one, an organization's, or a GitHub App installation's) at most
// MaxRepositoryScans, the next ones at each resync. A repository whose
// first job's webhook was lost is so found within ceil(R /
// MaxRepositoryScans) resyncs for an organization of R repositories (200
// repositories, 10 a turn, a 30 s resync: 10 minutes), at a bounded cost:
// each scanned repository is one listing per unfinished run status, most
// of them answered 304 (free) while nothing changes there. A failed
// listing of the scope's repositories leaves the recorded ones, and
// returns the error.
func (s *PoolResync) repositoriesToScan(ctx context.Context, g *resyncGroup, recorded map[string]bool) ([]string, error) {
	scope := g.p.Scope()
	scan := map[string]string{} // lower case -> as named
	for r := range recorded {
		if scope.Contains(r) {
			scan[strings.ToLower(r)] = r
		}
	}
	all, err := g.p.Repositories(ctx)
	if err != nil {
		err = fmt.Errorf("list the repositories of %s: %w", scope, err)
	}
	var others []string
	for _, r := range all {
		if _, ok := scan[strings.ToLower(r)]; !ok && scope.Contains(r) {
			others = append(others, r)
		}
	}
	if limit := cmp.Or(max(s.MaxRepositoryScans, 0), 10); len(others) > limit {
		s.mu.Lock()
		if s.nextScan == nil {
			s.nextScan = map[string]int{}
		}
		first := s.nextScan[g.key] % len(others)
		s.nextScan[g.key] = first + limit
		s.mu.Unlock()
		others = append(slices.Clone(others[first:]), others[:first]...)[:limit]
	}
	for _, r := range others {
		scan[strings.ToLower(r)] = r
	}
	out := slices.Collect(maps.Values(scan))
	slices.Sort(out)
	return out, err
}

// observeRunners records the runner state of the pool's claims and wakes
// the claims whose runner changed.
func (s *PoolResync) observeRunners(ctx context.Context, pool *hfv1.RunnerPool, byName map[string]workload.Runner, now time.Time) error {
	var claims hfv1.MachineClaimList
	if err := s.Client.List(ctx, &claims, client.InNamespace(pool.Namespace), client.MatchingFields{fieldindex.ClaimPool: pool.Name}); err != nil {
		return fmt.Errorf("list claims of RunnerPool %s/%s: %w", pool.Namespace, pool.Name, err)
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		st := c.Status.Bootstrap
		if st == nil || st.RunnerName == "" || c.IsFinished() {
			continue
		}
		r, present := byName[st.RunnerName]
		obs := machineclaim.RunnerObservation{Present: present, State: r.State, At: now}
		if s.Runners.Set(c.UID, obs) && s.ClaimEvents != nil {
			select {
			case s.ClaimEvents <- event.GenericEvent{Object: c}:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// advanceRecords reads, one by one, the recorded jobs whose webhooks may
// have been lost: queued ones the platform no longer lists as queued, and
// in-progress ones whose runner is gone or idle. Only jobs older than the
// resync's start are read, so a webhook in flight is not raced.
func (s *PoolResync) advanceRecords(ctx context.Context, g *resyncGroup, records []*hfv1.CIJob, queued map[string]bool, byName map[string]workload.Runner, start time.Time) error {
	limit := s.MaxJobLookups
	if limit <= 0 {
		limit = 50
	}
	sort.Slice(records, func(i, j int) bool { return records[i].CreationTimestamp.Before(&records[j].CreationTimestamp) })
	for _, rec := range records {
		if limit == 0 {
			break
		}
		if !rec.CreationTimestamp.Time.Before(start.Add(-time.Second)) || rec.Spec.APIHost != g.p.Scope().Host || !g.p.Scope().Contains(rec.Spec.Repository) {
			continue
		}
		switch rec.Status.State {
		case hfv1.CIJobQueued, "":
			if queued[rec.Spec.ID()] {
				continue
			}
		case hfv1.CIJobInProgress:
			if r, ok := byName[rec.Status.RunnerName]; ok && r.State == workload.RunnerBusy {
				continue
			}
		}
		limit--
		job, err := g.p.GetJob(ctx, rec.Spec.Repository, rec.Spec.ID())
		job.Host = rec.Spec.APIHost
		switch {
		case errors.Is(err, workload.ErrNotFound):
			// The run was deleted: no runner will ever take the job.
			if err := s.Client.Delete(ctx, rec); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete CIJob %s of a job the CI platform no longer has: %w", rec.Name, err)
			}
			continue
		case err != nil:
			s.reportError(g.key, g.pools, err)
			return nil
		}
		pool := client.ObjectKey{Namespace: rec.Namespace, Name: rec.Spec.RunnerPoolRef.Name}
		out, err := s.Recorder.Apply(ctx, pool, workload.JobEvent{Action: string(job.State), Job: job}, demand.SourceResync)
		if err != nil {
			return err
		}
		if out == demand.Updated {
			metrics.ResyncRecoveredJobs.Inc()
			ctrl.LoggerFrom(ctx).Info("Resync moved a job forward that no webhook reported", "job", job.ID, "state", job.State, "RunnerPool", pool)
		}
	}
	return nil
}

// resyncStampEvery is how stale the pool's lastResyncTime may grow before
// a resync writes it again: the stamp tells a person that resyncs run,
// and nothing in the operator reads it, so writing it every interval (5 s
// in the dev world) would be a write per pool and interval whose only
// change is a timestamp.
const resyncStampEvery = 5 * time.Minute

// markResynced stamps the pool's lastResyncTime, when the stamp is older
// than resyncStampEvery, and wakes the pool.
func (s *PoolResync) markResynced(ctx context.Context, pool *hfv1.RunnerPool, at time.Time) {
	// The pool controller owns the pool's conditions: this writer changes
	// none of them, so its patch carries only lastResyncTime.
	if last := pool.Status.LastResyncTime; last == nil || at.Sub(last.Time) >= resyncStampEvery {
		h := patch.NewHelper(s.Client, pool)
		pool.Status.LastResyncTime = &metav1.Time{Time: at}
		if err := h.PatchStatus(ctx, pool); err != nil {
			ctrl.LoggerFrom(ctx).Info("Could not record the resync time", "RunnerPool", client.ObjectKeyFromObject(pool), "err", err.Error())
		}
	}
	if s.PoolEvents != nil {
		select {
		case s.PoolEvents <- event.GenericEvent{Object: pool}:
		case <-ctx.Done():
		}
	}
}

// reportError counts a resync's result and tells the pools about a new
// error (once, not every interval); nil reports success.
func (s *PoolResync) reportError(key string, pools []*hfv1.RunnerPool, err error) {
	result := "ok"
	switch {
	case errors.Is(err, workload.ErrRateLimited):
		result = "rate_limited"
	case err != nil:
		result = "error"
	}
	metrics.PoolResyncs.WithLabelValues(result).Inc()
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	s.mu.Lock()
	if s.lastErr == nil {
		s.lastErr = map[string]string{}
	}
	changed := s.lastErr[key] != msg
	s.lastErr[key] = msg
	s.mu.Unlock()
	if !changed || err == nil || s.Events == nil {
		return
	}
	for _, pool := range pools {
		s.Events.Eventf(pool, corev1.EventTypeWarning, "ResyncFailed", "Comparing runners and queued jobs with the CI platform failed (retrying every interval): %v", err)
	}
}

// PoolJobReaders implements demand.JobReaders with each pool's own CI
// platform account (PoolProviders): a webhook event is confirmed with the
// credentials of the pool it was routed to, so what a confirmation can
// change is only that pool's namespace's demand records.
type PoolJobReaders struct {
	Client    client.Reader
	Providers PoolProviders
}

var _ demand.JobReaders = (*PoolJobReaders)(nil)

// JobReaderFor implements demand.JobReaders.
func (r *PoolJobReaders) JobReaderFor(ctx context.Context, pool types.NamespacedName) (workload.JobReader, error) {
	var rp hfv1.RunnerPool
	if err := r.Client.Get(ctx, pool, &rp); err != nil {
		return nil, fmt.Errorf("reading RunnerPool %s: %w", pool, err)
	}
	var tmpl hfv1.HypervisorMachineTemplate
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: rp.Namespace, Name: rp.Spec.TemplateRef.Name}, &tmpl); err != nil {
		return nil, fmt.Errorf("reading HypervisorMachineTemplate %s of RunnerPool %s: %w", rp.Spec.TemplateRef.Name, pool, err)
	}
	p, _, err := r.Providers.PoolProvider(ctx, &rp, &tmpl)
	if err != nil {
		return nil, fmt.Errorf("the CI platform account of RunnerPool %s: %w", pool, err)
	}
	return p, nil
}
