// Package demand turns CI job events into demand records: it routes a job
// to the one RunnerPool that should scale for it and records the job as a
// CIJob in that pool's namespace. The webhook receiver uses it on every
// manager replica; the periodic resync (lost webhooks) uses it too, so both
// paths route and de-duplicate the same way (by job id: one CIJob per job
// and namespace, named CIJobName).
//
// # Routing rule
//
// A job routes to a RunnerPool when
//
//  1. a CI platform back-end serves the pool's spec.workload.type
//     (pkg/workload's registry) and the pool is not being deleted;
//
//  2. the pool's scope holds the job (workload.Scope.HoldsJob): it is on
//     the API host the job came from (workload.Job.Host: the host whose
//     webhook secret verified its delivery, or of the pool whose account
//     read it; the pool's is its template's API host) and contains the
//     job's repository. The back-end reads the scope from the pool and its
//     template (workload.Pool): for GitHub Actions, the pool's own
//     spec.workload.github.repository (owner/name) or .organization when
//     set, else its template's spec.bootstrap.github scope. A pool whose
//     template is missing is skipped: without it neither its scope nor its
//     runners' labels are known. Comparing hosts is what keeps a server a
//     tenant runs, which "verifies" any owner it is asked about, from
//     winning another host's jobs (docs/security.md, "The API host is part
//     of the scope");
//
//  3. the pool's runners' labels cover the job's runs-on labels (every job
//     label is among them, case-insensitively). A runner's labels are
//     workload.RunnerLabels(the platform's default labels for the template's
//     runner OS and architecture, the pool's labels): for GitHub Actions
//     self-hosted, Linux, X64 (and so on), hyperfleet and the pool's
//     labels; credentials are issued with the same function, so a pool
//     routes exactly the jobs its runners can take.
//
//  4. the pool's scope is verified: its ScopeVerified condition is True
//     for its current generation and status.scopeVerification names the
//     scope, the template and the template's credentials (CredentialsKey)
//     routing computes now.
//     The pool controller sets it only after its template's credentials
//     were shown to manage runners in that scope (docs/security.md), so a
//     pool that names another tenant's organization or repository, and
//     could not issue a runner credential there, never wins its jobs.
//     Unverified pools are not told about jobs either: they are left out
//     of Unmatched, so no event shows them another scope's jobs.
//
//  5. a job that asks for no labels (GitLab's untagged jobs) goes only to
//     pools whose runners take untagged jobs (workload.Pool.RunUntagged;
//     every GitHub pool).
//
// A job whose labels its event does not carry (workload.Job.LabelsUnknown:
// a GitLab Job Hook) is first read from the platform, with the credentials
// of a verified pool of its platform whose scope holds its repository
// (Router.ReadJobsWith), and routed with its real labels.
//
// Among the pools that qualify, the most specific wins: a pool that listens
// to a job feed covering the job (a GitHub runner scale set: GitHub hands
// the job to the scale set and keeps it from other runners), then the one
// with the fewest runner labels, then a pool of the job's repository over a group
// or organization pool, a deeper group (a subgroup) over the groups above
// it, and any of them over the whole instance. Fewest labels means the pool least specialised beyond
// what the job asks for: a job on [self-hosted, linux] scales a plain pool
// rather than a GPU pool that also covers it, keeping special machines for
// the jobs that need them. The platform may still give the job to any
// runner whose labels cover it (docs/architecture.md, "Runners are
// interchangeable"):
// routing decides which pool scales, not which runner runs the job.
//
// Pools that remain equally specific are an ambiguity, and no pool scales
// for the job: the Decision lists them in Ambiguous so that each is told,
// and the periodic resync leaves the job alone too. Ordering them by
// namespace or name would let whoever picks the smallest name take the
// jobs of every pool it ties with (docs/security.md, "Which pool gets a
// job"); the fix is for the pools' owners to tell them apart with labels or
// a repository.
//
// The pools in scope that do not cover the job are reported in the
// Decision with the job labels each lacks, so the receiver can explain on
// them why they did not scale.
package demand

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Candidate is a RunnerPool as routing sees it.
type Candidate struct {
	// Pool is the pool's namespace and name.
	Pool types.NamespacedName
	// Platform is the pool's workload type: it takes only that
	// platform's jobs, whatever scope and labels two platforms share.
	Platform hfv1.WorkloadType
	// UID is the pool's UID (for events about it).
	UID types.UID
	// Scope is where the pool's runners take jobs from.
	Scope workload.Scope
	// RunnerLabels are all its runners' labels.
	RunnerLabels []string
	// Verified is true when the pool's scope was verified against its
	// template's credentials (see ScopeVerified).
	Verified bool
	// Pending is true for an unverified pool whose check for its current
	// scope and credentials has not concluded yet (a new or edited pool).
	Pending bool
	// RunUntagged is true when its runners take jobs that ask for no
	// labels (workload.Pool.RunUntagged).
	RunUntagged bool
	// Feed is true when the pool listens to a job feed (a GitHub runner
	// scale set): the platform gives the jobs the feed covers to the
	// feed's runners alone, so such a pool wins them (Choose).
	Feed bool
}

// Mismatch is a pool in the job's scope whose runners cannot take the job.
type Mismatch struct {
	Candidate
	// Missing are the job labels its runners lack.
	Missing []string
	// Untagged is true when the job asks for no labels and its runners
	// take only jobs that do (Missing is empty then).
	Untagged bool
}

// Decision is where a job goes.
type Decision struct {
	// Pool is the chosen pool; nil when no pool covers the job.
	Pool *Candidate
	// Unmatched are the verified pools in the job's scope that do not
	// cover it, ordered by namespace and name.
	Unmatched []Mismatch
	// Ambiguous are the equally specific verified pools that all cover
	// the job, ordered by namespace and name; Pool is nil then.
	Ambiguous []Candidate
	// Unverified counts the pools in the job's scope whose scope is not
	// verified; they were not considered.
	Unverified int
	// Pending counts those of them that cover the job and whose check has
	// not concluded yet: the job may be routed again shortly (a pool
	// created just before its job).
	Pending int
	// Job is the job as routed: for one whose event did not carry its
	// labels (workload.Job.LabelsUnknown), with the labels the platform
	// reported; LabelsUnknown still when no pool could read it.
	Job workload.Job
}

// Matched reports whether a pool was chosen.
func (d Decision) Matched() bool { return d.Pool != nil }

// InScope reports whether any verified pool serves the job's repository,
// whether or not its labels cover the job.
func (d Decision) InScope() bool {
	return d.Pool != nil || len(d.Unmatched) > 0 || len(d.Ambiguous) > 0
}

// Router routes jobs to RunnerPools. It only reads, normally from the
// manager's cache, and is safe for concurrent use.
type Router struct {
	reader   client.Reader
	backends *workload.Backends
	// jobs read the jobs whose labels their events do not carry; nil:
	// such jobs go to no pool.
	jobs JobReaders
}

// NewRouter returns a Router over reader (the manager's cache, or any
// client.Reader) for the pools of the CI platforms of backends. The reader
// must serve RunnerPools and HypervisorMachineTemplates in every
// namespace.
func NewRouter(reader client.Reader, backends *workload.Backends) *Router {
	return &Router{reader: reader, backends: backends}
}

// ReadJobsWith makes the Router read a job whose event does not carry its
// labels (workload.Job.LabelsUnknown) from the CI platform, with the
// credentials of a verified pool of the job's platform whose scope holds
// the job's repository (controller.PoolJobReaders). It returns r.
func (r *Router) ReadJobsWith(readers JobReaders) *Router {
	r.jobs = readers
	return r
}

// Route decides which pool scales for job; see the package documentation
// for the rule. An error means the pools (or the job, when its labels are
// unknown) could not be read.
func (r *Router) Route(ctx context.Context, job workload.Job) (Decision, error) {
	cands, err := r.Candidates(ctx)
	if err != nil {
		return Decision{}, err
	}
	if job.LabelsUnknown {
		if job, err = r.readLabels(ctx, cands, job); err != nil {
			return Decision{}, err
		}
	}
	return Choose(cands, job), nil
}

// readLabels fills in the labels of job from the platform's view of it,
// read with the first verified candidate of its platform whose scope holds
// its repository (in namespace and name order) that can read it. The job
// is returned unchanged (LabelsUnknown, so it goes to no pool) when no
// such pool exists or none knows the job: no pool serves it, or the event
// named a job that does not exist. Only the labels are taken; the event's
// state stays the event's (confirming it is the Recorder's part).
func (r *Router) readLabels(ctx context.Context, cands []Candidate, job workload.Job) (workload.Job, error) {
	if r.jobs == nil {
		return job, nil
	}
	var errs []error
	for i := range cands {
		c := &cands[i]
		if c.Platform != job.Platform || !c.Verified || !c.Scope.HoldsJob(job) {
			continue
		}
		reader, err := r.jobs.JobReaderFor(ctx, c.Pool)
		if err != nil {
			errs = append(errs, fmt.Errorf("RunnerPool %s: %w", c.Pool, err))
			continue
		}
		got, err := reader.GetJob(ctx, job.Repository, job.ID)
		switch {
		case errors.Is(err, workload.ErrNotFound):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("RunnerPool %s: %w", c.Pool, err))
			continue
		}
		job.Labels, job.LabelsUnknown = slices.Clone(got.Labels), false
		return job, nil
	}
	if len(errs) > 0 {
		return job, fmt.Errorf("reading the labels of job %s of %s: %w", job.ID, job.Repository, errors.Join(errs...))
	}
	return job, nil
}

// Candidates lists the pools of the served CI platforms that can take
// jobs, with their scope and runner labels, ordered by namespace and name.
func (r *Router) Candidates(ctx context.Context) ([]Candidate, error) {
	var pools hfv1.RunnerPoolList
	if err := r.reader.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("listing RunnerPools: %w", err)
	}
	templates := map[types.NamespacedName]*hfv1.HypervisorMachineTemplate{}
	out := make([]Candidate, 0, len(pools.Items))
	for i := range pools.Items {
		pool := &pools.Items[i]
		be, served := r.backends.For(pool.Spec.Workload.Type)
		if !served || !pool.DeletionTimestamp.IsZero() {
			continue
		}
		key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.TemplateRef.Name}
		tmpl, seen := templates[key]
		if !seen {
			var t hfv1.HypervisorMachineTemplate
			switch err := r.reader.Get(ctx, key, &t); {
			case err == nil:
				tmpl = &t
			case apierrors.IsNotFound(err):
				tmpl = nil
			default:
				return nil, fmt.Errorf("reading HypervisorMachineTemplate %s of RunnerPool %s/%s: %w", key, pool.Namespace, pool.Name, err)
			}
			templates[key] = tmpl
		}
		if tmpl == nil {
			continue
		}
		if c, ok := PoolCandidate(be, pool, tmpl); ok {
			out = append(out, c)
		}
	}
	sortCandidates(out)
	return out, nil
}

// PoolCandidate describes pool (built from tmpl) for routing, as be, the
// back-end of its workload type, reads them; false when the pool has no
// section for be's platform or its scope cannot be told.
func PoolCandidate(be workload.Backend, pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (Candidate, bool) {
	if tmpl == nil {
		return Candidate{}, false
	}
	p, ok := be.Pool(pool, tmpl)
	if !ok || p.Scope.IsZero() {
		return Candidate{}, false
	}
	t, _ := be.Template(tmpl)
	verified := ScopeVerified(pool, tmpl.Name, t.CredentialsKey, p.Scope)
	return Candidate{
		Pool:         types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name},
		Platform:     pool.Spec.Workload.Type,
		UID:          pool.UID,
		Scope:        p.Scope,
		RunnerLabels: workload.RunnerLabels(t.DefaultLabels, p.Labels),
		Verified:     verified,
		Pending:      !verified && verificationPending(pool),
		RunUntagged:  p.RunUntagged,
		Feed:         p.Feed != nil && p.FeedRefusal == "",
	}, true
}

// verificationPending reports whether the pool's scope check for its
// current spec has not concluded: no ScopeVerified condition for this
// generation, one that failed transiently, or a True one that no longer
// matches (its template's credentials changed). A check that concluded the
// credentials cannot reach the scope is not pending.
func verificationPending(pool *hfv1.RunnerPool) bool {
	cond := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
	return cond == nil || cond.ObservedGeneration != pool.Generation || cond.Status == metav1.ConditionTrue ||
		cond.Reason == string(hfv1.ScopeCheckFailedReason)
}

// ScopeVerified reports whether pool's ScopeVerified condition vouches for
// scope with the credentials of its template (named template) as they are
// now (credentials: workload.Template.CredentialsKey): True for the pool's
// current generation, and recorded for this scope, template and
// credentials. Anything else (a spec edited to another organization, a
// template whose credentials changed since) waits for the pool controller
// to check again.
func ScopeVerified(pool *hfv1.RunnerPool, template, credentials string, scope workload.Scope) bool {
	cond := hfv1.FindCondition(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
	sv := pool.Status.ScopeVerification
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == pool.Generation &&
		sv != nil && strings.EqualFold(sv.Scope, scope.String()) && sv.Template == template && sv.Credentials == credentials
}

// Choose applies the routing rule to candidates: among the verified ones
// whose scope contains the job's repository, the covering one with the
// fewest runner labels, then of the job's repository rather than its
// organization, is chosen; equally specific covering pools are reported as
// ambiguous and none is chosen; the verified ones in scope that do not
// cover the job are reported as unmatched with the labels they lack.
func Choose(cands []Candidate, job workload.Job) Decision {
	d := Decision{Job: job}
	if job.LabelsUnknown {
		// Which pools cover it cannot be told (Router.Route reads its
		// labels first): none scales for it.
		return d
	}
	var best []Candidate
	for i := range cands {
		c := &cands[i]
		if c.Platform != job.Platform || !c.Scope.HoldsJob(job) {
			continue
		}
		missing := MissingLabels(c.RunnerLabels, job.Labels)
		untagged := len(job.Labels) == 0 && !c.RunUntagged
		if !c.Verified {
			d.Unverified++
			if c.Pending && len(missing) == 0 && !untagged {
				d.Pending++
			}
			continue
		}
		if len(missing) > 0 || untagged {
			d.Unmatched = append(d.Unmatched, Mismatch{Candidate: *c, Missing: missing, Untagged: untagged})
			continue
		}
		switch {
		case len(best) == 0 || compareSpecificity(c, &best[0]) < 0:
			best = []Candidate{*c}
		case compareSpecificity(c, &best[0]) == 0:
			best = append(best, *c)
		}
	}
	switch len(best) {
	case 0:
	case 1:
		d.Pool = &best[0]
	default:
		sortCandidates(best)
		d.Ambiguous = best
	}
	slices.SortFunc(d.Unmatched, func(a, b Mismatch) int { return compareNames(a.Pool, b.Pool) })
	return d
}

// compareSpecificity orders covering pools, most specific first: a pool
// listening to a job feed (the platform hands the feed the jobs its labels
// cover, and keeps them from every other runner), then fewer runner
// labels, then by scope (compareScopes). Names never decide (see the
// package documentation).
func compareSpecificity(a, b *Candidate) int {
	return cmp.Or(cmp.Compare(feedRank(a), feedRank(b)), cmp.Compare(len(a.RunnerLabels), len(b.RunnerLabels)),
		compareScopes(a.Scope, b.Scope))
}

// feedRank puts pools with a job feed first.
func feedRank(c *Candidate) int {
	if c.Feed {
		return 0
	}
	return 1
}

// compareScopes orders scopes that all hold one job's repository, most
// specific first: the repository itself, then its owners from the deepest
// group (a GitLab subgroup) up to the top one (a GitHub organization has
// no depth to compare), then the enterprise's runners for the
// organization, then the whole instance.
func compareScopes(a, b workload.Scope) int {
	return cmp.Or(cmp.Compare(scopeKind(a), scopeKind(b)),
		// Deeper first: more path segments rank before fewer.
		cmp.Compare(scopeDepth(b), scopeDepth(a)))
}

// scopeKind is 0 for a repository scope, 1 for an owner (organization or
// group), 2 for an organization served by its enterprise's runners (an
// organization's own pool is nearer the job) and 3 for the instance.
func scopeKind(s workload.Scope) int {
	switch {
	case s.Instance:
		return 3
	case s.IsOrganization() && s.IsEnterprise():
		return 2
	case s.IsOrganization():
		return 1
	}
	return 0
}

// scopeDepth is the number of path segments of the scope's owner.
func scopeDepth(s workload.Scope) int {
	if s.Owner == "" {
		return 0
	}
	return strings.Count(s.Owner, "/") + 1
}

func compareNames(a, b types.NamespacedName) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

func sortCandidates(cs []Candidate) {
	slices.SortFunc(cs, func(a, b Candidate) int { return compareNames(a.Pool, b.Pool) })
}

// MissingLabels returns the job labels that are not among the runner's
// (ignoring case), in the job's order and without duplicates; empty when
// the runner covers the job.
func MissingLabels(runnerLabels, jobLabels []string) []string {
	have := make(map[string]bool, len(runnerLabels))
	for _, l := range runnerLabels {
		have[strings.ToLower(l)] = true
	}
	var missing []string
	for _, l := range jobLabels {
		k := strings.ToLower(l)
		if !have[k] {
			missing = append(missing, l)
			have[k] = true // report each missing label once
		}
	}
	return missing
}
