package why

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
)

// Reasons this package names that are no condition's reason.
const (
	// ReasonJobNotRecorded: HyperFleet holds no CIJob and no event about
	// the job.
	ReasonJobNotRecorded = "JobNotRecorded"
	// ReasonRunnerPoolNotFound: the CIJob's or claim's pool does not exist.
	ReasonRunnerPoolNotFound = "RunnerPoolNotFound"
	// ReasonRunnerPoolDeleting: the pool is being deleted.
	ReasonRunnerPoolDeleting = "RunnerPoolDeleting"
	// ReasonClusterNotFound: the template's HypervisorCluster does not exist.
	ReasonClusterNotFound = "ClusterNotFound"
)

// explainJob follows a job from its CIJob (or the events about it when it
// has none) to its pool and the pool's claims.
func explainJob(w *World, t Target) Report {
	r := Report{Target: t.String()}
	var cj *hfv1.CIJob
	for i := range w.Jobs {
		if t.matchesJob(&w.Jobs[i]) {
			cj = &w.Jobs[i]
			break
		}
	}
	if cj == nil {
		return unroutedJob(w, t, r)
	}
	r.Chain = append(r.Chain, jobLink(w, cj))
	switch cj.Status.State {
	case hfv1.CIJobCompleted:
		r.Verdict = "the job completed" + suffix(" (", cj.Status.Conclusion, ")") + "; nothing waits"
		return r
	case hfv1.CIJobInProgress:
		if c := claimOfRunner(w, cj.Namespace, cj.Status.RunnerName); c != nil {
			r.Chain = append(r.Chain, claimLink(w, c))
		}
		r.Verdict = "the job runs on runner " + cj.Status.RunnerName + "; nothing waits"
		return r
	}
	pool := findPool(w, cj.Namespace, cj.Spec.RunnerPoolRef.Name)
	if pool == nil {
		r.Blocked = &Blocker{
			Reason: ReasonRunnerPoolNotFound, Object: "CIJob " + nsName(cj.Namespace, cj.Name), Field: "spec.runnerPoolRef",
			Message: fmt.Sprintf("the job was routed to RunnerPool %s, which no longer exists", nsName(cj.Namespace, cj.Spec.RunnerPoolRef.Name)),
			Fix:     "recreate the pool, or re-run the job so that it is routed to a pool that exists",
			Doc:     doc("why-is-my-job-not-running"),
		}
		return r
	}
	links, b, verdict := walkPool(w, pool)
	r.Chain = append(r.Chain, links...)
	if lb := labelsBlocker(w, cj, pool); lb != nil {
		b = lb
	}
	r.Blocked = b
	if b == nil {
		r.Verdict = queuedVerdict(w, pool, verdict)
	}
	return r
}

// queuedVerdict explains a queued job whose chain shows no blocker.
func queuedVerdict(w *World, pool *hfv1.RunnerPool, verdict string) string {
	idle := 0
	for _, c := range liveClaims(w, pool) {
		if c.Status.Bootstrap != nil && c.Status.Bootstrap.RunnerState == hfv1.RunnerStateIdle {
			idle++
		}
	}
	if idle > 0 {
		return fmt.Sprintf("%s of the pool are online and idle: the CI platform gives the job to a runner whose labels cover it, "+
			"and HyperFleet records nothing that says why it has not yet (look at the job's page on the platform)", plural(idle, "runner"))
	}
	return verdict
}

// jobLink describes a CIJob.
func jobLink(w *World, cj *hfv1.CIJob) Link {
	state := string(cj.Status.State)
	if state == "" {
		state = string(hfv1.CIJobQueued)
	}
	if cj.Status.QueuedAt != nil && cj.Status.State != hfv1.CIJobCompleted {
		state += " for " + age(w.Now, cj.Status.QueuedAt.Time)
	}
	return Link{Kind: "CIJob", Name: nsName(cj.Namespace, cj.Name), State: fmt.Sprintf("%s: job %s of %s, runs-on [%s], routed to RunnerPool %s",
		state, cj.Spec.ID(), cj.Spec.Repository, list(cj.Spec.Labels), cj.Spec.RunnerPoolRef.Name)}
}

// labelsBlocker compares a recorded job's labels with its pool's runners'
// (as routing computes them, internal/demand): a pool edited after the job
// was routed may no longer cover it. The other pools of the namespace that
// would are named in the fix.
func labelsBlocker(w *World, cj *hfv1.CIJob, pool *hfv1.RunnerPool) *Blocker {
	runner, field, ok := runnerLabels(w, pool)
	if !ok {
		return nil
	}
	missing := demand.MissingLabels(runner, cj.Spec.Labels)
	if len(missing) == 0 {
		return nil
	}
	var covering []string
	for i := range w.Pools {
		p := &w.Pools[i]
		if p.Namespace != cj.Namespace || p.Name == pool.Name || p.Spec.Workload.Type != cj.Spec.Platform {
			continue
		}
		if l, _, ok := runnerLabels(w, p); ok && len(demand.MissingLabels(l, cj.Spec.Labels)) == 0 {
			covering = append(covering, p.Name)
		}
	}
	fix := fmt.Sprintf("add %s to the pool's labels (under %s), or change the job's runs-on", list(missing), field)
	if len(covering) > 0 {
		fix += fmt.Sprintf("; pools of the namespace that cover the job now: %s (one of them gets it when the job is routed again: re-run it)", list(covering))
	}
	return &Blocker{
		Reason: webhook.ReasonNoMatchingRunnerPool, Object: "RunnerPool " + nsName(pool.Namespace, pool.Name), Field: field + " (labels)",
		Message: fmt.Sprintf("the job's runs-on [%s] are not all among the pool's runner labels [%s]: they lack %s",
			list(cj.Spec.Labels), list(runner), list(missing)),
		Fix: fix, Doc: doc("why-is-my-job-not-running"),
	}
}

// runnerLabels are pool's runners' labels as routing reads them, with
// the pool's section for its platform (where its labels are set, as its
// back-end names it); false when they cannot be told (no back-end for its
// platform, no template).
func runnerLabels(w *World, pool *hfv1.RunnerPool) ([]string, string, bool) {
	tmpl := findTemplate(w, pool.Namespace, pool.Spec.TemplateRef.Name)
	be, p, ok := w.Backends.Pool(pool, tmpl)
	if !ok {
		return nil, "", false
	}
	c, ok := demand.PoolCandidate(be, pool, tmpl)
	return c.RunnerLabels, p.Field, ok
}

// unroutedJob explains a job with no CIJob: the webhook receiver writes
// one only for a job it routed to a pool; a job no pool covers leaves a
// Warning event on each verified pool in its scope (NoMatchingRunnerPool,
// or AmbiguousJobRouting when several tie), and one outside every verified
// pool's scope leaves nothing in the API (a log line at V(1) and the
// outcome out_of_scope of hyperfleet_webhook_jobs_routed_total).
func unroutedJob(w *World, t Target, r Report) Report {
	nomatch, ambiguous := jobEvents(w, t)
	for _, ev := range nomatch {
		r.Chain = append(r.Chain, Link{Kind: "RunnerPool", Name: nsName(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name),
			State: "does not cover the job: its runners lack " + after(ev.Message, "lack: ")})
	}
	for _, ev := range ambiguous {
		r.Chain = append(r.Chain, Link{Kind: "RunnerPool", Name: nsName(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name),
			State: "covers the job as specifically as another pool"})
	}
	switch {
	case len(ambiguous) > 0:
		ev := ambiguous[0]
		r.Blocked = &Blocker{
			Reason: string(hfv1.AmbiguousJobRoutingReason), Object: "RunnerPool " + nsName(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name),
			Field: "events (reason AmbiguousJobRouting)", Message: ev.Message,
			Fix: "tell the pools apart: give one of them another label or a repository scope, then re-run the job",
			Doc: doc(string(hfv1.AmbiguousJobRoutingReason)),
		}
	case len(nomatch) > 0:
		var msgs []string
		for _, ev := range nomatch {
			msgs = append(msgs, fmt.Sprintf("RunnerPool %s lacks %s", nsName(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name), after(ev.Message, "lack: ")))
		}
		ev := nomatch[0]
		r.Blocked = &Blocker{
			Reason: webhook.ReasonNoMatchingRunnerPool, Object: "RunnerPool " + nsName(ev.InvolvedObject.Namespace, ev.InvolvedObject.Name),
			Field:   "events (reason NoMatchingRunnerPool); the labels under each pool's spec.workload",
			Message: fmt.Sprintf("no RunnerPool covers the job's runs-on [%s]: %s", between(ev.Message, "runs-on: ", ")"), strings.Join(msgs, "; ")),
			Fix:     "add the missing labels to one pool's labels, or change the job's runs-on to a pool's labels; then re-run the job",
			Doc:     doc("why-is-my-job-not-running"),
		}
	default:
		r.Blocked = notRecorded(w, t)
	}
	return r
}

// notRecorded is the blocker of a job HyperFleet knows nothing about.
func notRecorded(w *World, t Target) *Blocker {
	var unverified []string
	for i := range w.Pools {
		p := &w.Pools[i]
		if t.Platform != "" && p.Spec.Workload.Type != t.Platform {
			continue
		}
		if c := hfv1.FindCondition(p.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition); c == nil || c.Status != metav1.ConditionTrue {
			why := "not checked yet"
			if c != nil {
				why = c.Reason
			}
			unverified = append(unverified, fmt.Sprintf("%s (%s)", nsName(p.Namespace, p.Name), why))
		}
	}
	msg := "HyperFleet holds no CIJob and no event about the job: it never routed it. Either no webhook delivery about it " +
		"reached the operator and no resync has seen it yet, or no verified pool's scope holds its repository " +
		"(recorded nowhere in the API: the operator logs it at verbosity 1 and counts it in hyperfleet_webhook_jobs_routed_total{outcome=\"out_of_scope\"})"
	field := "CIJobs, events"
	if len(unverified) > 0 {
		msg += "; pools whose scope is not verified get no job: " + strings.Join(unverified, ", ")
		field += "; RunnerPool status.conditions[ScopeVerified]"
	}
	return &Blocker{
		Reason: ReasonJobNotRecorded, Object: "job " + t.JobID + t.Name, Field: field, Message: msg,
		Fix: "check the CI platform's webhook deliveries to the operator (docs/github.md), that a pool's " +
			"repository or organization holds the job's repository, and the ScopeVerified condition of the pools",
		Doc: doc("why-is-my-job-not-running"),
	}
}

// jobEvents are the routing events about the job t names, newest first.
func jobEvents(w *World, t Target) (nomatch, ambiguous []corev1.Event) {
	if t.JobID == "" {
		return nil, nil
	}
	needle := strings.ToLower("job " + t.JobID + " of ")
	if t.Repository != "" {
		needle += strings.ToLower(t.Repository) + " "
	}
	for _, ev := range w.Events {
		if ev.InvolvedObject.Kind != "RunnerPool" || (t.Namespace != "" && ev.InvolvedObject.Namespace != t.Namespace) ||
			!strings.Contains(strings.ToLower(ev.Message), needle) {
			continue
		}
		switch ev.Reason {
		case webhook.ReasonNoMatchingRunnerPool:
			nomatch = append(nomatch, ev)
		case string(hfv1.AmbiguousJobRoutingReason):
			ambiguous = append(ambiguous, ev)
		}
	}
	newest := func(a, b corev1.Event) int { return eventTime(b).Compare(eventTime(a).Time) }
	slices.SortStableFunc(nomatch, newest)
	slices.SortStableFunc(ambiguous, newest)
	return dedupe(nomatch), dedupe(ambiguous)
}

// dedupe keeps each pool's newest event.
func dedupe(evs []corev1.Event) []corev1.Event {
	seen := map[string]bool{}
	out := evs[:0]
	for _, ev := range evs {
		k := ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name
		if !seen[k] {
			seen[k] = true
			out = append(out, ev)
		}
	}
	return out
}

func eventTime(ev corev1.Event) metav1.Time {
	switch {
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp
	case !ev.EventTime.IsZero():
		return metav1.Time{Time: ev.EventTime.Time}
	}
	return ev.FirstTimestamp
}

// after is the text after sep in s, or s.
func after(s, sep string) string {
	if _, a, ok := strings.Cut(s, sep); ok {
		return a
	}
	return s
}

// between is the text between start and end in s, or "".
func between(s, start, end string) string {
	_, a, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	b, _, _ := strings.Cut(a, end)
	return b
}

// suffix is pre+s+post, or "" when s is.
func suffix(pre, s, post string) string {
	if s == "" {
		return ""
	}
	return pre + s + post
}
