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
//  1. the pool's spec.workload.type is github-actions and the pool is not
//     being deleted;
//
//  2. the pool's scope contains the job's repository: the pool's own
//     spec.workload.github.repository (owner/name) or .organization when
//     set, else its template's spec.bootstrap.github scope (owner and
//     repository for repository runners, organization for organization
//     runners). A pool whose template is missing is skipped: without it
//     neither its scope nor its runners' labels are known;
//
//  3. the pool's runners' labels cover the job's runs-on labels (every job
//     label is among them, case-insensitively). A runner's labels are
//     github.RunnerLabels(template runner os, arch, pool labels): self-hosted,
//     the OS and architecture labels (Linux, X64 ...), hyperfleet and the
//     pool's labels; credentials are issued with the same function, so a
//     pool routes exactly the jobs its runners can take.
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
// Among the pools that qualify, the most specific wins: the one with the
// fewest runner labels, then a pool of the job's repository over an
// organization pool. Fewest labels means the pool least specialised beyond
// what the job asks for: a job on [self-hosted, linux] scales a plain pool
// rather than a GPU pool that also covers it, keeping special machines for
// the jobs that need them. GitHub may still give the job to any runner
// whose labels cover it (docs/architecture.md, "Runners are
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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// Candidate is a RunnerPool as routing sees it.
type Candidate struct {
	// Pool is the pool's namespace and name.
	Pool types.NamespacedName
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
}

// Mismatch is a pool in the job's scope whose runners cannot take the job.
type Mismatch struct {
	Candidate
	// Missing are the job labels its runners lack.
	Missing []string
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
	reader client.Reader
}

// NewRouter returns a Router over reader (the manager's cache, or any
// client.Reader). The reader must serve RunnerPools and
// HypervisorMachineTemplates in every namespace.
func NewRouter(reader client.Reader) *Router {
	return &Router{reader: reader}
}

// Route decides which pool scales for job; see the package documentation
// for the rule. An error means the pools could not be read.
func (r *Router) Route(ctx context.Context, job workload.Job) (Decision, error) {
	cands, err := r.Candidates(ctx)
	if err != nil {
		return Decision{}, err
	}
	return Choose(cands, job), nil
}

// Candidates lists the GitHub Actions pools that can take jobs, with their
// scope and runner labels, ordered by namespace and name.
func (r *Router) Candidates(ctx context.Context) ([]Candidate, error) {
	var pools hfv1.RunnerPoolList
	if err := r.reader.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("listing RunnerPools: %w", err)
	}
	templates := map[types.NamespacedName]*hfv1.HypervisorMachineTemplate{}
	out := make([]Candidate, 0, len(pools.Items))
	for i := range pools.Items {
		pool := &pools.Items[i]
		if pool.Spec.Workload.Type != hfv1.WorkloadGitHubActions || pool.Spec.Workload.GitHub == nil ||
			!pool.DeletionTimestamp.IsZero() {
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
		if c, ok := PoolCandidate(pool, tmpl); ok {
			out = append(out, c)
		}
	}
	sortCandidates(out)
	return out, nil
}

// PoolCandidate describes pool (built from tmpl) for routing; false when
// the pool takes no GitHub Actions jobs or its scope cannot be told.
func PoolCandidate(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate) (Candidate, bool) {
	w := pool.Spec.Workload
	if w.Type != hfv1.WorkloadGitHubActions || w.GitHub == nil || tmpl == nil {
		return Candidate{}, false
	}
	scope, ok := PoolScope(w.GitHub, &tmpl.Spec.Bootstrap.GitHub)
	if !ok {
		return Candidate{}, false
	}
	var os, arch string
	if rs := tmpl.Spec.Bootstrap.GitHub.Runner; rs != nil {
		os, arch = string(rs.OS), string(rs.Arch)
	}
	return Candidate{
		Pool:         types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name},
		UID:          pool.UID,
		Scope:        scope,
		RunnerLabels: github.RunnerLabels(os, arch, w.GitHub.Labels),
		Verified:     ScopeVerified(pool, tmpl, scope),
		Pending:      !ScopeVerified(pool, tmpl, scope) && verificationPending(pool),
	}, true
}

// verificationPending reports whether the pool's scope check for its
// current spec has not concluded: no ScopeVerified condition for this
// generation, one that failed transiently, or a True one that no longer
// matches (its template's credentials changed). A check that concluded the
// credentials cannot reach the scope is not pending.
func verificationPending(pool *hfv1.RunnerPool) bool {
	cond := meta.FindStatusCondition(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
	return cond == nil || cond.ObservedGeneration != pool.Generation || cond.Status == metav1.ConditionTrue ||
		cond.Reason == hfv1.ScopeCheckFailedReason
}

// ScopeVerified reports whether pool's ScopeVerified condition vouches for
// scope with tmpl's credentials as they are now: True for the pool's
// current generation, and recorded for this scope, template and
// CredentialsKey. Anything else (a spec edited to another organization, a
// template changed since) waits for the pool controller to check again.
func ScopeVerified(pool *hfv1.RunnerPool, tmpl *hfv1.HypervisorMachineTemplate, scope workload.Scope) bool {
	cond := meta.FindStatusCondition(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
	sv := pool.Status.ScopeVerification
	return cond != nil && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == pool.Generation &&
		sv != nil && strings.EqualFold(sv.Scope, scope.String()) && sv.Template == tmpl.Name && sv.Credentials == CredentialsKey(tmpl)
}

// CredentialsKey identifies the GitHub credentials tmpl gives its pools:
// the API, the registration URLs and which Secret keys hold the
// credentials (never their values). A scope verification stands while it
// is unchanged, so that editing a template's resources or image does not
// take its pools out of routing; rotating a Secret's value is caught by
// the periodic re-check instead.
func CredentialsKey(tmpl *hfv1.HypervisorMachineTemplate) string {
	gh := tmpl.Spec.Bootstrap.GitHub
	raw, _ := json.Marshal(struct {
		API   string
		Reg   *hfv1.ScopedURLs
		Creds hfv1.GitHubCredentials
	}{gh.APIBaseURL, gh.RegistrationURLs, gh.Credentials})
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:])
}

// PoolScope is the scope a pool serves: its own repository or
// organization, else its template's. False when neither says.
func PoolScope(w *hfv1.GitHubWorkload, b *hfv1.GitHubBootstrap) (workload.Scope, bool) {
	switch {
	case w != nil && w.Repository != "":
		owner, name, ok := strings.Cut(w.Repository, "/")
		if !ok || owner == "" || name == "" {
			return workload.Scope{}, false
		}
		return workload.Scope{Owner: owner, Repository: name}, true
	case w != nil && w.Organization != "":
		return workload.Scope{Owner: w.Organization}, true
	case b == nil:
		return workload.Scope{}, false
	case b.Repository != "" && b.Owner != "":
		return workload.Scope{Owner: b.Owner, Repository: b.Repository}, true
	case b.Organization != "":
		return workload.Scope{Owner: b.Organization}, true
	}
	return workload.Scope{}, false
}

// Choose applies the routing rule to candidates: among the verified ones
// whose scope contains the job's repository, the covering one with the
// fewest runner labels, then of the job's repository rather than its
// organization, is chosen; equally specific covering pools are reported as
// ambiguous and none is chosen; the verified ones in scope that do not
// cover the job are reported as unmatched with the labels they lack.
func Choose(cands []Candidate, job workload.Job) Decision {
	var d Decision
	var best []Candidate
	for i := range cands {
		c := &cands[i]
		if !c.Scope.Contains(job.Repository) {
			continue
		}
		if !c.Verified {
			d.Unverified++
			if c.Pending && len(MissingLabels(c.RunnerLabels, job.Labels)) == 0 {
				d.Pending++
			}
			continue
		}
		if missing := MissingLabels(c.RunnerLabels, job.Labels); len(missing) > 0 {
			d.Unmatched = append(d.Unmatched, Mismatch{Candidate: *c, Missing: missing})
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

// compareSpecificity orders covering pools, most specific first: fewer
// runner labels, then a repository scope before an organization scope.
// Names never decide (see the package documentation).
func compareSpecificity(a, b *Candidate) int {
	return cmp.Or(cmp.Compare(len(a.RunnerLabels), len(b.RunnerLabels)),
		cmp.Compare(scopeRank(a.Scope), scopeRank(b.Scope)))
}

// scopeRank is 0 for a repository scope and 1 for an organization.
func scopeRank(s workload.Scope) int {
	if s.IsOrganization() {
		return 1
	}
	return 0
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
