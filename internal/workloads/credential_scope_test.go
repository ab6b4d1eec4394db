package workloads

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
)

// TestReusableCredential: the condition follows what each platform's
// back-end says of the credential its VMs receive (Template.CredentialReuse),
// whatever the platform: a GitHub JIT configuration is single-job, a
// registration token is not at any scope (a repository's included), a
// GitLab runner authentication token never is; a generic VM receives none.
// A reusable credential's message names the organization-wide scopes it
// reaches: the template's own and its pools'.
func TestReusableCredential(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	pat := &hfv1.LocalSecretKeySelector{Name: "gh", Key: "token"}
	github := func(method hfv1.BootstrapMethod, repo, org string) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
		tm.Spec.Bootstrap.Method = method
		tm.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo-org", Repository: repo, Organization: org, Credentials: hfv1.GitHubCredentials{PAT: pat}}
		return tm
	}
	gitlab := func(project, group string) *hfv1.HypervisorMachineTemplate {
		tm := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
		tm.Spec.Bootstrap.GitLab = &hfv1.GitLabBootstrap{Project: project, Group: group, Credentials: hfv1.GitLabCredentials{Token: *pat}}
		return tm
	}
	generic := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "t"}}
	generic.Spec.Bootstrap.Generic = &hfv1.GenericBootstrap{Script: "#!/bin/sh\ntrue\n"}
	pool := func(name, template string, w hfv1.Workload) hfv1.RunnerPool {
		return hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: name}, Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: template}, Workload: w}}
	}
	orgPool := pool("org-pool", "t", hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org", Labels: []string{"x"}}})
	otherTemplatePool := pool("other", "u", hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Organization: "octo-org", Labels: []string{"x"}}})
	groupPool := pool("group-pool", "t", hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Group: "acme/platform", Tags: []string{"x"}}})

	for _, tc := range []struct {
		name     string
		tmpl     *hfv1.HypervisorMachineTemplate
		pools    []hfv1.RunnerPool
		reusable bool
		want     []string
		not      []string
	}{
		{name: "GitHub jit-config", tmpl: github(hfv1.BootstrapJITConfig, "app", ""), pools: []hfv1.RunnerPool{orgPool}, want: []string{"GitHub serves one job only"}},
		{name: "GitHub jit-config by default", tmpl: github("", "", "octo-org"), want: []string{"one job only"}},
		{name: "GitHub runner-token of a repository", tmpl: github(hfv1.BootstrapRunnerToken, "app", ""), reusable: true,
			want: []string{"GitHub: spec.bootstrap.method is runner-token", "registers any number of runners", "jit-config"}, not: []string{"whole organization"}},
		{name: "GitHub runner-token of an organization", tmpl: github(hfv1.BootstrapRunnerToken, "", "octo-org"), reusable: true,
			want: []string{"every repository of a whole organization or group: spec.bootstrap.github.organization (octo-org)"}},
		{name: "GitHub runner-token narrowed to an organization by a pool", tmpl: github(hfv1.BootstrapRunnerToken, "app", ""), pools: []hfv1.RunnerPool{orgPool, otherTemplatePool}, reusable: true,
			want: []string{"RunnerPool org-pool spec.workload.github.organization (octo-org)"}, not: []string{"RunnerPool other"}},
		{name: "GitLab project", tmpl: gitlab("acme/platform/app", ""), reusable: true,
			want: []string{"GitLab: a GitLab runner authentication token is multi-job", "paused as soon as its first job is seen", "maximum_timeout", "runs as root and the job as the runner user"},
			not:  []string{"whole organization"}},
		{name: "GitLab group and a pool's group", tmpl: gitlab("", "acme"), pools: []hfv1.RunnerPool{groupPool}, reusable: true,
			want: []string{"spec.bootstrap.gitlab.group (acme)", "RunnerPool group-pool spec.workload.gitlab.group (acme/platform)"}},
		{name: "generic", tmpl: generic, want: []string{"spec.bootstrap.generic run no CI platform's runner"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reusable, msg := ReusableCredential(ws, tc.tmpl, tc.pools)
			if reusable != tc.reusable {
				t.Fatalf("reusable = %v, want %v: %s", reusable, tc.reusable, msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(msg, n) {
					t.Errorf("message %q has %q", msg, n)
				}
			}
		})
	}
}
