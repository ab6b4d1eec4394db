package gitlab_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	glworkload "github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestContract runs the workload contract suite, shared with every CI
// platform's back-end, against the GitLab simulator, for group runners
// (acme/platform, its subgroups' projects included).
func TestContract(t *testing.T) {
	workloadtest.Run(t, func(t *testing.T) workloadtest.Harness {
		w := newWorld(t, nil)
		return workloadtest.Harness{
			Capabilities: workloadtest.Capabilities{RegistersOnIssue: true, NumericRunnerIDs: true},
			Provider:     w.provider(t, ownerPAT, glworkload.ScopeOf("", "acme/platform", false)),
			Repository:   "acme/platform/ci/tools",
			UnknownJobID: "987654321",
			Outside:      "acme/web",
			Spec:         workload.RunnerSpec{Labels: []string{"linux", "hyperfleet"}, Method: credmethods.MethodRunnerAuthToken, WorkFolder: "/var/lib/hyperfleet/builds"},
			QueueJob: func(t *testing.T, repository string, labels []string) string {
				pl, err := w.sim.CreatePipeline(gitlabsim.PipelineRequest{Project: repository, Jobs: []gitlabsim.JobConfig{{Name: "contract", Script: []string{"true"}, Tags: labels}}})
				if err != nil {
					t.Fatal(err)
				}
				return strconv.FormatInt(pl.Jobs[0], 10)
			},
			// The runner API call gitlab-runner makes to take a job
			// (POST /jobs/request, as runnerapi_test.go in the simulator
			// checks against gitlab-runner's own types).
			TakeJob: func(t *testing.T, cred workload.Credential, id string) {
				code, body := w.runnerCall(t, "/jobs/request", map[string]any{"token": cred.Secret.Reveal(), "system_id": "s_0123456789ab"})
				if code != http.StatusCreated || strconv.FormatInt(int64(body["id"].(float64)), 10) != id {
					t.Fatalf("job request: %d %v, want job %s", code, body["id"], id)
				}
			},
		}
	})
}
