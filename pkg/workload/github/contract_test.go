package github_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	ghworkload "github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/workloadtest"
)

// TestContract runs the workload contract suite, shared with every CI
// platform's back-end, against the GitHub simulator, for repository
// runners with JIT configurations; a busy runner is the simulator's
// actions/runner stand-in running the job.
func TestContract(t *testing.T) {
	workloadtest.Run(t, func(t *testing.T) workloadtest.Harness {
		gs := githubsimtest.Start(t, simConfig())
		return workloadtest.Harness{
			Capabilities: workloadtest.Capabilities{RegistersOnIssue: true, NumericRunnerIDs: true},
			Provider:     newProvider(t, gs.Sim, gs.URL, gs.Transport, nil),
			Repository:   "octo-org/app",
			UnknownJobID: "987654321",
			Outside:      "octo-org/other",
			Spec:         workload.RunnerSpec{Labels: ghworkload.RunnerLabels("linux", "x64", nil), Method: credmethods.MethodJIT, WorkFolder: "/var/lib/hyperfleet/work"},
			QueueJob: func(t *testing.T, repository string, labels []string) string {
				// Long enough to be running while the suite looks; the
				// suite cancels or abandons it.
				j, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: repository, Labels: labels, Duration: 30 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				return strconv.FormatInt(j.ID, 10)
			},
			TakeJob: func(t *testing.T, cred workload.Credential, id string) {
				githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", cred.Secret.Reveal())
				waitFor(t, 20*time.Second, "the runner takes the job", func() bool {
					n, _ := strconv.ParseInt(id, 10, 64)
					j, _ := gs.Sim.Job(n)
					return j.Status == "in_progress" && j.RunnerName == cred.RunnerName
				})
			},
		}
	})
}
