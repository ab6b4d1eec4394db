package controller

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
)

// scopesCounted vouches for every scope, counting the checks: a check is
// a call to the template's API with its credentials.
type scopesCounted struct{ calls atomic.Int32 }

func (s *scopesCounted) VerifyPoolScope(context.Context, *hfv1.RunnerPool, *hfv1.HypervisorMachineTemplate) error {
	s.calls.Add(1)
	return nil
}

// TestPoolAPIHostNotAllowed performs the first step of the API host
// attack: a tenant's template names a host the tenant runs, whose server
// answers for any scope. The pool controller checks the template's API
// hosts against its cluster's tenancy rules before it asks that host
// anything; a host no rule allows leaves the pool unverified (and so
// without jobs), with a reason that names the field, the host and the
// fix, and the host is never called.
func TestPoolAPIHostNotAllowed(t *testing.T) {
	const ns = "tenant"
	key := types.NamespacedName{Namespace: ns, Name: "runners"}
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, UID: "pool-uid", Generation: 1},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: "gh"}, Scaling: hfv1.Scaling{MaxReplicas: 5},
			Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Repository: "victim-org/app"}}},
	}
	tmpl := func(apiBaseURL string) *hfv1.HypervisorMachineTemplate {
		return &hfv1.HypervisorMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "gh", Generation: 1},
			Spec: hfv1.HypervisorMachineTemplateSpec{HypervisorClusterRef: hfv1.ObjectName{Name: "pve"},
				Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Organization: "victim-org", APIBaseURL: apiBaseURL,
					Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}}},
		}
	}
	cluster := func(rules ...hfv1.TenancyRule) *hfv1.HypervisorCluster {
		return &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}, Spec: hfv1.HypervisorClusterSpec{Tenancy: rules}}
	}
	rule := func(hosts ...string) hfv1.TenancyRule {
		return hfv1.TenancyRule{NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"team": "tenant"}},
			Templates: []hfv1.AllowedTemplate{{Name: "debian"}}, APIHosts: hosts}
	}
	namespace := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": "tenant"}}}
	const evil = "https://evil.example.net/api/v3"
	for _, tc := range []struct {
		name     string
		objs     []client.Object
		verified bool
		says     []string
	}{
		{name: "a host no rule lists", objs: []client.Object{tmpl(evil), cluster(rule("ghes.example.com")), namespace},
			says: []string{"spec.bootstrap.github.apiBaseURL names API host evil.example.net, which is not allowed", "spec.tenancy[].apiHosts", "ghes.example.com"}},
		{name: "a host a rule lists", objs: []client.Object{tmpl(evil), cluster(rule("evil.example.net")), namespace}, verified: true},
		{name: "the public service, rules without hosts", objs: []client.Object{tmpl(""), cluster(rule()), namespace}, verified: true},
		{name: "a cluster that does not exist", objs: []client.Object{tmpl(evil), namespace},
			says: []string{"HypervisorCluster pve of HypervisorMachineTemplate gh does not exist, so only the CI platforms' public services are allowed"}},
		{name: "a namespace the cluster does not admit", objs: []client.Object{tmpl(evil), cluster(rule("evil.example.net")),
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}}, says: []string{"does not admit namespace tenant"}},
		{name: "a cluster without tenancy rules", objs: []client.Object{tmpl(evil), cluster(), namespace}, verified: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := unitWorld(t, interceptor.Funcs{}, append(tc.objs, pool.DeepCopy())...)
			scopes := &scopesCounted{}
			r := &RunnerPoolReconciler{Client: c, Recorder: record.NewFakeRecorder(16), Clock: clocktesting.NewFakeClock(unitEpoch),
				Backoff: scaling.DefaultBackoff(), Scopes: scopes, Workloads: ciPlatforms}
			if _, err := r.Reconcile(context.Background(), ctrl.Request{NamespacedName: key}); err != nil {
				t.Fatal(err)
			}
			var got hfv1.RunnerPool
			if err := c.Get(context.Background(), key, &got); err != nil {
				t.Fatal(err)
			}
			cond := hfv1.FindCondition(got.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition)
			switch {
			case cond == nil:
				t.Fatal("no ScopeVerified condition")
			case tc.verified && (cond.Status != metav1.ConditionTrue || scopes.calls.Load() != 1):
				t.Fatalf("ScopeVerified %s (%s: %s) after %d checks; want True after one", cond.Status, cond.Reason, cond.Message, scopes.calls.Load())
			case !tc.verified && (cond.Status != metav1.ConditionFalse || cond.Reason != string(hfv1.NotAllowedByClusterReason)):
				t.Fatalf("ScopeVerified %s (%s: %s); want False, NotAllowedByCluster", cond.Status, cond.Reason, cond.Message)
			case !tc.verified && scopes.calls.Load() != 0:
				t.Fatalf("the host was asked %d times about the pool's scope", scopes.calls.Load())
			case !tc.verified && got.Status.ScopeVerification != nil:
				t.Fatalf("status.scopeVerification recorded: %+v", got.Status.ScopeVerification)
			}
			for _, s := range tc.says {
				if !strings.Contains(cond.Message, s) {
					t.Errorf("the message %q does not say %q", cond.Message, s)
				}
			}
		})
	}
}
