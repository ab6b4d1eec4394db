package devenv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The Buildkite world's names and secrets (Options.Buildkite).
const (
	// BuildkiteOrganization is the simulator's organization.
	BuildkiteOrganization = "hyperfleet-dev"
	// BuildkitePipeline is its pipeline, in BuildkiteClusterName.
	BuildkitePipeline    = "app"
	BuildkiteClusterName = "hyperfleet"
	// BuildkiteAPIToken is the operator's REST API token, with the
	// scopes docs/buildkite.md lists. Like PAT, it must never reach a VM.
	BuildkiteAPIToken = "bkua_devEnvironmentTokenThatMustNeverLeaveTheOperator"
	// buildkiteSecret is the Secret holding BuildkiteAPIToken.
	buildkiteSecret = "buildkite-api"
	// buildkiteWebhookToken signs the simulator's webhook deliveries.
	buildkiteWebhookToken = "dev-buildkite-webhook-token"
)

// buildkiteWorld is the Buildkite simulator of a World.
type buildkiteWorld struct {
	// Sim is the simulator, URL its base URL as the operator and the
	// guests reach it (REST under /v2, the agent API under /v3).
	Sim *buildkitesim.Simulator
	URL string
	// ClusterID is the cluster's UUID, every pool's.
	ClusterID string
}

// startBuildkite starts the Buildkite simulator over HTTPS with the
// GitHub simulator's certificate (which names the guests' host address
// and which they trust through the same CA), its webhooks signed and sent
// through the operator's webhook client.
func (w *World) startBuildkite() error {
	if w.opts.BuildkiteAgentBinary == "" {
		return errors.New("devenv: Options.Buildkite needs Options.BuildkiteAgentBinary (hack/buildkite-agent/build.sh prints it)")
	}
	sim := buildkitesim.New(buildkitesim.Config{
		Organization: BuildkiteOrganization,
		APITokens: []buildkitesim.APIToken{{Token: BuildkiteAPIToken, Scopes: []string{
			"read_organizations", "read_clusters", "write_clusters", "read_agents", "write_agents", "read_builds", "write_builds",
		}}},
		// Pings every second, so that the agents take jobs at once.
		PingInterval: 1, JobStatusInterval: 1,
		AgentBinary: w.opts.BuildkiteAgentBinary,
	}, buildkitesim.WithWebhookClient(w.webhook.client))
	base, err := w.serveTLS(sim, w.simCert)
	if err != nil {
		sim.Close()
		return err
	}
	c := sim.CreateCluster(BuildkiteClusterName)
	if err := sim.CreatePipeline(BuildkitePipeline, c.ID); err != nil {
		sim.Close()
		return fmt.Errorf("devenv: Buildkite pipeline: %w", err)
	}
	if w.opts.Platform == hfv1.WorkloadBuildkite {
		// The world's own pool serves queue JobLabel (buildkiteObjects).
		if _, err := sim.CreateQueue(c.ID, JobLabel); err != nil {
			sim.Close()
			return fmt.Errorf("devenv: Buildkite queue: %w", err)
		}
	}
	w.Buildkite = &buildkiteWorld{Sim: sim, URL: w.guestURL(base), ClusterID: c.ID}
	return nil
}

// webhookPlatforms are the in-process operator's webhook receivers:
// GitHub's, Buildkite's with Options.Buildkite and GitLab's with
// Options.GitLab.
func (w *World) webhookPlatforms() []manager.WebhookPlatform {
	// Named: the world registers Buildkite's and GitLab's back-ends,
	// which receive webhooks, whether or not their simulators run.
	out := []manager.WebhookPlatform{{Platform: hfv1.WorkloadGitHubActions, APIHost: w.GitHubAPIHost(),
		OwnerSecrets: map[string][]byte{Organization: []byte(webhookSecret)}}}
	if w.Buildkite != nil {
		out = append(out, manager.WebhookPlatform{Platform: hfv1.WorkloadBuildkite, APIHost: apiHost(w.Buildkite.URL),
			OwnerSecrets: map[string][]byte{BuildkiteOrganization: []byte(buildkiteWebhookToken)}})
	}
	if w.GitLab != nil {
		out = append(out, w.gitlabWebhookPlatform())
	}
	return out
}

// GitHubAPIHost is the GitHub simulator's API host, as the world's
// templates name it (their apiBaseURL): the host whose deliveries the
// operator's GitHub webhook receiver takes (--github-webhook-api-host).
func (w *World) GitHubAPIHost() string { return apiHost(w.GitHubURL) }

// apiHost is the host of a simulator's URL (workload.CanonicalHost).
func apiHost(u string) string {
	host, err := workload.HostOf(u)
	if err != nil {
		panic(fmt.Sprintf("devenv: a simulator's URL %q: %v", u, err))
	}
	return host
}

// pointBuildkiteWebhook makes the operator's receiver at base the
// organization's only (signed) webhook.
func (w *World) pointBuildkiteWebhook(base string) {
	if w.Buildkite == nil {
		return
	}
	w.Buildkite.Sim.RemoveWebhooks()
	w.Buildkite.Sim.AddWebhook(buildkitesim.Webhook{URL: base + "/webhooks/buildkite", Token: buildkiteWebhookToken, Signed: true})
}

// BuildkitePoolSpec is a Buildkite RunnerPool of the world.
type BuildkitePoolSpec struct {
	// Name names the pool and its template.
	Name string
	// Queue is the cluster queue the pool's agents serve (created).
	Queue string
	// MinReplicas and MaxReplicas size the pool.
	MinReplicas, MaxReplicas int32
}

// AddBuildkitePool creates a queue in the simulator's cluster and a
// Buildkite RunnerPool serving it, with its template (a copy of the
// world's: cloud-init, resources, agent source, cluster, attestation)
// whose bootstrap is the simulator's organization, with the agent
// downloaded from the simulator's release tarball and checked against its
// SHA-256, as a VM downloads Buildkite's release.
func (w *World) AddBuildkitePool(ctx context.Context, spec BuildkitePoolSpec) error {
	bk := w.Buildkite
	if bk == nil {
		return errors.New("devenv: AddBuildkitePool needs Options.Buildkite")
	}
	if _, err := bk.Sim.CreateQueue(bk.ClusterID, spec.Queue); err != nil {
		return fmt.Errorf("devenv: Buildkite queue: %w", err)
	}
	boot, err := w.buildkiteBootstrap()
	if err != nil {
		return err
	}
	objs, err := w.Objects()
	if err != nil {
		return err
	}
	tmpl := objectOf[*hfv1.HypervisorMachineTemplate](objs).DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name}
	tmpl.Spec.Bootstrap = hfv1.Bootstrap{AgentSource: tmpl.Spec.Bootstrap.AgentSource, Buildkite: boot}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: spec.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{Queue: spec.Queue}},
			Scaling:     hfv1.Scaling{MinReplicas: spec.MinReplicas, MaxReplicas: max(spec.MaxReplicas, spec.MinReplicas, 1)},
		},
	}
	if err := w.API.Client.Create(ctx, buildkiteTokenSecret()); client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("devenv: create the Buildkite API token's Secret: %w", err)
	}
	for _, o := range []client.Object{tmpl, pool} {
		if err := w.API.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("devenv: create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// SimulatorCA is the PEM CA the simulators' HTTPS certificate (GitHub's
// and Buildkite's) verifies against.
func (w *World) SimulatorCA() []byte { return w.githubCA }

// buildkiteTokenSecret is the Secret of the operator's Buildkite API token.
func buildkiteTokenSecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: buildkiteSecret},
		StringData: map[string]string{"token": BuildkiteAPIToken}}
}

// buildkiteBootstrap is a template's spec.bootstrap.buildkite for the
// simulator's organization and cluster, with the agent downloaded from the
// simulator's release tarball and checked against its SHA-256, as a VM
// downloads Buildkite's release.
func (w *World) buildkiteBootstrap() (*hfv1.BuildkiteBootstrap, error) {
	bk := w.Buildkite
	if bk == nil {
		return nil, errors.New("devenv: a Buildkite template needs Options.Buildkite")
	}
	sum, err := bk.Sim.AgentTarballSHA256()
	if err != nil {
		return nil, fmt.Errorf("devenv: the Buildkite agent tarball: %w", err)
	}
	return &hfv1.BuildkiteBootstrap{
		Organization:  BuildkiteOrganization,
		Cluster:       bk.ClusterID,
		APIURL:        bk.URL,
		AgentEndpoint: bk.URL + "/v3",
		Credentials:   hfv1.BuildkiteCredentials{APIToken: hfv1.LocalSecretKeySelector{Name: buildkiteSecret, Key: "token"}},
		Agent: &hfv1.BuildkiteAgentSoftware{
			DownloadURL:    bk.URL + "/_sim/agent/" + strings.ReplaceAll(buildkitesim.TarballName(bk.Sim.AgentVersion()), "linux-amd64", "{os}-{arch}"),
			DownloadSHA256: sum,
		},
	}, nil
}

// buildkiteObjects makes the world's own template and pool
// (Options.Platform buildkite) Buildkite's: the template bootstraps an
// agent of the simulator's organization, the pool serves queue JobLabel,
// and the API token's Secret comes before them.
func (w *World) buildkiteObjects(objs []client.Object) ([]client.Object, error) {
	boot, err := w.buildkiteBootstrap()
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs)+1)
	for _, o := range objs {
		switch o := o.(type) {
		case *hfv1.HypervisorMachineTemplate:
			if o.Name == TemplateName {
				out = append(out, buildkiteTokenSecret())
				o.Spec.Bootstrap = hfv1.Bootstrap{AgentSource: o.Spec.Bootstrap.AgentSource, Buildkite: boot}
			}
		case *hfv1.RunnerPool:
			if o.Name == PoolName {
				o.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadBuildkite, Buildkite: &hfv1.BuildkiteWorkload{Queue: JobLabel}}
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// queueBuildkiteJobs creates n builds of the world's pipeline, each one
// step on queue JobLabel that runs for d, and records their jobs.
func (w *World) queueBuildkiteJobs(n int, d time.Duration) error {
	secs := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	for range n {
		b, err := w.Buildkite.Sim.CreateBuild(BuildkitePipeline, "hyperfleet-dev", []buildkitesim.Step{{
			Key: "job", Label: "sleep " + secs, Command: "sleep " + secs, Agents: []string{"queue=" + JobLabel},
		}})
		if err != nil {
			return fmt.Errorf("devenv: create a Buildkite build: %w", err)
		}
		w.mu.Lock()
		w.buildkiteJobs = append(w.buildkiteJobs, b.JobIDs...)
		w.mu.Unlock()
	}
	return nil
}

// buildkiteJobStatus maps a Buildkite job state onto the GitHub statuses
// the live table counts: queued (scheduled, waiting), in_progress (given
// to an agent, running, being cancelled) and completed (any end, which is
// then its conclusion).
func buildkiteJobStatus(state string) (status, conclusion string) {
	switch state {
	case "scheduled", "waiting", "blocked", "pending", "limited", "limiting":
		return "queued", ""
	case "assigned", "accepted", "running", "canceling", "timing_out":
		return "in_progress", ""
	}
	return "completed", state
}

// buildkiteSnapshot adds the Buildkite jobs QueueJobs queued and the
// agents still there (connected and not asked to stop, or holding a job)
// to s.
func (w *World) buildkiteSnapshot(s *Snapshot) {
	w.mu.Lock()
	ids := slices.Clone(w.buildkiteJobs)
	w.mu.Unlock()
	for _, id := range ids {
		j, ok := w.Buildkite.Sim.Job(id)
		if !ok {
			continue
		}
		status, conclusion := buildkiteJobStatus(j.State)
		s.PlatformJobs = append(s.PlatformJobs, PlatformJob{ID: id, Status: status, Conclusion: conclusion, RunnerName: j.Agent})
	}
	for _, a := range w.Buildkite.Sim.Agents() {
		if a.State == "connected" && !a.StopRequested || a.Job != "" {
			s.PlatformRunners = append(s.PlatformRunners, PlatformRunner{Name: a.Name, Status: a.State, Busy: a.Job != ""})
		}
	}
}
