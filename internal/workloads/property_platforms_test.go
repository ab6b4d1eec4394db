package workloads

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
)

// platformsWorld is TestRunnerConfigurationPlatformsProperty's world, all
// in the test process: the GitHub simulator (organization octo-org, its
// repository app, two runner groups besides Default), the GitLab
// simulator (group acme with subgroup acme/platform and project acme/app,
// a token of its Owner) and a fake API server holding one template per
// platform, their token Secrets and the cluster. The operator's side is
// Platforms with the back-ends the operator registers.
type platformsWorld struct {
	kube      client.Client
	gh        *githubsimtest.Server
	gl        *gitlabsim.Simulator
	glURL     string
	platforms *Platforms
	// uids makes every claim's UID distinct (the runner name carries it).
	uids atomic.Int64
}

const (
	p12NS      = "ci"
	p12Cluster = "pve"
	p12GLToken = "glpat-property12platforms000"
)

func newPlatformsWorld(t *testing.T) *platformsWorld {
	t.Helper()
	gh := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: p12Org, RunnerGroups: []githubsim.RunnerGroupConfig{
			{ID: p12Groups["hyperfleet"], Name: "hyperfleet"}, {ID: p12Groups["large runners"], Name: "large runners"},
		}}},
		Repositories: []githubsim.RepoConfig{{Name: p12Org + "/" + p12Repo}},
		PATs:         []githubsim.PATConfig{{Token: p12PAT, Login: "octocat"}},
	})
	gl, err := gitlabsim.New(gitlabsim.Config{
		Groups:   []gitlabsim.GroupConfig{{Path: "acme"}, {Path: "acme/platform"}},
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/app"}},
		Users:    []gitlabsim.UserConfig{{Username: "owner", Members: map[string]int{"acme": gitlabsim.Owner}}},
		Tokens:   []gitlabsim.TokenConfig{{Token: p12GLToken, User: "owner", Scopes: []string{"api"}}},
		// Thousands of cases in a few seconds are no client to slow down.
		RateLimit: 1 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	glSrv := httptest.NewServer(gl)
	t.Cleanup(func() { glSrv.Close(); gl.Close() })

	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: p12Cluster}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: p12NS, Name: "tokens"}, Data: map[string][]byte{
			"github": []byte(p12PAT), "gitlab": []byte(p12GLToken), "buildkite": []byte("bkua_property12"),
		}},
	).WithStatusSubresource(&hfv1.MachineClaim{}).Build()
	return &platformsWorld{
		kube: kube, gh: gh, gl: gl, glURL: glSrv.URL,
		platforms: &Platforms{Client: kube, Backends: githubsimtest.Backends(t, gh.Transport), Signer: testobjects.Signer(t)},
	}
}

// platformCase is one generated pool and its template on one of the
// three platforms: the runner configuration the pool gives (GitHub
// labels and runner group, GitLab tags and runUntagged, Buildkite queue
// and tags) and the scope it narrows the template's to.
type platformCase struct {
	platform hfv1.WorkloadType
	poolName string
	// GitHub: the template's scope (organization, else repository), the
	// pool's own ("", organization, repository), runner groups and labels.
	orgTemplate          bool
	poolScope            string
	tmplGroup, poolGroup string
	labels               []string
	// GitLab: the pool's tags, its project or group (else the
	// template's group acme), and runUntagged of the template and pool.
	tags               []string
	glProject, glGroup string
	tmplUntagged       bool
	poolUntagged       *bool
	// Buildkite: the pool's queue, whether it is the default, its tags.
	queue        string
	defaultQueue bool
	bkTags       []string
}

// glTagGen draws GitLab tags: what the API accepts (no comma, no space,
// 1 to 64 characters), some of them the labels the operator gives every
// runner of the other platforms, in any case.
var glTagGen = rapid.OneOf(
	rapid.SampledFrom([]string{"docker", "Docker", "linux", "gpu", "self-hosted", "hyperfleet", "HyperFleet", "arm64"}),
	rapid.StringMatching(`[a-zA-Z0-9_.:/+-]{1,64}`),
)

// bkTagGen draws Buildkite agent tags, key=value as the API accepts them.
var bkTagGen = rapid.Custom(func(t *rapid.T) string {
	return rapid.StringMatching(`[a-z][a-z0-9_.-]{0,15}`).Draw(t, "key") + "=" + rapid.StringMatching(`[A-Za-z0-9_./:-]{1,20}`).Draw(t, "value")
})

func drawPlatformCase(t *rapid.T) platformCase {
	c := platformCase{
		platform: rapid.SampledFrom([]hfv1.WorkloadType{hfv1.WorkloadGitHubActions, hfv1.WorkloadGitLabCI, hfv1.WorkloadBuildkite}).Draw(t, "platform"),
		poolName: poolNameGen.Draw(t, "pool name"),
	}
	distinct := func(s []string) []string { return slices.Compact(slices.Sorted(slices.Values(s))) }
	switch c.platform {
	case hfv1.WorkloadGitHubActions:
		c.orgTemplate = rapid.Bool().Draw(t, "org template")
		c.poolScope = rapid.SampledFrom([]string{"", "organization", "repository"}).Draw(t, "pool scope")
		groups := []string{"", "hyperfleet", "large runners", "Default"}
		if c.orgTemplate {
			c.tmplGroup = rapid.SampledFrom(groups).Draw(t, "template group")
		}
		if c.poolScope == "organization" || c.poolScope == "" && c.orgTemplate {
			c.poolGroup = rapid.SampledFrom(groups).Draw(t, "pool group")
		}
		c.labels = distinct(rapid.SliceOfN(labelGen, 1, 8).Draw(t, "labels"))
	case hfv1.WorkloadGitLabCI:
		c.tags = distinct(rapid.SliceOfN(glTagGen, 0, 8).Draw(t, "tags"))
		switch rapid.IntRange(0, 2).Draw(t, "gitlab scope") {
		case 1:
			c.glProject = "acme/app"
		case 2:
			c.glGroup = "acme/platform"
		}
		c.tmplUntagged = rapid.Bool().Draw(t, "template runUntagged")
		if u := rapid.IntRange(0, 2).Draw(t, "pool runUntagged"); u > 0 {
			c.poolUntagged = ptr.To(u == 1)
		}
		if len(c.tags) == 0 && !*cmp.Or(c.poolUntagged, &c.tmplUntagged) {
			// GitLab refuses a runner without tags that takes no untagged
			// job; the pool then takes untagged ones.
			c.poolUntagged = ptr.To(true)
		}
	case hfv1.WorkloadBuildkite:
		c.queue = rapid.StringMatching(`[A-Za-z0-9_.:-]{1,30}`).Draw(t, "queue")
		c.defaultQueue = rapid.Bool().Draw(t, "default queue")
		c.bkTags = distinct(rapid.SliceOfN(bkTagGen, 0, 6).Draw(t, "tags"))
	}
	return c
}

// objects are the case's template and pool.
func (w *platformsWorld) objects(n int, c platformCase) (*hfv1.HypervisorMachineTemplate, *hfv1.RunnerPool) {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: p12NS, Name: fmt.Sprintf("t-%d", n)}}
	tmpl.Spec.HypervisorClusterRef.Name = p12Cluster
	pool := &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: p12NS, Name: c.poolName, UID: k8stypes.UID(fmt.Sprintf("pool-%d", n))}}
	pool.Spec.TemplateRef.Name = tmpl.Name
	pool.Spec.Scaling.MaxReplicas = 1
	pool.Spec.Workload.Type = c.platform
	switch c.platform {
	case hfv1.WorkloadGitHubActions:
		gh := &hfv1.GitHubBootstrap{APIBaseURL: w.gh.URL + "/api/v3", Owner: p12Org, RunnerGroup: c.tmplGroup}
		gh.Credentials.PAT = &hfv1.LocalSecretKeySelector{Name: "tokens", Key: "github"}
		if c.orgTemplate {
			gh.Organization = p12Org
		} else {
			gh.Repository = p12Repo
		}
		tmpl.Spec.Bootstrap.GitHub = gh
		pool.Spec.Workload.GitHub = &hfv1.GitHubWorkload{Labels: c.labels, RunnerGroup: c.poolGroup}
		switch c.poolScope {
		case "organization":
			pool.Spec.Workload.GitHub.Organization = p12Org
		case "repository":
			pool.Spec.Workload.GitHub.Repository = p12Org + "/" + p12Repo
		}
	case hfv1.WorkloadGitLabCI:
		tmpl.Spec.Bootstrap.GitLab = &hfv1.GitLabBootstrap{URL: w.glURL, Group: "acme", RunUntagged: c.tmplUntagged, AccessLevel: hfv1.GitLabNotProtected,
			Credentials: hfv1.GitLabCredentials{Token: hfv1.LocalSecretKeySelector{Name: "tokens", Key: "gitlab"}}}
		pool.Spec.Workload.GitLab = &hfv1.GitLabWorkload{Tags: c.tags, Project: c.glProject, Group: c.glGroup, RunUntagged: c.poolUntagged}
	case hfv1.WorkloadBuildkite:
		tmpl.Spec.Bootstrap.Buildkite = &hfv1.BuildkiteBootstrap{Organization: "acme", Cluster: "cluster-1", APIURL: "https://buildkite.invalid",
			Credentials: hfv1.BuildkiteCredentials{APIToken: hfv1.LocalSecretKeySelector{Name: "tokens", Key: "buildkite"}}}
		pool.Spec.Workload.Buildkite = &hfv1.BuildkiteWorkload{Queue: c.queue, DefaultQueue: c.defaultQueue, Tags: c.bkTags}
	}
	return tmpl, pool
}

// glRunner reads a runner as GitLab's REST API shows it to the
// template's token (GET /runners/:id): its tags and run_untagged.
func (w *platformsWorld) glRunner(id int64) (tags []string, runUntagged bool, err error) {
	req := httptest.NewRequest(http.MethodGet, fmt.Sprintf("%s/runners/%d", gitlabsim.APIPrefix, id), nil)
	req.Header.Set("PRIVATE-TOKEN", p12GLToken)
	rec := httptest.NewRecorder()
	w.gl.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return nil, false, fmt.Errorf("GET /runners/%d: HTTP %d: %s", id, rec.Code, rec.Body)
	}
	var out struct {
		TagList     []string `json:"tag_list"`
		RunUntagged bool     `json:"run_untagged"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		return nil, false, fmt.Errorf("GET /runners/%d: %w", id, err)
	}
	return out.TagList, out.RunUntagged, nil
}

// sameLabels reports whether got holds each of want once, ignoring case
// (GitHub and GitLab compare labels and tags so), and nothing else.
func sameLabels(got, want []string) bool {
	seen := map[string]bool{}
	for _, l := range got {
		k := strings.ToLower(l)
		if seen[k] {
			return false
		}
		seen[k] = true
	}
	wantSet := map[string]bool{}
	for _, l := range want {
		wantSet[strings.ToLower(l)] = true
	}
	if len(seen) != len(wantSet) {
		return false
	}
	for k := range wantSet {
		if !seen[k] {
			return false
		}
	}
	return true
}

// Feature: hyperfleet-operator, Property 12: CI/CD Runner Configuration
//
// TestRunnerConfigurationPlatformsProperty widens property 12 from GitHub
// to every CI platform the operator runs, in the cheapest world that
// decides it (a fake API server, the GitHub and GitLab simulators in the
// test process): over generated RunnerPools of GitHub Actions (labels in
// any case, runner groups of the pool or template, organization or
// repository scope), GitLab CI (tags in any case, some equal to the
// labels the operator gives runners of the other platforms, none at all;
// the template's group or the pool's project or subgroup; runUntagged of
// the pool or the template) and Buildkite (queue, default or not,
// key=value tags), the claim the pool makes (its workloadConfig as
// RunnerPool's newClaim copies it) registers with exactly the pool's
// configuration: the VM's runner variables (BootstrapVars, what its
// cloud-init configures the runner or agent with) carry the pool's
// labels, tags or queue and tags, and for GitHub and GitLab the runner
// the operator registers on the platform (RunnerCredential) carries them
// too, in the pool's scope (GitHub: its runner group; GitLab: a project
// or group runner, run_untagged as the pool, else the template, says).
// The API server's validation of these fields stays with
// TestRunnerConfigurationProperty (property_test.go), which needs the real
// one.
//
// Mutation: pkg/workload/gitlab's Backend.Pool ignoring the pool's own
// runUntagged (neither copied into the claim nor into the pool's
// routing), so the template's decided, fails this test (GitLab runner
// run_untagged); TestRunnerConfigurationProperty, GitHub only, passed it.
// Mutation: pkg/workload/buildkite's Backend.Pool copying only the queue
// into the claim (Tags: nil), so the VM's agent started without the
// pool's tags, fails this test (Buildkite agent tags); the old test passed
// it.
func TestRunnerConfigurationPlatformsProperty(t *testing.T) {
	w := newPlatformsWorld(t)
	ctx := context.Background()
	n := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		c := drawPlatformCase(rt)
		tmpl, pool := w.objects(n, c)
		for _, o := range []client.Object{tmpl, pool} {
			if err := w.kube.Create(ctx, o); err != nil {
				rt.Fatalf("create %T: %v", o, err)
			}
		}
		defer func() {
			_ = w.kube.Delete(context.Background(), pool)
			_ = w.kube.Delete(context.Background(), tmpl)
		}()
		// The claim as the pool makes it (runnerpool_scaling.go, newClaim).
		be, ps, ok := w.platforms.Backends.Pool(pool, tmpl)
		if !ok {
			rt.Fatalf("no back-end reads a %s pool", c.platform)
		}
		claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: p12NS, Name: fmt.Sprintf("%s-%05d", pool.Name, n),
			UID: k8stypes.UID(fmt.Sprintf("%08x-0000-4000-8000-%012d", w.uids.Add(1), n))}}
		claim.Spec.TemplateRef.Name = tmpl.Name
		claim.Spec.RunnerPoolRef = &hfv1.ObjectName{Name: pool.Name}
		claim.Spec.WorkloadConfig = ps.Claim
		if err := w.kube.Create(ctx, claim); err != nil {
			rt.Fatal(err)
		}
		defer func() { _ = w.kube.Delete(context.Background(), claim) }()

		// What the VM's runner is configured with.
		var cluster hfv1.HypervisorCluster
		if err := w.kube.Get(ctx, client.ObjectKey{Name: p12Cluster}, &cluster); err != nil {
			rt.Fatal(err)
		}
		vars := vmspec.ClaimVars(w.platforms.Backends, claim, tmpl, &cluster, nil)
		if err := w.platforms.BootstrapVars(ctx, claim, tmpl, &vars); err != nil {
			rt.Fatalf("%s runner variables: %v", be.Name(), err)
		}
		switch c.platform {
		case hfv1.WorkloadGitHubActions:
			w.checkGitHub(ctx, rt, c, claim, tmpl, vars)
		case hfv1.WorkloadGitLabCI:
			w.checkGitLab(ctx, rt, c, claim, tmpl, vars)
		case hfv1.WorkloadBuildkite:
			// The agent's tags (buildkite-agent start --tags): the
			// operator's two, the pool's queue, then its tags as given; and
			// the labels routing compares jobs' agent query rules with (the
			// default queue's marker too when the pool says its queue is the
			// default).
			want := append([]string{"queue=" + c.queue}, c.bkTags...)
			if got, all := []string(vars.Labels), append([]string{"self-hosted", "hyperfleet"}, want...); !slices.Equal(got, all) {
				rt.Fatalf("Buildkite agent tags %q, want %q: the pool's queue first, then its tags", got, all)
			}
			if !slices.Equal(ps.Labels[:min(len(want), len(ps.Labels))], want) || c.defaultQueue != (len(ps.Labels) == len(want)+1) {
				rt.Fatalf("the pool's routing labels %q, want %q (default queue %v)", ps.Labels, want, c.defaultQueue)
			}
		}
	})
}

// checkGitHub: the runner registered on the GitHub simulator has the
// pool's labels (with the operator's defaults), scope and runner group, and
// the VM's variables the same labels.
func (w *platformsWorld) checkGitHub(ctx context.Context, rt *rapid.T, c platformCase, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars cloudinit.Vars) {
	cred, err := w.platforms.RunnerCredential(ctx, claim)
	if err != nil {
		rt.Fatalf("issuing the GitHub runner: %v", err)
	}
	r, ok := w.gh.Sim.RunnerByName(cred.RunnerName)
	if !ok {
		rt.Fatalf("runner %q is not registered", cred.RunnerName)
	}
	defer func() {
		if err := w.platforms.Release(context.Background(), claim, tmpl); err != nil {
			rt.Errorf("removing the runner: %v", err)
		}
	}()
	want := append([]string{"self-hosted", "hyperfleet", "linux", "x64"}, c.labels...)
	if !sameLabels(r.Labels, want) {
		rt.Fatalf("GitHub runner labels %q, want each of %q once (any case)", r.Labels, want)
	}
	if !sameLabels(vars.Labels, want) {
		rt.Fatalf("the VM's runner labels %q, want each of %q once (any case)", vars.Labels, want)
	}
	orgScope := c.poolScope == "organization" || c.poolScope == "" && c.orgTemplate
	wantScope, wantGroup := p12Org+"/"+p12Repo, "Default"
	if orgScope {
		wantScope = p12Org
		wantGroup = cmp.Or(c.poolGroup, c.tmplGroup, "Default")
	}
	if r.Scope != wantScope || r.GroupName != wantGroup {
		rt.Fatalf("GitHub runner in %s group %q, want %s group %q (pool %q, template %q)", r.Scope, r.GroupName, wantScope, wantGroup, c.poolGroup, c.tmplGroup)
	}
}

// checkGitLab: the runner the operator created on the GitLab simulator
// has the pool's tags, its scope's runner type and run_untagged as the
// pool (else the template) says, and the VM's variables the same tags.
func (w *platformsWorld) checkGitLab(ctx context.Context, rt *rapid.T, c platformCase, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars cloudinit.Vars) {
	before := len(w.gl.IssuedRunners())
	cred, err := w.platforms.RunnerCredential(ctx, claim)
	if err != nil {
		rt.Fatalf("issuing the GitLab runner: %v", err)
	}
	defer func() {
		if err := w.platforms.Release(context.Background(), claim, tmpl); err != nil {
			rt.Errorf("removing the runner: %v", err)
		}
	}()
	issued := w.gl.IssuedRunners()
	if len(issued) != before+1 {
		rt.Fatalf("%d GitLab runners created, want 1", len(issued)-before)
	}
	ir := issued[len(issued)-1]
	if ir.Description != cred.RunnerName || ir.Token != cred.Secret.Reveal() {
		rt.Fatalf("GitLab runner %q is not the credential's %q", ir.Description, cred.RunnerName)
	}
	var info gitlabsim.RunnerInfo
	for _, r := range w.gl.Runners() {
		if r.ID == ir.ID {
			info = r
		}
	}
	wantType := gitlabsim.GroupType
	if c.glProject != "" {
		wantType = gitlabsim.ProjectType
	}
	if info.Type != wantType {
		rt.Fatalf("GitLab runner %d of type %q, want %q (pool project %q, group %q)", ir.ID, info.Type, wantType, c.glProject, c.glGroup)
	}
	tags, untagged, err := w.glRunner(ir.ID)
	if err != nil {
		rt.Fatal(err)
	}
	want := append([]string{"self-hosted", "hyperfleet"}, c.tags...)
	if !sameLabels(tags, want) || !sameLabels(info.Tags, want) {
		rt.Fatalf("GitLab runner tags %q, want each of %q once (any case)", tags, want)
	}
	if !sameLabels(vars.Labels, want) {
		rt.Fatalf("the VM's runner tags %q, want each of %q once (any case)", vars.Labels, want)
	}
	if wantUntagged := *cmp.Or(c.poolUntagged, &c.tmplUntagged); untagged != wantUntagged {
		pool := "unset"
		if c.poolUntagged != nil {
			pool = fmt.Sprint(*c.poolUntagged)
		}
		rt.Fatalf("GitLab runner run_untagged %v, want %v (pool %s, template %v)", untagged, wantUntagged, pool, c.tmplUntagged)
	}
}
