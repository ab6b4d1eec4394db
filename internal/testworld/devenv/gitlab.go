package devenv

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab/gitlabsimtest"
)

// The GitLab world's names and secrets (Options.GitLab).
const (
	// GitLabGroup is the simulator's group, every GitLab pool's scope;
	// GitLabProject is its project, where tests create pipelines.
	GitLabGroup   = "hyperfleet-dev"
	GitLabProject = GitLabGroup + "/app"
	// GitLabToken is the operator's access token (a group Owner's, with
	// the scopes docs/gitlab.md lists and api to cancel pipelines). Like
	// PAT, it must never reach a VM.
	GitLabToken = "glpat-devEnvironmentTokenNeverInAVM"
	// gitlabSecret is the Secret holding GitLabToken.
	gitlabSecret = "gitlab-api"
	// gitlabWebhookToken is the group hook's secret token.
	gitlabWebhookToken = "dev-gitlab-webhook-token"
)

// gitlabWorld is the GitLab simulator of a World.
type gitlabWorld struct {
	// Sim is the simulator, URL its base URL as the operator and the
	// guests reach it (REST and the runner API under /api/v4, the
	// gitlab-runner stand-in under /_sim/gitlab-runner/).
	Sim *gitlabsim.Simulator
	URL string
	// hookBase is the operator's receiver the group's hook points at.
	hookBase string
}

// PauseHooks removes the group's hook: jobs created until ResumeHooks
// reach the operator through its resync alone.
func (g *gitlabWorld) PauseHooks() { g.Sim.RemoveHooks() }

// ResumeHooks points the group's hook at the operator's receiver again.
func (g *gitlabWorld) ResumeHooks() error {
	g.Sim.RemoveHooks()
	if _, err := g.Sim.AddHook(gitlabsim.HookConfig{URL: g.hookBase + "/webhooks/gitlab", Token: gitlabWebhookToken, Group: GitLabGroup}); err != nil {
		return fmt.Errorf("devenv: GitLab hook: %w", err)
	}
	return nil
}

// startGitLab starts the GitLab simulator over HTTPS with the GitHub
// simulator's certificate (which names the guests' host address and which
// they trust through SSL_CERT_FILE, as the stand-in runner does), its Job
// Hooks sent through the operator's webhook client.
func (w *World) startGitLab() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("devenv: GitLab simulator: listen: %w", err)
	}
	// The instance's external URL, as the world's templates name it: its
	// Job Hooks name it too (X-Gitlab-Instance), and the operator takes
	// them as that host's.
	url := w.guestURL("https://" + ln.Addr().String())
	sim, err := gitlabsim.New(gitlabsim.Config{
		URL:      url,
		Projects: []gitlabsim.ProjectConfig{{Path: GitLabProject}},
		Users:    []gitlabsim.UserConfig{{Username: "hyperfleet", Members: map[string]int{GitLabGroup: gitlabsim.Owner}}},
		Tokens: []gitlabsim.TokenConfig{{Token: GitLabToken, User: "hyperfleet",
			Scopes: []string{"api", "create_runner", "manage_runner", "read_api"}}},
	}, gitlabsim.WithWebhookClient(w.webhook.client))
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("devenv: GitLab simulator: %w", err)
	}
	w.serveTLSOn(ln, sim, w.simCert)
	w.GitLab = &gitlabWorld{Sim: sim, URL: url}
	return nil
}

// gitlabWebhookPlatform is the operator's GitLab receiver: the group's
// own token.
func (w *World) gitlabWebhookPlatform() manager.WebhookPlatform {
	return manager.WebhookPlatform{Platform: hfv1.WorkloadGitLabCI, APIHost: apiHost(w.GitLab.URL),
		OwnerSecrets: map[string][]byte{gitlabsimtest.OwnerKey(GitLabGroup): []byte(gitlabWebhookToken)}}
}

// pointGitLabWebhook makes the operator's receiver at base the group's
// only hook.
func (w *World) pointGitLabWebhook(base string) error {
	if w.GitLab == nil {
		return nil
	}
	w.GitLab.hookBase = base
	return w.GitLab.ResumeHooks()
}

// GitLabPoolSpec is a GitLab RunnerPool of the world.
type GitLabPoolSpec struct {
	// Name names the pool and its template.
	Name string
	// Tags are the pool's runners' tags.
	Tags []string
	// MinReplicas and MaxReplicas size the pool.
	MinReplicas, MaxReplicas int32
}

// AddGitLabPool creates a GitLab RunnerPool of the simulator's group with
// its template (a copy of the world's: cloud-init, resources, agent
// source, cluster, attestation), whose runner is the simulator's
// gitlab-runner stand-in, downloaded and checked against its SHA-256 as a
// VM downloads GitLab's binary.
func (w *World) AddGitLabPool(ctx context.Context, spec GitLabPoolSpec) error {
	gl := w.GitLab
	if gl == nil {
		return errors.New("devenv: AddGitLabPool needs Options.GitLab")
	}
	objs, err := w.Objects()
	if err != nil {
		return err
	}
	tmpl := objectOf[*hfv1.HypervisorMachineTemplate](objs).DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name}
	tmpl.Spec.Bootstrap = hfv1.Bootstrap{AgentSource: tmpl.Spec.Bootstrap.AgentSource, GitLab: gl.bootstrap()}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: spec.Name},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: spec.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: spec.Tags}},
			Scaling:     hfv1.Scaling{MinReplicas: spec.MinReplicas, MaxReplicas: max(spec.MaxReplicas, spec.MinReplicas, 1)},
		},
	}
	if err := w.API.Client.Create(ctx, gitlabTokenSecret()); client.IgnoreAlreadyExists(err) != nil {
		return fmt.Errorf("devenv: create the GitLab token's Secret: %w", err)
	}
	for _, o := range []client.Object{tmpl, pool} {
		if err := w.API.Client.Create(ctx, o); err != nil {
			return fmt.Errorf("devenv: create %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// gitlabTokenSecret is the Secret of the operator's GitLab access token.
func gitlabTokenSecret() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: gitlabSecret},
		StringData: map[string]string{"token": GitLabToken}}
}

// bootstrap is a template's spec.bootstrap.gitlab for the simulator's
// group, whose runner is the simulator's gitlab-runner stand-in,
// downloaded and checked against its SHA-256 as a VM downloads GitLab's
// binary.
func (g *gitlabWorld) bootstrap() *hfv1.GitLabBootstrap {
	_, sum := gitlabsim.RunnerStandIn()
	return &hfv1.GitLabBootstrap{
		URL:         g.URL,
		Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: gitlabSecret, Key: "token"}},
		Group:       GitLabGroup,
		Runner: &hfv1.GitLabRunnerSoftware{
			DownloadURL:    g.URL + "/_sim/gitlab-runner/gitlab-runner-{os}-{arch}",
			DownloadSHA256: sum,
		},
	}
}

// gitlabObjects makes the world's own template and pool (Options.Platform
// gitlab-ci) GitLab's: the template bootstraps a runner of the
// simulator's group, the pool's runners carry the tag JobLabel, and the
// access token's Secret comes before them.
func (w *World) gitlabObjects(objs []client.Object) ([]client.Object, error) {
	if w.GitLab == nil {
		return nil, errors.New("devenv: a GitLab template needs Options.GitLab")
	}
	out := make([]client.Object, 0, len(objs)+1)
	for _, o := range objs {
		switch o := o.(type) {
		case *hfv1.HypervisorMachineTemplate:
			if o.Name == TemplateName {
				out = append(out, gitlabTokenSecret())
				o.Spec.Bootstrap = hfv1.Bootstrap{AgentSource: o.Spec.Bootstrap.AgentSource, GitLab: w.GitLab.bootstrap()}
			}
		case *hfv1.RunnerPool:
			if o.Name == PoolName {
				o.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{JobLabel}}}
			}
		}
		out = append(out, o)
	}
	return out, nil
}

// queueGitLabJobs creates n pipelines in the world's project, each one
// job tagged JobLabel that runs for d, and records their jobs.
func (w *World) queueGitLabJobs(n int, d time.Duration) error {
	secs := strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	for range n {
		pl, err := w.GitLab.Sim.CreatePipeline(gitlabsim.PipelineRequest{Project: GitLabProject, Jobs: []gitlabsim.JobConfig{{
			Name: "sleep " + secs, Script: []string{"sleep " + secs}, Tags: []string{JobLabel},
		}}})
		if err != nil {
			return fmt.Errorf("devenv: create a GitLab pipeline: %w", err)
		}
		w.mu.Lock()
		w.gitlabJobs = append(w.gitlabJobs, pl.Jobs...)
		w.mu.Unlock()
	}
	return nil
}

// gitlabJobStatus maps a GitLab job status onto the GitHub statuses the
// live table counts: queued (created, pending), in_progress (running) and
// completed (any end, which is then its conclusion).
func gitlabJobStatus(status string) (string, string) {
	switch status {
	case gitlabsim.StatusCreated, gitlabsim.StatusPending:
		return "queued", ""
	case gitlabsim.StatusRunning:
		return "in_progress", ""
	}
	return "completed", status
}

// gitlabSnapshot adds the GitLab jobs QueueJobs queued and the runners
// still there to s. A runner is named by its description (what the
// claim's status records); it is online once a gitlab-runner on its VM
// verified its token (a manager) and busy while one of its jobs runs.
func (w *World) gitlabSnapshot(s *Snapshot) {
	sim := w.GitLab.Sim
	w.mu.Lock()
	ids := slices.Clone(w.gitlabJobs)
	w.mu.Unlock()
	names := map[int64]string{}
	for _, r := range sim.IssuedRunners() {
		names[r.ID] = r.Description
	}
	busy := map[int64]bool{}
	for _, id := range ids {
		j, ok := sim.Job(id)
		if !ok {
			continue
		}
		status, conclusion := gitlabJobStatus(j.Status)
		if j.Status == gitlabsim.StatusRunning {
			busy[j.RunnerID] = true
		}
		s.PlatformJobs = append(s.PlatformJobs, PlatformJob{ID: strconv.FormatInt(id, 10), Status: status, Conclusion: conclusion, RunnerName: names[j.RunnerID]})
	}
	for _, r := range sim.Runners() {
		status := "never contacted"
		if len(r.Managers) > 0 {
			status = "online"
		}
		s.PlatformRunners = append(s.PlatformRunners, PlatformRunner{Name: cmp.Or(names[r.ID], strconv.FormatInt(r.ID, 10)), Status: status, Busy: busy[r.ID]})
	}
}
