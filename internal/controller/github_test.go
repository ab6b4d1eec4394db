package controller_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

const (
	testGitHubPAT     = "ghp_longLivedPATthatMustNeverLeaveTheOperator"
	testGitHubAppID   = 31337
	testGitHubInstall = 4242
)

var testAppKey = func() githubsim.AppKey {
	k, err := githubsim.NewAppKey()
	if err != nil {
		panic(err)
	}
	return k
}()

func startGitHub(t *testing.T) *githubsimtest.Server {
	t.Helper()
	return githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: testGitHubPAT, Login: "octocat"}},
		Apps: []githubsim.AppConfig{{ID: testGitHubAppID, PublicKey: testAppKey.PublicPEM, Installations: []githubsim.InstallationConfig{
			{ID: testGitHubInstall, Account: "octo-org"},
		}}},
		// As in the other suites: a runner script starved of CPU on a
		// loaded CI machine must not lose its session (and its job).
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	})
}

// startSimCapturingSeeds starts a Proxmox simulator whose guests copy the
// cloud-init they boot with into dir/<vmid>, as a VM's cloud-init would
// read it.
func startSimCapturingSeeds(t *testing.T, dir string, mutate ...func(*proxmoxsim.Config)) *simulator {
	t.Helper()
	return startSim(t, func(c *proxmoxsim.Config) {
		for _, m := range mutate {
			m(c)
		}
		// The mkdir stands in for cloud-init's bootcmd: the directory the
		// operator places a VM's join token in (agentconfig.SecretsDir).
		c.Guest.Command = []string{"sh", "-c", `cp -r "$` + proxmoxsim.EnvSeedDir + `" "` + dir + `/$` + proxmoxsim.EnvVMID + `"; ` +
			`mkdir -m 0700 "$` + proxmoxsim.EnvVMDir + `/root` + agentconfig.SecretsDir + `"; sleep 3600`}
	})
}

// useGitHub points the fixture's template at the GitHub simulator.
func (f *fixture) useGitHub(gs *githubsimtest.Server, mutate func(*hfv1.Bootstrap)) {
	f.t.Helper()
	var tmpl hfv1.HypervisorMachineTemplate
	err := retry.RetryOnConflict(conflictRetry, func() error {
		if err := env.Client.Get(f.ctx, client.ObjectKeyFromObject(f.template), &tmpl); err != nil {
			return err
		}
		tmpl.Spec.Bootstrap.GitHub.APIBaseURL = gs.URL + "/api/v3"
		if mutate != nil {
			mutate(&tmpl.Spec.Bootstrap)
		}
		return env.Client.Update(f.ctx, &tmpl)
	})
	if err != nil {
		f.t.Fatal(err)
	}
	f.template = &tmpl
}

// seedAgentConfig reads the agent config a VM booted with.
func seedAgentConfig(t *testing.T, dir string, vmid int32) map[string]any {
	t.Helper()
	var userData []byte
	eventually(t, 30*time.Second, "the guest's cloud-init captured", func() error {
		var err error
		userData, err = os.ReadFile(filepath.Join(dir, strconv.Itoa(int(vmid)), "user-data"))
		return err
	})
	var doc struct {
		WriteFiles []struct {
			Path    string `json:"path"`
			Content string `json:"content"`
		} `json:"write_files"`
	}
	if err := yaml.Unmarshal(userData, &doc); err != nil {
		t.Fatalf("the VM's user-data is not YAML: %v", err)
	}
	var cfg map[string]any
	for _, f := range doc.WriteFiles {
		if f.Path == "/etc/hyperfleet/agent.json" {
			if err := json.Unmarshal([]byte(f.Content), &cfg); err != nil {
				t.Fatalf("agent config is not JSON: %v\n%s", err, f.Content)
			}
		}
	}
	if cfg == nil {
		t.Fatalf("no agent config in the VM's user-data:\n%s", userData)
	}
	return cfg
}

// TestGitHubJITRunner: a claim's VM receives a JIT configuration that
// registers exactly its runner; a busy runner keeps its VM when the claim
// is deleted, and the runner is gone from GitHub with the claim. No PAT,
// App key or installation token reaches the VM, the logs or the events.
func TestGitHubJITRunner(t *testing.T) {
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds)
	gs := startGitHub(t)
	op := startOperator(t, operatorOptions{github: gs.Transport})
	f := newFixture(t, sim, nil)
	f.useGitHub(gs, nil)
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "gh-runner"},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}, WorkloadConfig: &hfv1.WorkloadConfig{
			Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{Labels: []string{"gpu"}},
		}},
	}
	f.create(claim)
	got := waitDelivered(t, claim, 60*time.Second)
	bs := got.Status.Bootstrap
	// The default name, marked as this install's for the orphan sweep.
	wantName := testSigner.RunnerName("gh-runner-" + strings.ReplaceAll(string(got.UID), "-", "")[:8])
	if bs == nil || bs.RunnerName != wantName || bs.RunnerID == 0 || bs.CredentialIssuedAt == nil {
		t.Fatalf("status.bootstrap = %+v, want runner %s with an id", bs, wantName)
	}
	r, ok := gs.Sim.RunnerByName(wantName)
	if !ok || r.ID != bs.RunnerID || r.Scope != "octo-org" || !r.JIT {
		t.Fatalf("GitHub runner = %+v, %v", r, ok)
	}
	if want := "self-hosted,Linux,X64,hyperfleet,gpu"; strings.Join(r.Labels, ",") != want {
		t.Errorf("runner labels %v, want %s", r.Labels, want)
	}

	// The running VM received exactly that runner's JIT configuration,
	// through its guest agent; its seed holds none.
	agent := seedAgentConfig(t, seeds, got.Status.VMRef.VMID)
	jit := placedSecrets(t, sim, got).JITConfig
	files := map[string]string{}
	raw, err := base64.StdEncoding.DecodeString(jit)
	if err != nil || json.Unmarshal(raw, &files) != nil {
		t.Fatalf("agent jitConfig is not an encoded JIT configuration: %q", jit)
	}
	runnerFile, _ := base64.StdEncoding.DecodeString(files[".runner"])
	if !strings.Contains(string(runnerFile), fmt.Sprintf(`"agentId": %d`, bs.RunnerID)) {
		t.Errorf(".runner of the VM's JIT config is for another runner:\n%s", runnerFile)
	}
	if agent["bootstrapMethod"] != "jit-config" || agent["registrationToken"] != nil || agent["jitConfig"] != nil || agent["secretsFile"] != agentconfig.SecretsFile {
		t.Errorf("agent config: %+v", agent)
	}
	assertNoGitHubSecrets(t, sim, op, seeds, jit)
	assertNoCanaries(t, canaryWorld{sim: sim, gs: gs, op: op, seeds: seeds}, jit)

	// The VM runs the runner (here on the host, from the VM's config); a
	// claim deleted while its runner is busy keeps the VM until the job
	// ends, then the VM and the runner go.
	proc := githubsimtest.StartScript(t, gs.InstallRunner(t), "run.sh", "--jitconfig", jit)
	job, err := gs.Sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "gpu"}, Duration: 6 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the VM's runner takes the job", func() error {
		if j, _ := gs.Sim.Job(job.ID); j.Status != "in_progress" || j.RunnerName != wantName {
			return fmt.Errorf("job %+v", j)
		}
		return nil
	})
	if err := env.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	draining := waitPhase(t, claim, hfv1.MachineClaimDraining, 20*time.Second)
	if c := findCondition(draining, string(hfv1.ReadyCondition)); c == nil || c.Reason != string(hfv1.RunnerBusyReason) {
		t.Errorf("Ready condition of a draining claim = %+v", c)
	}
	if vm := findVM(t, sim, int(got.Status.VMRef.VMID)); vm.Status != "running" {
		t.Fatalf("the VM of a busy runner is %s", vm.Status)
	}
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("run.sh exited %d:\n%s", code, proc.Output())
	}
	eventually(t, 60*time.Second, "claim gone after the job", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Errorf("VMs left: %+v", vms)
	}
	if r, ok := gs.Sim.RunnerByName(wantName); ok && !r.Removed {
		t.Errorf("runner still registered: %+v", r)
	}
	if j, _ := gs.Sim.Job(job.ID); j.Status != "completed" || j.Conclusion != "success" {
		t.Errorf("the job was not left to finish: %+v", j)
	}
	assertNoGitHubSecrets(t, sim, op, seeds, jit)
	assertNoCanaries(t, canaryWorld{sim: sim, gs: gs, op: op, seeds: seeds}, jit)
}

// TestGitHubAppRegistrationToken: an App-authenticated template in
// runner-token mode hands the VM a registration token and the runner URL,
// never the App's key or installation token; deleting the claim removes
// nothing it did not register.
func TestGitHubAppRegistrationToken(t *testing.T) {
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds)
	gs := startGitHub(t)
	op := startOperator(t, operatorOptions{github: gs.Transport})
	f := newFixture(t, sim, nil)
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "github-app"},
		StringData: map[string]string{"app-id": strconv.Itoa(testGitHubAppID), "installation-id": strconv.Itoa(testGitHubInstall), "key": string(testAppKey.PrivatePEM)},
	})
	f.useGitHub(gs, func(b *hfv1.Bootstrap) {
		b.Method = hfv1.BootstrapRunnerToken
		b.GitHub.Organization, b.GitHub.Repository = "", "app"
		b.GitHub.RunnerURLs = &hfv1.ScopedURLs{Repository: gs.URL + "/{owner}/{repo}"}
		b.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{
			AppID:          hfv1.LocalSecretKeySelector{Name: "github-app", Key: "app-id"},
			InstallationID: hfv1.LocalSecretKeySelector{Name: "github-app", Key: "installation-id"},
			PrivateKey:     hfv1.LocalSecretKeySelector{Name: "github-app", Key: "key"},
		}}
	})
	claim := f.newClaim("rt-runner")
	got := waitDelivered(t, claim, 60*time.Second)
	bs := got.Status.Bootstrap
	if bs == nil || bs.RunnerID != 0 || bs.CredentialExpiresAt == nil || bs.CredentialExpiresAt.Time.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("status.bootstrap = %+v", bs)
	}
	agent := seedAgentConfig(t, seeds, got.Status.VMRef.VMID)
	placed := placedSecrets(t, sim, got)
	token := placed.RegistrationToken
	if token == "" || placed.RegistrationURL != gs.URL+"/octo-org/app" || agent["registrationURL"] != gs.URL+"/octo-org/app" ||
		agent["jitConfig"] != nil || agent["registrationToken"] != nil || placed.JITConfig != "" {
		t.Fatalf("agent config: %+v; placed in the VM: a token %v, URL %s", agent, token != "", placed.RegistrationURL)
	}
	// The token registers the VM's runner with the package's config.sh.
	dir := gs.InstallRunner(t)
	proc := githubsimtest.StartScript(t, dir, "config.sh", "--url", gs.URL+"/octo-org/app", "--token", token, "--ephemeral", "--unattended",
		"--name", bs.RunnerName, "--labels", "hyperfleet", "--work", "_work", "--disableupdate")
	if code := proc.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("config.sh exited %d:\n%s", code, proc.Output())
	}
	assertNoGitHubSecrets(t, sim, op, seeds, token)
	assertNoCanaries(t, canaryWorld{sim: sim, gs: gs, op: op, seeds: seeds}, token)
	if err := env.Client.Delete(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "claim gone", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if r, ok := gs.Sim.RunnerByName(bs.RunnerName); ok && !r.Removed {
		t.Errorf("runner registered with the claim's token is still there: %+v", r)
	}
}

// placedSecrets waits for the secrets the operator places in the claim's
// running VM through its guest agent.
func placedSecrets(t *testing.T, sim *simulator, claim *hfv1.MachineClaim) agentconfig.GuestSecrets {
	t.Helper()
	var doc agentconfig.GuestSecrets
	eventually(t, 30*time.Second, "the VM's secrets placed", func() error {
		b, _, err := sim.GuestFile(context.Background(), int(claim.Status.VMRef.VMID), agentconfig.SecretsFile)
		if err != nil {
			return err
		}
		doc, err = agentconfig.ParseGuestSecrets(b)
		return err
	})
	return doc
}

// assertNoGitHubSecrets: no long-lived GitHub credential (PAT, App key,
// installation token) is in anything destined for a VM (the cloud-init the
// guests booted with, the Proxmox simulator's state), the operator's logs,
// events or claims; the single-use credential is in none of them either,
// the VM's cloud-init included: it reaches the running VM only.
func assertNoGitHubSecrets(t *testing.T, sim *simulator, op *operator, seeds, singleUse string) {
	t.Helper()
	assertNoSecrets(t, sim, op, singleUse)
	keyBody := strings.Join(strings.Split(string(testAppKey.PrivatePEM), "\n")[2:5], "\n")
	seedText := ""
	_ = filepath.Walk(seeds, func(p string, info os.FileInfo, err error) error {
		if err == nil && !info.IsDir() {
			b, _ := os.ReadFile(p)
			seedText += string(b)
		}
		return nil
	})
	var claims hfv1.MachineClaimList
	if err := env.Client.List(context.Background(), &claims); err != nil {
		t.Fatal(err)
	}
	claimsJSON, _ := json.Marshal(claims.Items)
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events); err != nil {
		t.Fatal(err)
	}
	eventsJSON, _ := json.Marshal(events.Items)
	places := map[string]string{
		"VM cloud-init": seedText, "Proxmox simulator state": fmt.Sprintf("%+v", sim.State()),
		"operator log": op.logs.String(), "events": string(eventsJSON), "claims": string(claimsJSON),
	}
	for where, text := range places {
		for what, s := range map[string]string{"the PAT": testGitHubPAT, "the App private key": keyBody} {
			if strings.Contains(text, s) {
				t.Errorf("%s found in %s", what, where)
			}
		}
		// Installation tokens are ghs_ followed by 36 characters.
		if m := regexp.MustCompile(`ghs_[A-Za-z0-9]{20,}`).FindString(text); m != "" {
			t.Errorf("an installation token (%s…) found in %s", m[:8], where)
		}
		if strings.Contains(text, singleUse) {
			t.Errorf("the VM's single-use credential found in %s", where)
		}
	}
}

func findCondition(c *hfv1.MachineClaim, typ string) *metav1.Condition {
	for i := range c.Status.Conditions {
		if c.Status.Conditions[i].Type == typ {
			return &c.Status.Conditions[i]
		}
	}
	return nil
}
