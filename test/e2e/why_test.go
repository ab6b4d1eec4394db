//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/internal/why"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

// TestWhyInTheWholeLoop asks `hyperfleet why` (internal/why over the
// objects the running operator wrote) about two waiting jobs: with a pool
// of maxReplicas 1 whose one VM is taken by one of two long jobs, the
// other is blocked by AtMaxReplicas on the pool; a job whose labels
// no pool has is blocked by NoMatchingRunnerPool, known only from the
// event the webhook receiver wrote on the pool, naming the label its
// runners lack.
//
// No mutation was run here: one that breaks either answer makes the test
// wait out its bound (minutes on the shared machine); the same answers'
// mutations are recorded on internal/why's TestExplain.
func TestWhyInTheWholeLoop(t *testing.T) {
	w, watch := startWorld(t, func(o *devenv.Options) { o.MaxReplicas = 1 })
	defer watch.stop()
	ids, err := w.EnqueueJobs(2, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lost, err := w.GitHub.EnqueueJob(githubsim.JobRequest{Repository: devenv.Repository, Labels: []string{"self-hosted", "no-pool-has-this"}, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	backends, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitHubActions: github.NewBackend}, workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(arg string) (why.Report, error) {
		target, err := why.ParseTarget(arg, "")
		if err != nil {
			return why.Report{}, err
		}
		world, err := why.Load(context.Background(), w.API.Client, "", time.Now())
		if err != nil {
			return why.Report{}, err
		}
		world.Backends = backends
		return why.Explain(world, target), nil
	}
	blockedBy := func(arg, reason string, check func(*why.Blocker) error) func() error {
		return func() error {
			r, err := ask(arg)
			if err != nil {
				return err
			}
			if r.Blocked == nil || r.Blocked.Reason != reason {
				return fmt.Errorf("why %s: %+v", arg, r)
			}
			if err := check(r.Blocked); err != nil {
				return err
			}
			var text strings.Builder
			if err := r.WriteText(&text); err != nil {
				return err
			}
			t.Logf("why %s:\n%s", arg, text.String())
			return nil
		}
	}

	// One of the two jobs runs on the pool's one VM; the other waits.
	eventually(t, 10*time.Minute, "a job blocked by AtMaxReplicas", func() error {
		var errs []string
		for _, id := range ids {
			err := blockedBy(strconv.FormatInt(id, 10), string(hfv1.AtMaxReplicasReason), func(b *why.Blocker) error {
				if b.Object != "RunnerPool "+devenv.Namespace+"/"+devenv.PoolName || !strings.Contains(b.Message, "spec.scaling.maxReplicas 1") {
					return fmt.Errorf("blocker %+v", b)
				}
				return nil
			})()
			if err == nil {
				return nil
			}
			errs = append(errs, err.Error())
		}
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	})

	eventually(t, 5*time.Minute, "the unlabelled job blocked by NoMatchingRunnerPool",
		blockedBy(fmt.Sprintf("https://github.com/%s/actions/runs/1/job/%d", devenv.Repository, lost.ID), webhook.ReasonNoMatchingRunnerPool, func(b *why.Blocker) error {
			if !strings.Contains(b.Message, "RunnerPool "+devenv.Namespace+"/"+devenv.PoolName+" lacks no-pool-has-this") {
				return fmt.Errorf("blocker %+v", b)
			}
			return nil
		}))
}
