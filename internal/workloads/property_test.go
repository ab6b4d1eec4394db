package workloads

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// apiServer is started by the first test that needs the API server's own
// validation and defaulting; the package's other tests run without it.
var apiServer testenv.Lazy

func TestMain(m *testing.M) { os.Exit(apiServer.Main(m)) }

// runnerConfigWorld is what every case of TestRunnerConfigurationProperty
// shares: the real API server, one namespace with the PAT's Secret, a
// HypervisorCluster, and the GitHub simulator with an organization (two
// runner groups besides Default) and one of its repositories.
type runnerConfigWorld struct {
	c         client.Client
	ns        string
	gs        *githubsimtest.Server
	platforms *Platforms
	signer    *ownership.Signer
}

const (
	p12Org  = "octo-org"
	p12Repo = "app"
	p12PAT  = "ghp_property12RunnerConfiguration"
)

// p12Groups are the organization's runner groups by name (Default is 1).
var p12Groups = map[string]int64{"Default": 1, "hyperfleet": 2, "large runners": 3}

func newRunnerConfigWorld(t *testing.T) *runnerConfigWorld {
	t.Helper()
	env := apiServer.Get(t)
	ctx := context.Background()
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: p12Org, RunnerGroups: []githubsim.RunnerGroupConfig{
			{ID: p12Groups["hyperfleet"], Name: "hyperfleet"}, {ID: p12Groups["large runners"], Name: "large runners"},
		}}},
		Repositories: []githubsim.RepoConfig{{Name: p12Org + "/" + p12Repo}},
		PATs:         []githubsim.PATConfig{{Token: p12PAT, Login: "octocat"}},
	})
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "p12-"}}
	if err := env.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "github-pat"}, Data: map[string][]byte{"token": []byte(p12PAT)}}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{GenerateName: "p12-"}}
	cluster.Spec.Provider = "proxmox"
	cluster.Spec.Endpoint = "https://pve.example.com:8006/api2/json"
	cluster.Spec.Credentials.TokenID = &hfv1.SecretKeySelector{Name: "pve", Namespace: ns.Name, Key: "id"}
	cluster.Spec.Credentials.TokenSecret = &hfv1.SecretKeySelector{Name: "pve", Namespace: ns.Name, Key: "secret"}
	if err := env.Client.Create(ctx, cluster); err != nil {
		t.Fatalf("HypervisorCluster: %v", err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), cluster) })
	signer := testobjects.Signer(t)
	return &runnerConfigWorld{
		c: env.Client, ns: ns.Name, gs: gs, signer: signer,
		platforms: &Platforms{Client: env.Client, Backends: githubsimtest.Backends(t, gs.Transport), Signer: signer},
	}
}

// runnerConfigCase is one generated pool and its template: the runner
// settings a RunnerPool (and the template it leaves the rest to) gives,
// and at most one of them made invalid.
type runnerConfigCase struct {
	orgTemplate bool   // the template's scope: the organization, else the repository
	poolScope   string // "", "organization" or "repository": the pool's own scope
	tmplGroup   string // the template's runnerGroup ("" unset)
	poolGroup   string // the pool's runnerGroup ("" unset)
	labels      []string
	workDir     string // "" leaves the API's default
	arch        string
	poolName    string // the claims' name prefix (GenerateName <pool>-)
	hostnameNS  bool   // the template's hostname strategy NamespaceAndName
	// invalid is the field a generated bad value was put in ("" for a
	// valid case) and the text the API server's refusal must contain.
	invalid string
}

// labelGen draws runner labels: GitHub's usual ones in any case (some equal
// to the defaults the operator adds, self-hosted, Linux, X64), and made-up
// ones of 1 to 64 characters with the punctuation labels may carry.
var labelGen = rapid.OneOf(
	rapid.SampledFrom([]string{"gpu", "GPU", "large", "linux", "Linux", "x64", "self-hosted", "Self-Hosted", "hyperfleet", "ubuntu-24.04", "arm64", "docker"}),
	rapid.StringMatching(`[a-zA-Z0-9][a-zA-Z0-9._:/+-]{0,63}`),
)

// poolNameGen draws pool names (DNS subdomains, so claims' GenerateName
// prefixes): short, long (a runner name must be cut to fit 64 characters)
// and with dots (which a host name turns into dashes).
var poolNameGen = rapid.OneOf(
	rapid.StringMatching(`[a-z][a-z0-9-]{0,10}[a-z0-9]`),
	rapid.StringMatching(`[a-z][a-z0-9]{40,70}`),
	rapid.StringMatching(`[a-z]{1,8}\.[a-z0-9]{1,8}`),
)

func drawRunnerConfigCase(t *rapid.T) runnerConfigCase {
	c := runnerConfigCase{
		orgTemplate: rapid.Bool().Draw(t, "org template"),
		poolScope:   rapid.SampledFrom([]string{"", "organization", "repository"}).Draw(t, "pool scope"),
		labels:      rapid.SliceOfN(labelGen, 1, 8).Draw(t, "labels"),
		workDir:     rapid.SampledFrom([]string{"", "/opt/actions-runner", "/var/lib/hyperfleet/work", "/srv/ci/w", "/data/_work", "/home/runner/work"}).Draw(t, "workDir"),
		arch:        rapid.SampledFrom([]string{"", "x64", "arm64"}).Draw(t, "arch"),
		poolName:    poolNameGen.Draw(t, "pool name"),
		hostnameNS:  rapid.IntRange(0, 3).Draw(t, "hostname strategy") == 0,
	}
	groups := []string{"", "hyperfleet", "large runners", "Default"}
	// A runner group applies to organization runners only; the API refuses
	// it elsewhere, which the invalid cases below try.
	if c.orgTemplate {
		c.tmplGroup = rapid.SampledFrom(groups).Draw(t, "template group")
	}
	if c.poolScope == "organization" || c.poolScope == "" && c.orgTemplate {
		c.poolGroup = rapid.SampledFrom(groups).Draw(t, "pool group")
	}
	// Labels are a set to the API (listType=set): the same spelling twice
	// is refused. Cases keep distinct spellings; differently cased ones
	// stay, and the operator must register each label once.
	c.labels = slices.Compact(slices.Sorted(slices.Values(c.labels)))
	if rapid.IntRange(0, 2).Draw(t, "valid") > 0 {
		return c
	}
	switch rapid.IntRange(0, 7).Draw(t, "invalid field") {
	case 0:
		c.labels[0] = rapid.SampledFrom([]string{"gpu,large", "two words", "tab\tbed", ""}).Draw(t, "bad label")
		c.invalid = "spec.workload.github.labels"
	case 1:
		c.labels[0] = strings.Repeat("l", 65)
		c.invalid = "spec.workload.github.labels"
	case 2:
		c.labels = nil
		for i := range 33 {
			c.labels = append(c.labels, fmt.Sprintf("label-%d", i))
		}
		c.invalid = "spec.workload.github.labels"
	case 3:
		c.labels = nil
		c.invalid = "spec.workload.github.labels"
	case 4:
		c.poolScope, c.poolGroup = "repository", "hyperfleet"
		c.invalid = "workload.github.runnerGroup applies only to organization runners"
	case 5:
		c.poolScope, c.poolGroup = "organization", strings.Repeat("g", 101)
		c.invalid = "spec.workload.github.runnerGroup"
	case 6:
		c.workDir = rapid.SampledFrom([]string{"/etc/runner", "/usr", "/var/lib", "/opt/work/", "/opt//work", "relative/work", "/"}).Draw(t, "bad workDir")
		c.invalid = "bootstrap.github.runner.workDir"
	case 7:
		c.orgTemplate, c.tmplGroup = false, "hyperfleet"
		c.invalid = "bootstrap.github.runnerGroup applies only to organization and enterprise runners"
	}
	return c
}

func (w *runnerConfigWorld) objects(c runnerConfigCase) (*hfv1.HypervisorMachineTemplate, *hfv1.RunnerPool, error) {
	var clusters hfv1.HypervisorClusterList
	if err := w.c.List(context.Background(), &clusters); err != nil || len(clusters.Items) == 0 {
		return nil, nil, fmt.Errorf("no HypervisorCluster: %w", err)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, GenerateName: "t-"}}
	tmpl.Spec.HypervisorClusterRef.Name = clusters.Items[0].Name
	tmpl.Spec.Source.Proxmox.TemplateName = "debian-12-runner"
	tmpl.Spec.Resources = hfv1.MachineResources{CPU: 1, Memory: resource.MustParse("1Gi")}
	if c.hostnameNS {
		tmpl.Spec.Network.Hostname = hfv1.HostnameFromNamespaceAndName
	}
	gh := &hfv1.GitHubBootstrap{}
	tmpl.Spec.Bootstrap.GitHub = gh
	gh.Credentials.PAT = &hfv1.LocalSecretKeySelector{Name: "github-pat", Key: "token"}
	gh.APIBaseURL = w.gs.URL + "/api/v3"
	gh.Owner = p12Org
	if c.orgTemplate {
		gh.Organization = p12Org
	} else {
		gh.Repository = p12Repo
	}
	gh.RunnerGroup = c.tmplGroup
	if c.workDir != "" || c.arch != "" {
		gh.Runner = &hfv1.RunnerSoftware{WorkDir: c.workDir, Arch: hfv1.RunnerArch(c.arch)}
	}
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, Name: c.poolName}}
	pool.Spec.Scaling.MaxReplicas = 1
	pool.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: c.labels, RunnerGroup: c.poolGroup}}
	switch c.poolScope {
	case "organization":
		pool.Spec.Workload.GitHub.Organization = p12Org
	case "repository":
		pool.Spec.Workload.GitHub.Repository = p12Org + "/" + p12Repo
	}
	return tmpl, pool, nil
}

// decodeJITConfig returns the runner's settings file (.runner) from an
// encoded JIT configuration: base64 of a JSON object mapping file names
// to their base64 contents, as GitHub hands it out.
func decodeJITConfig(encoded string) (map[string]any, error) {
	raw, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		return nil, fmt.Errorf("decode the JIT configuration: %w", err)
	}
	var files map[string]string
	if err := json.Unmarshal(raw, &files); err != nil {
		return nil, fmt.Errorf("parse the JIT configuration: %w", err)
	}
	runnerFile, err := base64.StdEncoding.DecodeString(files[".runner"])
	if err != nil {
		return nil, fmt.Errorf("decode .runner: %w", err)
	}
	var out map[string]any
	if err := json.Unmarshal(runnerFile, &out); err != nil {
		return nil, fmt.Errorf("parse .runner: %w", err)
	}
	return out, nil
}

// Feature: hyperfleet-operator, Property 12: CI/CD Runner Configuration
//
// TestRunnerConfigurationProperty: over generated RunnerPools and their
// templates (runner labels, some differing only in case or equal to the
// defaults the operator adds; runner groups of the pool, of the template or
// neither; the pool's or the template's scope, organization or repository;
// work folders; architectures; pool names, the claims' name prefix, short,
// long and dotted), the runner registered for the pool's claim on the GitHub
// simulator carries exactly the pool's configuration: its labels (each once,
// with self-hosted, hyperfleet, the OS and the architecture, nothing else),
// its runner group (else the template's, else Default), its scope, a name
// made from the claim's (so from the pool's) name and marked as this
// install's, and the template's work folder in the JIT configuration the VM
// receives; the claim records that runner. A pool or template with one
// generated invalid setting (a label with a comma or space, empty, too
// long, too many labels, a runner group on repository runners or too long,
// a work folder that is a system directory or not written plainly) is
// refused by the real API server with a message naming the field, and no
// runner is registered for it.
func TestRunnerConfigurationProperty(t *testing.T) {
	w := newRunnerConfigWorld(t)
	ctx := context.Background()
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		c := drawRunnerConfigCase(rt)
		before := len(w.gs.Sim.Runners())
		tmpl, pool, err := w.objects(c)
		if err != nil {
			rt.Fatal(err)
		}
		var created []client.Object
		defer func() {
			for _, o := range slices.Backward(created) {
				_ = w.c.Delete(context.Background(), o)
			}
		}()
		errT := w.c.Create(ctx, tmpl)
		if errT == nil {
			created = append(created, tmpl)
			pool.Spec.TemplateRef.Name = tmpl.Name
		}
		var errP error
		if errT == nil {
			if errP = w.c.Create(ctx, pool); errP == nil {
				created = append(created, pool)
			}
		}
		if c.invalid != "" {
			refusal := errT
			if refusal == nil {
				refusal = errP
			}
			if refusal == nil {
				rt.Fatalf("the API server accepted an invalid %s: template %+v, pool %+v", c.invalid, tmpl.Spec.Bootstrap.GitHub, pool.Spec.Workload.GitHub)
			}
			if !apierrors.IsInvalid(refusal) || !strings.Contains(refusal.Error(), c.invalid) {
				rt.Fatalf("refusal of an invalid %s does not name it: %v", c.invalid, refusal)
			}
			if n := len(w.gs.Sim.Runners()); n != before {
				rt.Fatalf("%d runners registered for a refused pool", n-before)
			}
			return
		}
		if errT != nil || errP != nil {
			rt.Fatalf("a valid template or pool was refused: %v; %v", errT, errP)
		}
		// Read both back: what the operator reads has the API's defaults.
		if err := w.c.Get(ctx, client.ObjectKeyFromObject(tmpl), tmpl); err != nil {
			rt.Fatal(err)
		}
		// The claim as the pool makes it (runnerpool_scaling.go, newClaim):
		// named after the pool, with the pool's runner settings copied.
		be, ok := w.platforms.Backends.For(hfv1.WorkloadGitHubActions)
		if !ok {
			rt.Fatal("no GitHub Actions back-end")
		}
		ps, ok := be.Pool(pool, tmpl)
		if !ok {
			rt.Fatal("the back-end does not read the pool")
		}
		claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: w.ns, GenerateName: pool.Name + "-",
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, hfv1.GroupVersion.WithKind("RunnerPool"))}}}
		claim.Spec.TemplateRef.Name = tmpl.Name
		claim.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: pool.Name}
		claim.Spec.WorkloadConfig = ps.Claim
		if err := w.c.Create(ctx, claim); err != nil {
			rt.Fatalf("the pool's claim was refused: %v", err)
		}
		created = append(created, claim)

		cred, err := w.platforms.RunnerCredential(ctx, claim)
		if err != nil {
			rt.Fatalf("issuing the claim's runner credential: %v", err)
		}
		runners := w.gs.Sim.Runners()
		if len(runners) != before+1 {
			rt.Fatalf("%d runners registered, want 1", len(runners)-before)
		}
		r, ok := w.gs.Sim.RunnerByName(cred.RunnerName)
		if !ok {
			rt.Fatalf("runner %q is not registered", cred.RunnerName)
		}
		defer func() {
			if err := w.platforms.Release(context.Background(), claim, tmpl); err != nil {
				rt.Errorf("removing the runner: %v", err)
			}
			if _, ok := w.gs.Sim.RunnerByName(r.Name); ok {
				rt.Errorf("runner %s still registered after its claim released it", r.Name)
			}
		}()

		// Labels: exactly the pool's, the OS's, the architecture's,
		// self-hosted and hyperfleet, each once whatever its case.
		arch := map[string]string{"": "x64", "x64": "x64", "arm64": "arm64"}[c.arch]
		want := map[string]bool{"self-hosted": true, "hyperfleet": true, "linux": true, arch: true}
		for _, l := range c.labels {
			want[strings.ToLower(l)] = true
		}
		got := map[string]bool{}
		for _, l := range r.Labels {
			k := strings.ToLower(l)
			if got[k] {
				rt.Fatalf("label %q registered twice: %q", l, r.Labels)
			}
			got[k] = true
			if !want[k] {
				rt.Fatalf("runner has label %q the pool does not give: %q, pool %q", l, r.Labels, c.labels)
			}
		}
		if len(got) != len(want) {
			rt.Fatalf("runner labels %q, want (any case) %v", r.Labels, want)
		}
		// A label the pool spells once is registered as the pool spells it.
		for _, l := range c.labels {
			if !slices.Contains(r.Labels, l) && !slices.ContainsFunc(c.labels, func(o string) bool { return o != l && strings.EqualFold(o, l) }) &&
				!slices.ContainsFunc([]string{"self-hosted", "hyperfleet", "Linux", "X64", "ARM64"}, func(o string) bool { return strings.EqualFold(o, l) }) {
				rt.Fatalf("pool label %q registered as %q", l, r.Labels)
			}
		}

		// Scope and runner group.
		orgScope := c.poolScope == "organization" || c.poolScope == "" && c.orgTemplate
		wantScope := p12Org + "/" + p12Repo
		if orgScope {
			wantScope = p12Org
		}
		if r.Scope != wantScope {
			rt.Fatalf("runner registered in %s, want %s", r.Scope, wantScope)
		}
		wantGroup := "Default"
		if orgScope {
			if g := cmp.Or(c.poolGroup, c.tmplGroup); g != "" {
				wantGroup = g
			}
		}
		if r.GroupName != wantGroup {
			rt.Fatalf("runner in group %q, want %q (pool %q, template %q)", r.GroupName, wantGroup, c.poolGroup, c.tmplGroup)
		}

		// Name: the claim's host name (so the pool's name), cut to fit,
		// with the claim's UID, marked as this install's.
		if len(r.Name) > ownership.MaxRunnerNameLength {
			rt.Fatalf("runner name %q longer than %d", r.Name, ownership.MaxRunnerNameLength)
		}
		base, ok := w.signer.VerifyRunnerName(r.Name)
		if !ok {
			rt.Fatalf("runner name %q is not marked as this install's", r.Name)
		}
		host := claim.Name
		if c.hostnameNS {
			host = w.ns + "-" + claim.Name
		}
		host = strings.ReplaceAll(host, ".", "-")
		uid := strings.ReplaceAll(string(claim.UID), "-", "")[:8]
		stem, ok := strings.CutSuffix(base, "-"+uid)
		if !ok || stem == "" || !strings.HasPrefix(host, stem) || len(stem) < min(len(host), 20) {
			rt.Fatalf("runner name %q (base %q) is not the claim's host name %q with its UID %s", r.Name, base, host, uid)
		}

		// The JIT configuration the VM runs: the same runner, the
		// template's work folder.
		runnerFile, err := decodeJITConfig(cred.Secret.Reveal())
		if err != nil {
			rt.Fatal(err)
		}
		wantWork := cmp.Or(c.workDir, "/var/lib/hyperfleet/work")
		if runnerFile["workFolder"] != wantWork || runnerFile["agentName"] != r.Name || runnerFile["poolName"] != wantGroup {
			rt.Fatalf("JIT configuration .runner %v, want workFolder %s, agentName %s, poolName %s", runnerFile, wantWork, r.Name, wantGroup)
		}
		if st := claim.Status.Bootstrap; st == nil || st.RunnerName != r.Name || st.RunnerID != r.ID {
			rt.Fatalf("claim status.bootstrap %+v, want runner %s (%d)", st, r.Name, r.ID)
		}
	})
}
