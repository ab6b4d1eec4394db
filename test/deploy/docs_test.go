//go:build deploy

package deploy

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/docblocks"
	"github.com/hyperfleet/hyperfleet/internal/testworld/eventdump"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// The pveum on the docs test's PATH is this test binary: run with
// pveumURLEnv set, it sends its command line to the Proxmox simulator's
// admin API (POST /_sim/pveum: the simulator's own pveum, which runs as
// root on the node as Proxmox's does) and prints what pveum prints.
const (
	pveumURLEnv         = "HF_DOCS_PVEUM_URL"
	pveumFingerprintEnv = "HF_DOCS_PVEUM_FINGERPRINT"
)

func TestMain(m *testing.M) {
	if u := os.Getenv(pveumURLEnv); u != "" {
		os.Exit(pveum(u, os.Getenv(pveumFingerprintEnv), os.Args[1:]))
	}
	os.Exit(m.Run())
}

// pveum is the pveum command: exit code 255 and pveum's message on
// standard error when it fails, as Proxmox's CLI tools do.
func pveum(adminURL, fingerprint string, args []string) int {
	body, _ := json.Marshal(args)
	c := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		// The simulator's certificate is self-signed: pinned, as the
		// operator pins it (spec.tls.fingerprintSHA256).
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if got := proxmoxsim.FormatFingerprint(sha256.Sum256(raw[0])); got != fingerprint {
				return fmt.Errorf("the Proxmox simulator's certificate is %s, not the pinned %s", got, fingerprint)
			}
			return nil
		},
	}}}
	resp, err := c.Post(adminURL, "application/json", bytes.NewReader(body))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 255
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		fmt.Fprint(os.Stderr, string(out))
		return 255
	}
	fmt.Print(string(out))
	return 0
}

// docsShell runs a page's command blocks as its reader runs them: each in
// bash (-euo pipefail: a failing command, or a variable the reader was to
// set and did not, stops it) from the repository's root, with the tools
// the page names on PATH, after replacing the values a reader substitutes.
type docsShell struct {
	t       *testing.T
	env     []string
	replace *strings.Replacer
	// dir is where the blocks run; the repository's root when empty.
	dir string
}

// run runs block under ctx and returns its standard output; a failure
// fails the test, naming the block and its output.
func (s *docsShell) run(ctx context.Context, b docblocks.Block) string {
	s.t.Helper()
	out, err := s.try(ctx, b)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

// try is run, returning the failure instead.
func (s *docsShell) try(ctx context.Context, b docblocks.Block) (string, error) {
	s.t.Helper()
	script := s.replace.Replace(b.Text)
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = cmp.Or(s.dir, testenv.RepoRoot())
	cmd.Env = s.env
	// Both streams go to all from their own goroutines: one lock.
	var stdout bytes.Buffer
	all := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = io.MultiWriter(&stdout, all), all
	start := time.Now()
	err := cmd.Run()
	s.t.Logf("%s ran in %s:\n%s\n--- output:\n%s", b, time.Since(start).Round(100*time.Millisecond), script, all.String())
	if err != nil {
		return stdout.String(), fmt.Errorf("%s failed (%w): a reader following the page stops here", b, err)
	}
	return stdout.String(), nil
}

// lockedBuffer is a buffer two goroutines write to.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// readPage reads the command blocks of a page (a path from the
// repository's root) and checks that every block marked run-by names a
// test that exists.
func readPage(t *testing.T, page string) []docblocks.Block {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), filepath.FromSlash(page)))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := docblocks.Read(data)
	if err != nil {
		t.Fatalf("%s: %v", page, err)
	}
	checkRunBy(t, blocks)
	return blocks
}

// setenv sets a variable of the blocks that follow, as a reader exports
// what an earlier step printed.
func (s *docsShell) setenv(name, value string) { s.env = append(s.env, name+"="+value) }

// tokenValueRE finds the secret in pveum's table of a new token.
var tokenValueRE = regexp.MustCompile(`│ value +│ (\S+) +│`)

// TestInstallPageRunsAsWritten runs docs/install.md from zero to a finished
// job: every command block the page does not mark as run by another test,
// in the page's order, as written, with only what a reader substitutes
// replaced (the registry's host, the certificate and key files, the
// variables the page names, the samples' fields it says to edit), in the
// deployment world (docsWorld): the real API server (RBAC enforced, no
// CRDs before the chart's), podman, the Proxmox simulator in place of
// Proxmox VE (its pveum for step 2) and the GitHub simulator in place of
// GitHub (the App of step 3 created as its web UI would). Step 1's image
// is pushed to a real registry (go-containerregistry's) and the pod pulls
// it from there; step 4's helm install --wait returns once the pod is
// Ready; step 5's samples become Ready; then a workflow job of the
// samples' repository with the pool's labels runs on a fresh VM of the
// pool, which the operator made with the token step 2 created.
func TestInstallPageRunsAsWritten(t *testing.T) {
	ctx := context.Background()
	blocks := readPage(t, "docs/install.md")
	d := startDocsWorld(t, docsWorldOptions{receiver: "github"})
	d.runBlocks(ctx, docblocks.Unmarked(blocks))

	// The samples as step 5 says they report.
	d.waitSamplesReady(ctx, "github-runner", "hyperfleet-ci")
	// A workflow job with the pool's labels, as step 5 describes it.
	d.runJob(ctx, []string{"self-hosted", "linux", "x64", "hyperfleet-ci"}, "hyperfleet-ci-")
}

// TestScaleSetQuickStartRunsAsWritten runs docs/github.md's quick start
// for runner scale sets after docs/install.md's steps 1 and 2 (step 3's
// App needs no webhook in this mode, and nothing calls the cluster): its
// blocks in order and as written, as TestInstallPageRunsAsWritten runs
// the install page's, to a job no webhook announces (nothing is pointed
// at the cluster), run on a fresh VM of the pool: a runner with the scale
// set's JIT configuration.
func TestScaleSetQuickStartRunsAsWritten(t *testing.T) {
	ctx := context.Background()
	d := runQuickStart(ctx, t, "docs/github.md", "Quick start: runner scale sets", docsWorldOptions{})
	d.waitSamplesReady(ctx, "github-runner", "repo-scaleset")
	// A workflow job with runs-on: [self-hosted, linux, scaleset], which
	// no webhook announces.
	d.runJob(ctx, []string{"self-hosted", "linux", "scaleset"}, "repo-scaleset-")
}

// TestGitLabQuickStartRunsAsWritten runs docs/gitlab.md's quick start
// after docs/install.md's steps 1 and 2, as TestInstallPageRunsAsWritten
// runs the install page, against the GitLab simulator (its group's Job
// Hook pointed at the receiver the quick start installs, the group's
// access token), to a job of the group's project with the pool's tags, run
// on a fresh VM of the pool.
func TestGitLabQuickStartRunsAsWritten(t *testing.T) {
	ctx := context.Background()
	d := runQuickStart(ctx, t, "docs/gitlab.md", "Quick start", docsWorldOptions{receiver: "gitlab"})
	d.waitSamplesReady(ctx, "gitlab-linux", "gitlab-linux")
	pl, err := d.w.GitLab.Sim.CreatePipeline(gitlabsim.PipelineRequest{Project: devenv.GitLabProject, Jobs: []gitlabsim.JobConfig{{
		Name: "build", Script: []string{"sleep 2"}, Tags: []string{"linux", "hyperfleet"},
	}}})
	if err != nil || len(pl.Jobs) != 1 {
		t.Fatalf("create a pipeline: %v (%d jobs)", err, len(pl.Jobs))
	}
	d.waitJob(ctx, "GitLab", func() (string, string, bool) {
		j, _ := d.w.GitLab.Sim.Job(pl.Jobs[0])
		return j.Status, fmt.Sprintf("runner %d", j.RunnerID), j.Status == "success"
	}, "failed", "canceled")
}

// TestBuildkiteQuickStartRunsAsWritten runs docs/buildkite.md's quick
// start after docs/install.md's steps 1 and 2, against the Buildkite
// simulator (the queue linux created and the notification service pointed
// at the receiver, as the page asks of the reader in Buildkite), to a
// step on that queue, run on a fresh VM of the pool.
func TestBuildkiteQuickStartRunsAsWritten(t *testing.T) {
	ctx := context.Background()
	d := runQuickStart(ctx, t, "docs/buildkite.md", "Quick start", docsWorldOptions{receiver: "buildkite"})
	d.waitSamplesReady(ctx, "buildkite-linux", "buildkite-linux")
	b, err := d.w.Buildkite.Sim.CreateBuild(devenv.BuildkitePipeline, "quick start", []buildkitesim.Step{{
		Key: "build", Label: "build", Command: "sleep 2", Agents: []string{"queue=linux"},
	}})
	if err != nil || len(b.JobIDs) != 1 {
		t.Fatalf("create a build: %v (%d jobs)", err, len(b.JobIDs))
	}
	d.waitJob(ctx, "Buildkite", func() (string, string, bool) {
		j, _ := d.w.Buildkite.Sim.Job(b.JobIDs[0])
		return j.State, "agent " + j.Agent, j.State == "passed"
	}, "failed", "canceled")
}

// runQuickStart starts a world for a quick start and runs docs/install.md's
// blocks of steps 1 and 2 (the image, the Proxmox role, user and token),
// which the quick starts begin after, then the page's blocks under
// heading.
func runQuickStart(ctx context.Context, t *testing.T, page, heading string, opts docsWorldOptions) *docsWorld {
	t.Helper()
	var steps []docblocks.Block
	for _, b := range docblocks.Unmarked(readPage(t, "docs/install.md")) {
		if strings.HasPrefix(b.Heading, "1. ") || strings.HasPrefix(b.Heading, "2. ") {
			steps = append(steps, b)
		}
	}
	quick := blocksUnder(readPage(t, page), heading)
	if len(steps) == 0 || len(quick) == 0 {
		t.Fatalf("found %d blocks of docs/install.md's steps 1 and 2 and %d of %s under %q", len(steps), len(quick), page, heading)
	}
	d := startDocsWorld(t, opts)
	d.runBlocks(ctx, append(steps, quick...))
	return d
}

// blocksUnder are the page's blocks under the headings that start with
// heading.
func blocksUnder(blocks []docblocks.Block, heading string) []docblocks.Block {
	var out []docblocks.Block
	for _, b := range blocks {
		if strings.HasPrefix(b.Heading, heading) {
			out = append(out, b)
		}
	}
	return out
}

// docsWorld is the deployment world a page's commands run in, and the
// shell they run in. What it adds to the reader's commands, only through
// the helm on PATH (a wrapper of the real one): the manager's ports bound
// to loopback (the pod shares this host's network), the receiver's API
// host and the ConfigMap of the simulators' CA (the reader's GitHub has a
// public one), and quick intervals.
type docsWorld struct {
	t  *testing.T
	w  *devenv.World
	pm *podman
	sh *docsShell
	k  *kubelet
	// image is the image step 1 builds and pushes, as the registry names
	// it.
	image string
	ro    *rollout
}

// docsWorldOptions say what a page installs.
type docsWorldOptions struct {
	// receiver is the platform whose webhooks the install receives:
	// "github" (the simulator delivers to it, as step 3's App webhook),
	// "gitlab" (the GitLab simulator runs, its group's Job Hook delivers
	// to it), "buildkite" (the Buildkite simulator runs, with the queue
	// linux, its notification service delivering to it), or empty for an
	// install without a receiver.
	receiver string
}

// startDocsWorld starts the world.
func startDocsWorld(t *testing.T, opts docsWorldOptions) *docsWorld {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	agent := filepath.Join(dir, "hyperfleet-agent")
	build := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-o", agent, "./cmd/hyperfleet-agent")
	build.Dir, build.Env = testenv.RepoRoot(), append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	o := devenv.Options{Dir: filepath.Join(dir, "world"), AgentBinary: agent, Progress: testWriter{t},
		Install: true, ExternalOperator: true, SimulatorAdmin: true, GitLab: opts.receiver == "gitlab"}
	if opts.receiver == "buildkite" {
		o.Buildkite, o.BuildkiteAgentBinary = true, buildkitesimtest.AgentBinary(t)
	}
	w, err := devenv.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	in := w.OperatorInputs()
	app, err := w.InstallApp()
	if err != nil {
		t.Fatal(err)
	}

	// Step 1's registry.
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(reg.Close)
	regHost := strings.TrimPrefix(reg.URL, "http://")
	registries := filepath.Join(dir, "registries.conf")
	if err := os.WriteFile(registries, fmt.Appendf(nil, "[[registry]]\nlocation = %q\ninsecure = true\n", regHost), 0o600); err != nil {
		t.Fatal(err)
	}
	pm := newPodman(t)
	pm.env = append(pm.env, "CONTAINERS_REGISTRIES_CONF="+registries)

	ports := freePorts(t, 3)
	webhookAddr := ""
	var webhook values
	switch opts.receiver {
	case "github":
		// Step 3, in GitHub's UI: the App's webhook, to the receiver
		// step 4 installs.
		webhookAddr = ports[2]
		webhook = values{"port": portOf(t, webhookAddr), "apiHost": in.GitHubAPIHost}
		if err := w.PointWebhook("https://" + webhookAddr + "/webhooks/github"); err != nil {
			t.Fatal(err)
		}
	case "gitlab":
		// The group's Job Hook (the page's own apiHost names the
		// simulator's host, as a reader's names theirs).
		webhookAddr = ports[2]
		webhook = values{"port": portOf(t, webhookAddr)}
		if err := w.PointGitLabWebhook("https://" + webhookAddr); err != nil {
			t.Fatal(err)
		}
	case "buildkite":
		// In Buildkite: the queue the sample pool serves, and the
		// notification service. The simulator stands in for Buildkite's
		// public API, whose host the receiver takes by default.
		if _, err := w.Buildkite.Sim.CreateQueue(w.Buildkite.ClusterID, "linux"); err != nil {
			t.Fatal(err)
		}
		webhookAddr = ports[2]
		webhook = values{"port": portOf(t, webhookAddr), "buildkite": values{"apiHost": apiHostOf(t, w.Buildkite.URL)}}
		if err := w.PointBuildkiteWebhook("https://" + webhookAddr); err != nil {
			t.Fatal(err)
		}
	}
	tools := docsTools{
		helmValues: worldValues(t, dir, in, ports[0], ports[1], webhookAddr, webhook), helmObjects: filepath.Join(dir, "world-objects.yaml"),
		pveumURL: strings.TrimSuffix(w.ProxmoxURL, "/api2/json") + "/_sim/pveum", pveumFingerprint: w.ProxmoxFingerprint(),
	}
	sh := &docsShell{t: t, env: append(pm.env,
		"PATH="+tools.path(t, dir)+":"+os.Getenv("PATH"),
		"KUBECONFIG="+w.KubeconfigPath,
		// Step 3's values, as the reader keeps them.
		"GITHUB_WEBHOOK_SECRET="+w.WebhookSecret(),
		fmt.Sprintf("APP_ID=%d", app.ID), fmt.Sprintf("INSTALLATION_ID=%d", app.InstallationID),
	)}
	pairs := []string{
		"registry.example.com", regHost,
		"--cert=webhook.crt --key=webhook.key", "--cert=" + in.WebhookCertFile + " --key=" + in.WebhookKeyFile,
		"--from-file=private-key=app.private-key.pem", "--from-file=private-key=" + app.PrivateKeyFile,
	}
	if w.GitLab != nil {
		// The reader's GitLab: its host, its group's key, its tokens.
		pairs = append(pairs, "gitlab.example.com", apiHostOf(t, w.GitLab.URL), "owner.acme..platform", "owner."+devenv.GitLabGroup)
		sh.setenv("GITLAB_HOOK_TOKEN", w.GitLabWebhookToken())
		sh.setenv("GITLAB_TOKEN", devenv.GitLabToken)
	}
	if w.Buildkite != nil {
		// The reader's organization and tokens.
		pairs = append(pairs, "owner.acme=", "owner."+devenv.BuildkiteOrganization+"=")
		sh.setenv("BUILDKITE_WEBHOOK_TOKEN", w.BuildkiteWebhookToken())
		sh.setenv("BUILDKITE_API_TOKEN", devenv.BuildkiteAPIToken)
	}
	for sample, edited := range editSamples(t, dir, w) {
		pairs = append(pairs, sample, edited)
	}
	sh.replace = strings.NewReplacer(pairs...)
	apiURL, err := url.Parse(w.API.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{reader: w.API.Client, apiHost: apiURL.Hostname(), apiPort: apiURL.Port(), caPEM: w.API.Config.CAData, dir: filepath.Join(dir, "kubelet")}
	return &docsWorld{t: t, w: w, pm: pm, sh: sh, k: k, image: regHost + "/hyperfleet/hyperfleet:v0.1.0"}
}

// runBlocks runs blocks in order. Before a helm install it starts the
// stand-in for the kubelet and the Deployment controller (the install
// waits for the pod) and removes the pushed image's local copy, so that
// the pod pulls it from the registry; after pveum's token add it sets
// PVE_TOKEN_SECRET from what it printed, as the reader copies it.
func (d *docsWorld) runBlocks(ctx context.Context, blocks []docblocks.Block) {
	t := d.t
	t.Helper()
	for _, b := range blocks {
		runCtx := ctx
		if strings.Contains(b.Text, "helm install") {
			if _, err := d.pm.run(ctx, "image", "rm", d.image); err != nil {
				t.Fatalf("remove the local copy of the pushed image: %v", err)
			}
			// Registered before the rollout's, so run after it: the pod
			// is gone, then the copy it pulled (its registry's port names
			// it, so each run would leave one more tag of the image).
			t.Cleanup(func() {
				if _, err := d.pm.run(context.Background(), "image", "rm", d.image); err != nil {
					t.Logf("remove the pulled image: %v", err)
				}
			})
			d.ro, runCtx = startRollout(ctx, t, d.pm, d.w.API.Client, d.w.API.Config, d.k,
				client.ObjectKey{Namespace: devenv.SystemNamespace, Name: deploymentName})
		}
		out, err := d.sh.try(runCtx, b)
		if err != nil {
			t.Fatalf("%v\n%s", err, d.state(ctx))
		}
		if strings.Contains(b.Text, "pveum user token add") {
			m := tokenValueRE.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("%s printed no token secret:\n%s", b, out)
			}
			d.sh.setenv("PVE_TOKEN_SECRET", m[1])
		}
	}
	if d.ro == nil {
		t.Fatal("no block runs helm install")
	}
	if err := d.ro.failure(); err != nil {
		t.Fatalf("the rollout: %v", err)
	}
}

// state is what a person reads first when a page's step fails: the
// conditions of every HyperFleet object and the events of the namespaces
// the pages use.
func (d *docsWorld) state(ctx context.Context) string {
	var b strings.Builder
	c := d.w.API.Client
	var clusters hfv1.HypervisorClusterList
	var templates hfv1.HypervisorMachineTemplateList
	var pools hfv1.RunnerPoolList
	for _, l := range []client.ObjectList{&clusters, &templates, &pools} {
		if err := c.List(ctx, l); err != nil {
			fmt.Fprintf(&b, "list %T: %v\n", l, err)
		}
	}
	var objs []conditioned
	for i := range clusters.Items {
		objs = append(objs, &clusters.Items[i])
	}
	for i := range templates.Items {
		objs = append(objs, &templates.Items[i])
	}
	for i := range pools.Items {
		objs = append(objs, &pools.Items[i])
	}
	for _, o := range objs {
		fmt.Fprintf(&b, "%T %s/%s:\n", o, o.GetNamespace(), o.GetName())
		for _, cond := range o.GetConditions() {
			fmt.Fprintf(&b, "  %s=%s %s: %s\n", cond.Type, cond.Status, cond.Reason, cond.Message)
		}
	}
	b.WriteString(eventdump.Format(ctx, c, nil, "ci", devenv.SystemNamespace, "default"))
	return b.String()
}

// waitSamplesReady waits for the samples' cluster, the template named
// template and the pool named pool to report Ready (the pool its scope
// verified too).
func (d *docsWorld) waitSamplesReady(ctx context.Context, template, pool string) {
	d.waitReady(ctx, &hfv1.HypervisorCluster{}, client.ObjectKey{Name: "proxmox-prod"}, hfv1.ReadyCondition)
	d.waitReady(ctx, &hfv1.HypervisorMachineTemplate{}, client.ObjectKey{Namespace: "ci", Name: template}, hfv1.ReadyCondition)
	key := client.ObjectKey{Namespace: "ci", Name: pool}
	d.waitReady(ctx, &hfv1.RunnerPool{}, key, hfv1.RunnerPoolScopeVerifiedCondition)
	d.waitReady(ctx, &hfv1.RunnerPool{}, key, hfv1.ReadyCondition)
}

// runJob queues a workflow job of the samples' repository with labels and
// waits until it succeeded on a runner whose name starts with
// runnerPrefix (a fresh VM of the pool: runners are named after their
// claims), made with step 2's token.
func (d *docsWorld) runJob(ctx context.Context, labels []string, runnerPrefix string) {
	t := d.t
	t.Helper()
	job, err := d.w.GitHub.EnqueueJob(githubsim.JobRequest{Repository: devenv.InstallRepository, Labels: labels, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d.waitJob(ctx, "GitHub", func() (string, string, bool) {
		j, _ := d.w.GitHub.Job(job.ID)
		if j.Status == "completed" && (j.Conclusion != "success" || !strings.HasPrefix(j.RunnerName, runnerPrefix)) {
			t.Fatalf("the job ended %s on runner %q, want success on a runner named %s...", j.Conclusion, j.RunnerName, runnerPrefix)
		}
		return j.Status, "runner " + j.RunnerName, j.Status == "completed"
	})
}

// waitJob polls a platform's job until poll says it passed (then the
// VMs must have been made with step 2's token), failing when it reaches
// one of the failed states or five minutes pass, with the manager's log.
func (d *docsWorld) waitJob(ctx context.Context, platform string, poll func() (state, ranOn string, passed bool), failed ...string) {
	t := d.t
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		state, ranOn, passed := poll()
		if passed {
			t.Logf("the %s job ran on %s", platform, ranOn)
			break
		}
		if slices.Contains(failed, state) || time.Now().After(deadline) {
			t.Fatalf("the %s job is %s; manager log:\n%s", platform, state, tail(d.pm.logs(ctx, d.ro.container()), 60))
		}
		time.Sleep(time.Second)
	}
	checkOperatorToken(t, d.w)
}

// checkRunBy fails for a block whose mark names a test that does not
// exist: the block would run nowhere.
func checkRunBy(t *testing.T, blocks []docblocks.Block) {
	t.Helper()
	var sources bytes.Buffer
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "test", "*", "*_test.go"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sources.Write(b)
	}
	for _, b := range blocks {
		if b.RunBy != "" && !bytes.Contains(sources.Bytes(), []byte("func "+b.RunBy+"(t *testing.T)")) {
			t.Errorf("%s is marked run-by %s, which no test under test/ defines", b, b.RunBy)
		}
	}
}

// docsTools are the commands the pages run that are not on this
// machine's PATH: kubectl and kustomize (hack/envtest builds them), helm
// (the real one, behind a wrapper that adds a world's values), and pveum
// (this test binary, speaking to a Proxmox simulator's admin API).
type docsTools struct {
	// helmValues, when set, is a values file helm install and upgrade
	// get last (they win over the reader's); helmObjects, when set, is
	// applied into the release's namespace before.
	helmValues, helmObjects string
	// pveumURL is the simulator's /_sim/pveum, pveumFingerprint its
	// certificate's; no pveum without them.
	pveumURL, pveumFingerprint string
}

// path makes a directory of the tools under dir and returns it.
func (d docsTools) path(t *testing.T, dir string) string {
	t.Helper()
	assets, err := testenv.AssetsDir()
	if err != nil {
		t.Fatal(err)
	}
	helm, err := testenv.HelmPath()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"kubectl", "kustomize"} {
		if _, err := os.Stat(filepath.Join(assets, tool)); err != nil {
			t.Fatalf("%s is not in %s (hack/envtest/build.sh builds it): %v", tool, assets, err)
		}
		if err := os.Symlink(filepath.Join(assets, tool), filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	// helm with a configuration of its own.
	wrapper := fmt.Sprintf("#!/bin/sh\nexport HELM_CACHE_HOME=%[1]q/cache HELM_CONFIG_HOME=%[1]q/config HELM_DATA_HOME=%[1]q/data\n", filepath.Join(dir, "helm"))
	if d.helmValues != "" {
		wrapper += "case \"$1\" in\ninstall|upgrade)\n"
		if d.helmObjects != "" {
			wrapper += fmt.Sprintf(`	ns=default prev=
	for a in "$@"; do
		case "$prev" in --namespace|-n) ns=$a ;; esac
		case "$a" in --namespace=*) ns=${a#--namespace=} ;; esac
		prev=$a
	done
	kubectl -n "$ns" apply -f %q >&2 || exit 1
`, d.helmObjects)
		}
		wrapper += fmt.Sprintf("\texec %q \"$@\" --values %q ;;\nesac\n", helm, d.helmValues)
	}
	wrapper += fmt.Sprintf("exec %q \"$@\"\n", helm)
	scripts := map[string]string{"helm": wrapper}
	if d.pveumURL != "" {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		scripts["pveum"] = fmt.Sprintf("#!/bin/sh\n%s=%q %s=%q exec %q \"$@\"\n", pveumURLEnv, d.pveumURL, pveumFingerprintEnv, d.pveumFingerprint, self)
	}
	for name, s := range scripts {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(s), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// worldValues writes the values the helm wrapper adds and the ConfigMap it
// applies (world-objects.yaml, beside the values), and returns the values
// file; webhookAddr is empty for an install without a receiver.
func worldValues(t *testing.T, dir string, in devenv.OperatorInputs, metricsAddr, probeAddr, webhookAddr string, webhook values) string {
	t.Helper()
	ca, err := os.ReadFile(in.GitHubCAFile)
	if err != nil {
		t.Fatal(err)
	}
	objects, err := yaml.Marshal(map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "hyperfleet-trusted-ca"}, "data": map[string]string{"simulators-ca.crt": string(ca)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "world-objects.yaml"), objects, 0o600); err != nil {
		t.Fatal(err)
	}
	v := values{
		"metrics":   values{"port": portOf(t, metricsAddr)},
		"probePort": portOf(t, probeAddr),
		"extraArgs": []string{
			"--metrics-bind-address=" + metricsAddr,
			"--health-probe-bind-address=" + probeAddr,
		},
		"config": values{
			"runnerpool-resync-interval": in.ResyncInterval.String(),
			"orphan-sweep-interval":      in.SweepInterval.String(),
			"claim-max-retry-delay":      in.MaxRetryDelay.String(),
		},
	}
	if webhookAddr != "" {
		// The receiver's listener flag would turn the receiver on in a
		// mode without one.
		v["webhook"] = webhook
		v["extraArgs"] = append(v["extraArgs"].([]string), "--webhook-bind-address="+webhookAddr)
	}
	data, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "world-values.yaml")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// editSamples makes the edits step 5's comments ask for in copies of the
// samples it applies, and returns each sample's path (from the
// repository's root, as the page names it) with its copy's: the cluster's
// endpoint, fingerprint and nodes (the simulator's), its tenancy's API
// hosts (the GitHub simulator's, which stands in for api.github.com) and no
// spire section (the world runs no SPIRE server, so the page says to
// remove it); the template's GitHub API URL and runner package (the
// simulator's, which serves its own runner package, hence another
// SHA-256).
func editSamples(t *testing.T, dir string, w *devenv.World) map[string]string {
	t.Helper()
	pkg, err := githubsim.RunnerPackage(w.SimulatorCA())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(pkg)
	gh, err := url.Parse(w.GitHubURL)
	if err != nil {
		t.Fatal(err)
	}
	// The simulators stand in for api.github.com (and a self-managed
	// GitLab): the hosts the tenancy's entries allow.
	apiHosts := []any{gh.Host}
	var nodes []any
	for _, n := range w.Proxmox.State().Nodes {
		nodes = append(nodes, n.Name)
	}
	edits := map[string]func(u *unstructured.Unstructured){
		"config/samples/hyperfleet_v1alpha1_hypervisorcluster_token.yaml": func(u *unstructured.Unstructured) {
			set(t, u, w.ProxmoxURL, "spec", "endpoint")
			set(t, u, w.ProxmoxFingerprint(), "spec", "tls", "fingerprintSHA256")
			set(t, u, nodes, "spec", "nodes")
			unstructured.RemoveNestedField(u.Object, "spec", "spire")
			tenancy, _, _ := unstructured.NestedSlice(u.Object, "spec", "tenancy")
			for _, e := range tenancy {
				e.(map[string]any)["apiHosts"] = apiHosts
			}
			set(t, u, tenancy, "spec", "tenancy")
		},
		"config/samples/hyperfleet_v1alpha1_hypervisormachinetemplate_app.yaml": func(u *unstructured.Unstructured) {
			set(t, u, w.GitHubURL+"/api/v3", "spec", "bootstrap", "github", "apiBaseURL")
			set(t, u, w.GitHubURL+"/_sim/runner/actions-runner-{os}-{arch}-2.321.0.tar.gz", "spec", "bootstrap", "github", "runner", "downloadURL")
			set(t, u, hex.EncodeToString(sum[:]), "spec", "bootstrap", "github", "runner", "downloadSHA256")
		},
		"config/samples/hyperfleet_v1alpha1_runnerpool_repo.yaml": func(*unstructured.Unstructured) {},
	}
	if w.Buildkite != nil {
		// The reader's organization and cluster; the simulator's API
		// and agent endpoints stand in for Buildkite's, and its agent is
		// downloaded (the sample's path names one in the image).
		bk, err := w.BuildkiteAgent()
		if err != nil {
			t.Fatal(err)
		}
		apiHosts = append(apiHosts, apiHostOf(t, w.Buildkite.URL))
		edits["config/samples/hyperfleet_v1alpha1_hypervisormachinetemplate_buildkite.yaml"] = func(u *unstructured.Unstructured) {
			set(t, u, bk.Organization, "spec", "bootstrap", "buildkite", "organization")
			set(t, u, bk.Cluster, "spec", "bootstrap", "buildkite", "cluster")
			set(t, u, bk.APIURL, "spec", "bootstrap", "buildkite", "apiURL")
			set(t, u, bk.AgentEndpoint, "spec", "bootstrap", "buildkite", "agentEndpoint")
			unstructured.RemoveNestedField(u.Object, "spec", "bootstrap", "buildkite", "agent", "path")
			set(t, u, bk.Agent.DownloadURL, "spec", "bootstrap", "buildkite", "agent", "downloadURL")
			set(t, u, bk.Agent.DownloadSHA256, "spec", "bootstrap", "buildkite", "agent", "downloadSHA256")
		}
	}
	if gl := w.GitLab; gl != nil {
		// The reader's GitLab and group; the runner is the simulator's
		// stand-in, downloaded (the sample's path names one in the
		// image).
		_, runnerSum := gitlabsim.RunnerStandIn()
		apiHosts = append(apiHosts, apiHostOf(t, gl.URL))
		edits["config/samples/hyperfleet_v1alpha1_hypervisormachinetemplate_gitlab.yaml"] = func(u *unstructured.Unstructured) {
			set(t, u, gl.URL, "spec", "bootstrap", "gitlab", "url")
			set(t, u, devenv.GitLabGroup, "spec", "bootstrap", "gitlab", "group")
			unstructured.RemoveNestedField(u.Object, "spec", "bootstrap", "gitlab", "runner", "path")
			set(t, u, gl.URL+"/_sim/gitlab-runner/gitlab-runner-{os}-{arch}", "spec", "bootstrap", "gitlab", "runner", "downloadURL")
			set(t, u, runnerSum, "spec", "bootstrap", "gitlab", "runner", "downloadSHA256")
		}
	}
	out := map[string]string{}
	for sample, edit := range edits {
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), sample))
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			t.Fatalf("%s: %v", sample, err)
		}
		edit(u)
		data, err := yaml.Marshal(u.Object)
		if err != nil {
			t.Fatal(err)
		}
		edited := filepath.Join(dir, "samples", filepath.Base(sample))
		if err := os.MkdirAll(filepath.Dir(edited), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(edited, data, 0o600); err != nil {
			t.Fatal(err)
		}
		out[sample] = edited
	}
	return out
}

// apiHostOf is the host:port of a base URL.
func apiHostOf(t *testing.T, base string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

func set(t *testing.T, u *unstructured.Unstructured, v any, path ...string) {
	t.Helper()
	if err := unstructured.SetNestedField(u.Object, v, path...); err != nil {
		t.Fatalf("%s: set %s: %v", u.GetName(), strings.Join(path, "."), err)
	}
}

// conditioned is an object with status conditions (every HyperFleet kind).
type conditioned interface {
	client.Object
	GetConditions() []metav1.Condition
}

// waitReady waits until obj's condition is True, failing with the
// object's conditions after two minutes.
func (d *docsWorld) waitReady(ctx context.Context, obj conditioned, key client.ObjectKey, condition hfv1.ConditionType) {
	t, c := d.t, d.w.API.Client
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := c.Get(ctx, key, obj)
		if err == nil && meta.IsStatusConditionTrue(obj.GetConditions(), string(condition)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%T %s is not %s after 2 minutes (err %v)\n%s", obj, key, condition, err, d.state(ctx))
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkOperatorToken: the VMs were made with the token step 2 created
// (each task is its user's), not with the simulator's root token.
func checkOperatorToken(t *testing.T, w *devenv.World) {
	t.Helper()
	var users []string
	for _, task := range w.Proxmox.State().Tasks {
		// UPID:node:pid:pstart:starttime:type:id:user:
		if f := strings.Split(task.UPID, ":"); task.Type == "qmclone" && len(f) > 7 {
			users = append(users, f[7])
		}
	}
	if len(users) == 0 {
		t.Fatal("the Proxmox simulator has no clone task")
	}
	for _, u := range users {
		if u != "hyperfleet@pve!operator" {
			t.Fatalf("a clone ran as %s, not as step 2's token hyperfleet@pve!operator: %v", u, users)
		}
	}
}

// bareAPIServer is an API server of the test's own with no CRD installed
// (the chart or kustomize installs them), stopped when the test ends.
func bareAPIServer(t *testing.T) *testenv.Environment {
	t.Helper()
	env, err := testenv.StartWithoutCRDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env
}
