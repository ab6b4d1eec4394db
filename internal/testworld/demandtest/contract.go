// Package demandtest is the demand contract suite: what every source of
// demand owes the RunnerPools (docs/architecture.md, "Demand records in
// the API server"), whichever way it learns of jobs: a CI platform's
// webhooks, a job feed the leader listens to (a GitHub runner scale set),
// the resync. Each source's test runs Run with a Harness of a live
// operator world (the real API server, the operator, a platform
// simulator), so that every source is held to the same contract, read
// only through the demand records (CIJobs) it writes:
//
//   - a queued job the pool serves is recorded once, in the pool's
//     namespace, under the platform's own job id (hfv1.CIJobName), routed
//     to the pool;
//   - its record only moves forward (queued, in_progress, completed), is
//     never replaced by another object, and ends completed with the runner
//     that ran it and the conclusion;
//   - the source reporting the job again (a webhook redelivery, a feed
//     message delivered twice) writes nothing;
//   - a job the pool does not serve is not the pool's demand.
package demandtest

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Harness is one source of demand in a live world.
type Harness struct {
	// Reader reads the CIJobs (the API server, uncached).
	Reader client.Reader
	// Pool is the RunnerPool the source's jobs are for; Platform its
	// workload type.
	Pool     types.NamespacedName
	Platform hfv1.WorkloadType
	// Sources are the CIJob status.source values the source writes.
	Sources []string
	// Queue queues a job the pool serves and the source reports, which the
	// pool's VMs run to success, and returns its id on the platform.
	Queue func(t *testing.T) string
	// QueueUnserved queues a job of the same platform and scope that the
	// pool does not serve (labels its runners lack) and returns its id.
	QueueUnserved func(t *testing.T) string
	// Repeat makes the source report what it last reported of job id
	// again.
	Repeat func(t *testing.T, id string)
	// Timeout bounds a job's way to completion (default 3 minutes).
	Timeout time.Duration
}

// Run runs the contract against h.
func Run(t *testing.T, h Harness) {
	if h.Timeout == 0 {
		h.Timeout = 3 * time.Minute
	}
	var id string
	var final hfv1.CIJob
	t.Run("recorded once, forward only, to completion", func(t *testing.T) {
		id = h.Queue(t)
		final = follow(t, h, id)
	})
	if id == "" || final.Name == "" {
		t.Fatal("the job was not recorded; the other cases need it")
	}
	t.Run("a repeat writes nothing", func(t *testing.T) {
		h.Repeat(t, id)
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			cur := get(t, h, id)
			if cur == nil || cur.UID != final.UID || cur.ResourceVersion != final.ResourceVersion {
				t.Fatalf("the repeat changed the record: before %+v, after %+v", final.Status, cur)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
	t.Run("an unserved job is not the pool's demand", func(t *testing.T) {
		other := h.QueueUnserved(t)
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if cj := get(t, h, other); cj != nil {
				t.Fatalf("job %s, which the pool does not serve, was recorded: %+v", other, cj)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})
}

// get reads the record of job id in the pool's namespace; nil when there
// is none.
func get(t *testing.T, h Harness, id string) *hfv1.CIJob {
	t.Helper()
	var cj hfv1.CIJob
	key := client.ObjectKey{Namespace: h.Pool.Namespace, Name: hfv1.CIJobName(h.Platform, id)}
	if err := h.Reader.Get(context.Background(), key, &cj); err != nil {
		if client.IgnoreNotFound(err) == nil {
			return nil
		}
		t.Fatalf("read CIJob %s: %v", key, err)
	}
	return &cj
}

// follow watches job id's record until it is completed, checking every
// sample against the contract, and returns the last.
func follow(t *testing.T, h Harness, id string) hfv1.CIJob {
	t.Helper()
	var first *hfv1.CIJob
	var states []hfv1.CIJobState
	deadline := time.Now().Add(h.Timeout)
	for {
		cj := get(t, h, id)
		switch {
		case cj == nil && first != nil:
			t.Fatalf("the record of job %s went away before it completed (states %v)", id, states)
		case cj != nil:
			if first == nil {
				first = cj
			}
			if err := check(h, id, first, cj, states); err != nil {
				t.Fatal(err)
			}
			if n := len(states); n == 0 || states[n-1] != cj.Status.State {
				states = append(states, cj.Status.State)
			}
			if cj.Status.State == hfv1.CIJobCompleted {
				if cj.Status.RunnerName == "" || cj.Status.Conclusion != "success" || cj.Status.CompletedAt == nil {
					t.Fatalf("completed record of job %s lacks its runner, conclusion or time: %+v", id, cj.Status)
				}
				t.Logf("job %s: states %v, source %s, runner %s", id, states, cj.Status.Source, cj.Status.RunnerName)
				return *cj
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s not completed within %s (states %v, record %+v)", id, h.Timeout, states, cj)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check holds one sample of the record against the contract.
func check(h Harness, id string, first, cj *hfv1.CIJob, states []hfv1.CIJobState) error {
	if cj.UID != first.UID {
		return fmt.Errorf("the record of job %s was replaced by another object", id)
	}
	if cj.Spec.Platform != h.Platform || cj.Spec.ID() != id || cj.Spec.RunnerPoolRef.Name != h.Pool.Name {
		return fmt.Errorf("the record of job %s names platform %s, job %s, pool %s", id, cj.Spec.Platform, cj.Spec.ID(), cj.Spec.RunnerPoolRef.Name)
	}
	if !slices.Contains(h.Sources, cj.Status.Source) {
		return fmt.Errorf("the record of job %s has source %q, want one of %v", id, cj.Status.Source, h.Sources)
	}
	if n := len(states); n > 0 && hfv1.CIJobRank(cj.Status.State) < hfv1.CIJobRank(states[n-1]) {
		return fmt.Errorf("the record of job %s went back from %s to %s", id, states[n-1], cj.Status.State)
	}
	return nil
}
