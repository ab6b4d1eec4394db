package why

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
)

var now = time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)

func cond(t hfv1.ConditionType, s metav1.ConditionStatus, r hfv1.ConditionReason, msg string) metav1.Condition {
	return metav1.Condition{Type: string(t), Status: s, Reason: string(r), Message: msg, LastTransitionTime: metav1.NewTime(now.Add(-time.Minute))}
}

// setCond replaces or adds c, as the controllers' conditions.Set does.
func setCond(conds *[]metav1.Condition, c metav1.Condition) {
	for i := range *conds {
		if (*conds)[i].Type == c.Type {
			(*conds)[i] = c
			return
		}
	}
	*conds = append(*conds, c)
}

func backends(t *testing.T) *workload.Backends {
	t.Helper()
	b, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitHubActions: github.NewBackend}, workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// healthyWorld is a namespace as the operator writes it when all is well:
// a connected cluster, a valid template, a verified pool with room, and
// one queued job routed to it.
func healthyWorld(t *testing.T) *World {
	t.Helper()
	cluster := hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "pve"}}
	cluster.Status.ConnectedNodes = 3
	cluster.Status.Nodes = make([]hfv1.NodeStatus, 3)
	cluster.Status.Conditions = []metav1.Condition{
		cond(hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "ready"),
		cond(hfv1.HypervisorClusterConnectedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "connected"),
	}
	tmpl := hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "ubuntu"},
		Spec: hfv1.HypervisorMachineTemplateSpec{HypervisorClusterRef: hfv1.ObjectName{Name: "pve"},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{Owner: "octo", Repository: "app"}}}}
	tmpl.Status.Conditions = []metav1.Condition{
		cond(hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "ready"),
		cond(hfv1.HypervisorMachineTemplateValidCondition, metav1.ConditionTrue, hfv1.ReadyReason, "valid"),
	}
	pool := githubPool("linux", "big")
	job := hfv1.CIJob{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "github-actions-4242"},
		Spec: hfv1.CIJobSpec{Platform: hfv1.WorkloadGitHubActions, JobID: 4242, Repository: "octo/app", Labels: []string{"self-hosted", "big"},
			RunnerPoolRef: hfv1.ObjectName{Name: "linux"}},
		Status: hfv1.CIJobStatus{State: hfv1.CIJobQueued, QueuedAt: &metav1.Time{Time: now.Add(-5 * time.Minute)}}}
	return &World{Jobs: []hfv1.CIJob{job}, Pools: []hfv1.RunnerPool{pool}, Templates: []hfv1.HypervisorMachineTemplate{tmpl},
		Clusters: []hfv1.HypervisorCluster{cluster}, Backends: backends(t), Now: now}
}

func githubPool(name string, labels ...string) hfv1.RunnerPool {
	pool := hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, Generation: 1},
		Spec: hfv1.RunnerPoolSpec{TemplateRef: hfv1.ObjectName{Name: "ubuntu"},
			Workload: hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: labels}},
			Scaling:  hfv1.Scaling{MinReplicas: 0, MaxReplicas: 4}}}
	pool.Status.Conditions = []metav1.Condition{
		cond(hfv1.ReadyCondition, metav1.ConditionTrue, hfv1.ReadyReason, "ready"),
		cond(hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionTrue, hfv1.ScopeVerifiedReason, "verified"),
		cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionTrue, hfv1.ReadyReason, "The pool can serve its demand"),
	}
	pool.Status.PendingJobs = 1
	return pool
}

// claim is a claim of pool linux as the claim controller leaves it
// building its VM on pve.
func claim(name string) hfv1.MachineClaim {
	c := hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name, CreationTimestamp: metav1.NewTime(now.Add(-10 * time.Minute))},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "ubuntu"}, RunnerPoolRef: &hfv1.ObjectName{Name: "linux"}}}
	c.Status.Phase = hfv1.MachineClaimProvisioning
	c.Status.VMRef = &hfv1.VMReference{HypervisorCluster: "pve", Node: "pve1", VMID: 101}
	return c
}

func pool0(w *World) *hfv1.RunnerPool { return &w.Pools[0] }

// TestExplain answers for a job, a pool or a claim in worlds written as
// the operator writes them, one per blocking reason, and checks the
// reason, the object and field named, and the troubleshooting entry.
//
// Mutations, each made in the product, the test run and the code
// restored (this test is new; there was no old one to compare with):
// Mutation: capacityBlocker returning the pool's condition without looking
// for the claim that reported it fails "no capacity" and "quota" (the
// object is the pool, not the claim). Mutation: scopeBlocker without its
// rate-limit case fails "rate limit (scope check)". Mutation:
// clusterBlocker reading Ready only fails "cluster down" (the reason is
// Ready's ClusterUnavailable, not Connected's Unreachable). Mutation: the
// labels of a recorded job not compared with its pool's fails "labels
// edited away". Mutation: claimBlocker ignoring Stuck fails "stuck on the
// hypervisor's task" and "stuck claim wins over a building one".
// Mutation: the credential reasons left out of claimBlocker fails
// "credential not delivered". Mutation: jobEvents matching "job 515" as a
// prefix of "job 5151" fails both "no pool matches" rows. Mutation: the
// at-max blocker naming only the condition, not spec.scaling.maxReplicas,
// fails "pool at max". Mutation: BuildingVM not reported with its task
// fails "waiting on the hypervisor's task".
func TestExplain(t *testing.T) {
	for _, tc := range []struct {
		name       string
		target     string
		mutate     func(*World)
		wantReason string
		wantObject string
		wantField  string
		wantIn     string // in the message
		wantDoc    string
	}{
		{name: "nothing blocks a queued job", target: "4242"},
		{name: "completed job", target: "4242", mutate: func(w *World) {
			w.Jobs[0].Status.State, w.Jobs[0].Status.Conclusion = hfv1.CIJobCompleted, "success"
		}},
		{name: "pool at max", target: "4242", mutate: atMax,
			wantReason: "AtMaxReplicas", wantObject: "RunnerPool team-a/linux", wantField: "spec.scaling.maxReplicas", wantIn: "status.replicas 4 of spec.scaling.maxReplicas 4",
			wantDoc: "docs/troubleshooting.md#atmaxreplicas"},
		{name: "pool at max, asked by job URL", target: "https://github.com/octo/app/actions/runs/99/job/4242", mutate: atMax,
			wantReason: "AtMaxReplicas", wantObject: "RunnerPool team-a/linux"},
		{name: "pool at max, asked by pool", target: "pool/linux", mutate: atMax,
			wantReason: "AtMaxReplicas", wantObject: "RunnerPool team-a/linux"},
		{name: "cluster down", target: "4242", mutate: func(w *World) {
			setCond(&w.Clusters[0].Status.Conditions, cond(hfv1.ReadyCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason, "not connected"))
			setCond(&w.Clusters[0].Status.Conditions, cond(hfv1.HypervisorClusterConnectedCondition, metav1.ConditionFalse, hfv1.UnreachableReason, "dial tcp 10.0.0.5:8006: connection refused"))
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.ClusterUnavailableReason, "1 starting VMs wait"))
		}, wantReason: "Unreachable", wantObject: "HypervisorCluster pve", wantField: "type=Connected", wantIn: "connection refused",
			wantDoc: "docs/troubleshooting.md#unreachable"},
		{name: "cluster missing", target: "4242", mutate: func(w *World) { w.Clusters = nil },
			wantReason: ReasonClusterNotFound, wantObject: "HypervisorMachineTemplate team-a/ubuntu", wantField: "spec.hypervisorClusterRef"},
		{name: "no capacity", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.InsufficientCapacityReason,
				"resource error: no allowed node has enough free capacity for 8192 MiB (pve1: 2048 MiB free)")}
			w.Claims = append(w.Claims, c)
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.InsufficientCapacityReason, "1 starting VMs wait: InsufficientCapacity"))
		}, wantReason: "InsufficientCapacity", wantObject: "MachineClaim team-a/linux-abc", wantField: "type=Provisioned", wantIn: "8192 MiB",
			wantDoc: "docs/troubleshooting.md#insufficientcapacity"},
		{name: "quota", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.MaxMachinesReachedReason,
				"resource error: HypervisorCluster pve holds spec.limits.maxMachines (10) VMs")}
			w.Claims = append(w.Claims, c)
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.MaxMachinesReachedReason, "1 starting VMs wait: MaxMachinesReached"))
		}, wantReason: "MaxMachinesReached", wantObject: "MachineClaim team-a/linux-abc", wantIn: "maxMachines", wantDoc: "docs/troubleshooting.md#maxmachinesreached"},
		{name: "namespace quota", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.VMRef = nil
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.QuotaExceededReason,
				"placing the VM would take namespace team-a over spec.tenancy[1].limits.memory of HypervisorCluster pve: limit 16Gi, in use 12Gi, this VM needs 8Gi; it is placed once a VM of the namespace on the cluster is destroyed")}
			w.Claims = append(w.Claims, c)
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.QuotaExceededReason, "1 starting VMs wait: QuotaExceeded"))
		}, wantReason: "QuotaExceeded", wantObject: "MachineClaim team-a/linux-abc", wantField: "spec.tenancy[1].limits.memory", wantIn: "in use 12Gi, this VM needs 8Gi",
			wantDoc: "docs/troubleshooting.md#quotaexceeded"},
		{name: "rate limit (pool)", target: "4242", mutate: func(w *World) {
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.RateLimitedReason, "1 starting VMs wait: RateLimited"))
		}, wantReason: "RateLimited", wantObject: "RunnerPool team-a/linux", wantField: "type=CapacityAvailable", wantDoc: "docs/troubleshooting.md#ratelimited"},
		{name: "rate limit (claim)", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.VMRef = nil
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.RateLimitedReason,
				"Waiting 12m0s for the CI platform's rate limit: rate limited by the CI platform")}
			w.Claims = append(w.Claims, c)
		}, wantReason: "RateLimited", wantObject: "MachineClaim team-a/linux-abc", wantIn: "12m0s"},
		{name: "rate limit (scope check)", target: "4242", mutate: func(w *World) {
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionFalse, hfv1.ScopeCheckFailedReason,
				"checking the scope: rate limited by the CI platform until 10:12"))
		}, wantReason: "RateLimited", wantObject: "RunnerPool team-a/linux", wantField: "type=ScopeVerified"},
		{name: "scope not reachable", target: "4242", mutate: func(w *World) {
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionFalse, hfv1.ScopeNotReachableReason, "the credentials cannot manage runners of octo/app"))
		}, wantReason: "ScopeNotReachable", wantObject: "RunnerPool team-a/linux", wantDoc: "docs/troubleshooting.md#scopenotreachable"},
		{name: "template not ready", target: "4242", mutate: func(w *World) {
			setCond(&w.Templates[0].Status.Conditions, cond(hfv1.HypervisorMachineTemplateValidCondition, metav1.ConditionFalse, hfv1.TemplateNotFoundReason, "template 9000 not found on pve"))
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.TemplateInvalidReason, "No new VMs: template invalid"))
		}, wantReason: "TemplateNotFound", wantObject: "HypervisorMachineTemplate team-a/ubuntu", wantField: "type=Valid", wantDoc: "docs/troubleshooting.md#templatenotfound"},
		{name: "template missing", target: "4242", mutate: func(w *World) { w.Templates = nil },
			wantReason: "TemplateNotReady", wantObject: "RunnerPool team-a/linux", wantField: "spec.templateRef"},
		{name: "waiting on the hypervisor's task", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.Task = &hfv1.TaskReference{ID: "UPID:pve1:0001:clone", Operation: "clone", StartTime: &metav1.Time{Time: now.Add(-2 * time.Minute)}}
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, "building")}
			w.Claims = append(w.Claims, c)
		}, wantReason: "BuildingVM", wantObject: "MachineClaim team-a/linux-abc", wantField: "status.task", wantIn: "UPID:pve1:0001:clone"},
		{name: "stuck on the hypervisor's task", target: "claim/linux-abc", mutate: stuck,
			wantReason: "NoProgress", wantObject: "MachineClaim team-a/linux-abc", wantField: "type=Stuck", wantIn: "UPID:pve1:0001:clone", wantDoc: "docs/troubleshooting.md#noprogress"},
		{name: "stuck claim wins over a building one", target: "4242", mutate: func(w *World) {
			c := claim("linux-aaa")
			c.Status.Task = &hfv1.TaskReference{ID: "UPID:pve1:0002:clone", Operation: "clone"}
			c.Status.Conditions = []metav1.Condition{cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, "building")}
			w.Claims = append(w.Claims, c)
			stuck(w)
		}, wantReason: "NoProgress", wantObject: "MachineClaim team-a/linux-abc"},
		{name: "credential not delivered", target: "4242", mutate: func(w *World) {
			c := claim("linux-abc")
			c.Status.Phase = hfv1.MachineClaimBootstrapping
			c.Status.Conditions = []metav1.Condition{
				cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionTrue, hfv1.ReadyReason, "VM running"),
				cond(hfv1.MachineClaimBootstrappedCondition, metav1.ConditionFalse, hfv1.CredentialNotDeliveredReason, "guest agent of VM 101 not answering"),
			}
			w.Claims = append(w.Claims, c)
		}, wantReason: "CredentialNotDelivered", wantObject: "MachineClaim team-a/linux-abc", wantField: "type=Bootstrapped", wantDoc: "docs/troubleshooting.md#credentialnotdelivered"},
		{name: "no pool matches the job's labels", target: "https://github.com/octo/app/actions/runs/7/job/5151", mutate: noMatchEvents,
			wantReason: webhook.ReasonNoMatchingRunnerPool, wantObject: "RunnerPool team-a/linux", wantIn: "RunnerPool team-a/linux lacks gpu",
			wantDoc: "docs/troubleshooting.md#why-is-my-job-not-running"},
		{name: "no pool matches (another job's event)", target: "515", mutate: noMatchEvents, wantReason: ReasonJobNotRecorded},
		{name: "labels edited away", target: "job/github-actions-4242", mutate: func(w *World) {
			w.Jobs[0].Spec.Labels = []string{"self-hosted", "gpu"}
			w.Pools = append(w.Pools, githubPool("gpu", "gpu"))
		}, wantReason: webhook.ReasonNoMatchingRunnerPool, wantObject: "RunnerPool team-a/linux", wantField: "spec.workload.github (labels)", wantIn: "lack gpu"},
		{name: "ambiguous", target: "6161", mutate: func(w *World) {
			w.Events = append(w.Events, poolEvent("linux", string(hfv1.AmbiguousJobRoutingReason),
				"queued job 6161 of octo/app (runs-on: self-hosted) is covered as specifically by RunnerPools team-a/linux, team-a/other; none scales for it."))
		}, wantReason: "AmbiguousJobRouting", wantObject: "RunnerPool team-a/linux"},
		{name: "job not recorded", target: "777", mutate: func(w *World) {
			setCond(&pool0(w).Status.Conditions, cond(hfv1.RunnerPoolScopeVerifiedCondition, metav1.ConditionFalse, hfv1.ScopeNotReachableReason, "no"))
		}, wantReason: ReasonJobNotRecorded, wantIn: "team-a/linux (ScopeNotReachable)"},
		{name: "pool deleted under its job", target: "4242", mutate: func(w *World) { w.Pools = nil },
			wantReason: ReasonRunnerPoolNotFound, wantObject: "CIJob team-a/github-actions-4242", wantField: "spec.runnerPoolRef"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := healthyWorld(t)
			if tc.mutate != nil {
				tc.mutate(w)
			}
			r, text := explainText(t, w, tc.target)
			t.Log("\n" + text.String())
			if tc.wantReason == "" {
				if r.Blocked != nil || r.Verdict == "" {
					t.Fatalf("want no blocker and a verdict, got:\n%s", text.String())
				}
				return
			}
			b := r.Blocked
			if b == nil {
				t.Fatalf("want blocked by %s, got:\n%s", tc.wantReason, text.String())
			}
			for what, pair := range map[string][2]string{"reason": {b.Reason, tc.wantReason}, "object": {b.Object, tc.wantObject},
				"field": {b.Field, tc.wantField}, "message": {b.Message, tc.wantIn}, "doc": {b.Doc, tc.wantDoc}} {
				if got, want := pair[0], pair[1]; !strings.Contains(got, want) || (what == "reason" && got != want) {
					t.Errorf("%s: got %q, want %q\n%s", what, got, want, text.String())
				}
			}
			if b.Fix == "" {
				t.Errorf("no fix:\n%s", text.String())
			}
			lines := strings.Split(strings.TrimSpace(text.String()), "\n")
			if len(lines) != len(r.Chain)+4 || !strings.HasPrefix(lines[len(r.Chain)], "BLOCKED "+tc.wantReason+":") {
				t.Errorf("want one line per link, then the blocker, its message, fix and entry:\n%s", text.String())
			}
		})
	}
}

func atMax(w *World) {
	p := pool0(w)
	p.Status.Replicas, p.Status.BusyReplicas, p.Status.PendingJobs = 4, 4, 2
	setCond(&p.Status.Conditions, cond(hfv1.RunnerPoolCapacityCondition, metav1.ConditionFalse, hfv1.AtMaxReplicasReason,
		"Demand needs more than spec.scaling.maxReplicas (4) allows: 2 pending jobs, 4 busy, 0 failed VMs retained; raise maxReplicas or wait"))
}

func stuck(w *World) {
	c := claim("linux-abc")
	c.Status.Task = &hfv1.TaskReference{ID: "UPID:pve1:0001:clone", Operation: "clone"}
	c.Status.Conditions = []metav1.Condition{
		cond(hfv1.MachineClaimProvisionedCondition, metav1.ConditionFalse, hfv1.BuildingVMReason, "building"),
		cond(hfv1.MachineClaimStuckCondition, metav1.ConditionTrue, hfv1.NoProgressReason, "In phase Provisioning for 16m, longer than 15m"),
	}
	w.Claims = append(w.Claims, c)
}

// noMatchEvents are what the webhook receiver writes for queued job 5151
// no pool covers (internal/webhook/receiver.go warnUnmatched).
func noMatchEvents(w *World) {
	w.Events = append(w.Events,
		poolEvent("linux", webhook.ReasonNoMatchingRunnerPool, "queued job 5151 of octo/app (runs-on: self-hosted, gpu) matches no RunnerPool; this pool's runners lack: gpu"),
		poolEvent("arm", webhook.ReasonNoMatchingRunnerPool, "queued job 5151 of octo/app (runs-on: self-hosted, gpu) matches no RunnerPool; this pool's runners lack: gpu"))
}

func poolEvent(pool, reason, msg string) corev1.Event {
	return corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: pool + ".1"},
		InvolvedObject: corev1.ObjectReference{Kind: "RunnerPool", Namespace: "team-a", Name: pool, APIVersion: hfv1.GroupVersion.String()},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning, LastTimestamp: metav1.NewTime(now.Add(-time.Minute))}
}

// TestParseTarget reads what users paste: job ids, the URLs of a job's
// page on each platform, and kind/name.
func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want Target
	}{
		{"4242", Target{Kind: TargetJob, JobID: "4242"}},
		{"https://github.com/octo/app/actions/runs/99/job/4242", Target{Kind: TargetJob, JobID: "4242", Platform: hfv1.WorkloadGitHubActions, Repository: "octo/app"}},
		{"https://ghes.example.com/octo/app/actions/runs/99/attempts/2/job/4243?pr=1", Target{Kind: TargetJob, JobID: "4243", Platform: hfv1.WorkloadGitHubActions, Repository: "octo/app"}},
		{"https://github.com/octo/app/runs/4244", Target{Kind: TargetJob, JobID: "4244", Platform: hfv1.WorkloadGitHubActions, Repository: "octo/app"}},
		{"https://gitlab.com/acme/platform/app/-/jobs/987", Target{Kind: TargetJob, JobID: "987", Platform: hfv1.WorkloadGitLabCI, Repository: "acme/platform/app"}},
		{"https://buildkite.com/acme/app/builds/12#0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Target{Kind: TargetJob, JobID: "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", Platform: hfv1.WorkloadBuildkite, Repository: "acme/app"}},
		{"https://buildkite.com/acme/app/builds/12/steps?jid=0190a1b2-0000", Target{Kind: TargetJob, JobID: "0190a1b2-0000", Platform: hfv1.WorkloadBuildkite, Repository: "acme/app"}},
		{"pool/linux", Target{Kind: TargetPool, Name: "linux"}},
		{"runnerpool/linux", Target{Kind: TargetPool, Name: "linux"}},
		{"claim/linux-abc", Target{Kind: TargetClaim, Name: "linux-abc"}},
		{"job/github-actions-4242", Target{Kind: TargetJob, Name: "github-actions-4242"}},
	} {
		got, err := ParseTarget(tc.arg, "")
		if err != nil || got != tc.want {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", tc.arg, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "pod/x", "pool/", "https://github.com/octo/app", "https://buildkite.com/acme/app/builds/12", "4242/x/y", "a b"} {
		if got, err := ParseTarget(bad, ""); err == nil {
			t.Errorf("ParseTarget(%q) = %+v, want an error", bad, got)
		}
	}
}

// TestReportJSON: -o json carries the chain and the blocker with their
// field names, for scripts.
func TestReportJSON(t *testing.T) {
	w := healthyWorld(t)
	atMax(w)
	tgt, err := ParseTarget("4242", "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(Explain(w, tgt))
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Chain   []map[string]string `json:"chain"`
		Blocked map[string]string   `json:"blocked"`
	}
	if err := json.Unmarshal(raw, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Chain) != 4 || back.Chain[0]["kind"] != "CIJob" || back.Blocked["reason"] != "AtMaxReplicas" || back.Blocked["fix"] == "" {
		t.Fatalf("JSON report: %s", raw)
	}
}

// TestSummarize: `hyperfleet status` shows each pool's numbers and Ready
// reason (with CapacityAvailable's when False) and each cluster's
// connection and nodes.
func TestSummarize(t *testing.T) {
	w := healthyWorld(t)
	atMax(w)
	pool0(w).Status.ReadyReplicas, pool0(w).Status.DesiredReplicas = 4, 4
	setCond(&w.Clusters[0].Status.Conditions, cond(hfv1.HypervisorClusterConnectedCondition, metav1.ConditionFalse, hfv1.UnreachableReason, "down"))
	s := Summarize(w)
	want := PoolStatus{Namespace: "team-a", Name: "linux", Ready: 4, Min: 0, Max: 4, Desired: 4, Busy: 4, Queued: 2, Reason: "Ready/AtMaxReplicas"}
	if len(s.Pools) != 1 || s.Pools[0] != want {
		t.Errorf("pools: got %+v, want %+v", s.Pools, want)
	}
	if len(s.Clusters) != 1 || s.Clusters[0] != (ClusterStatus{Name: "pve", Connected: "False", Nodes: 3, NodesSeen: 3, Reason: "Ready"}) {
		t.Errorf("clusters: got %+v", s.Clusters)
	}
	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "Ready/AtMaxReplicas") || !strings.Contains(text.String(), "3/3") {
		t.Errorf("text:\n%s", text.String())
	}
}

// TestExplainOverflow: a pool with spec.placement shows its placement
// table, and its templateRef's cluster being down blocks nothing while
// another template takes the pool's VMs; when none does, it blocks again.
// Mutation: overflowed returning its blocker unchanged fails "spilled".
func TestExplainOverflow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		other      hfv1.TemplatePlacementState
		wantReason string
	}{
		{name: "spilled", other: hfv1.TemplateAvailable},
		{name: "nowhere to spill", other: hfv1.TemplateFull, wantReason: "Unreachable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := healthyWorld(t)
			setCond(&w.Clusters[0].Status.Conditions, cond(hfv1.HypervisorClusterConnectedCondition, metav1.ConditionFalse, hfv1.UnreachableReason, "connection refused"))
			p := pool0(w)
			p.Spec.Placement = &hfv1.PoolPlacement{Strategy: hfv1.PlacementPack, Templates: []hfv1.ObjectName{{Name: "ubuntu-b"}}}
			p.Status.Placement = []hfv1.TemplatePlacement{
				{Name: "ubuntu", HypervisorCluster: "pve", Machines: 1, State: hfv1.TemplateUnreachable, Message: "HypervisorCluster pve is not connected: connection refused"},
				{Name: "ubuntu-b", HypervisorCluster: "pve-b", Machines: 2, State: tc.other},
			}
			r, text := explainText(t, w, "pool/linux")
			out := text.String()
			for _, want := range []string{"Placement", "team-a/ubuntu", "Unreachable on HypervisorCluster pve; 1 VM: HypervisorCluster pve is not connected",
				"team-a/ubuntu-b", string(tc.other) + " on HypervisorCluster pve-b; 2 VMs"} {
				if !strings.Contains(out, want) {
					t.Errorf("report lacks %q:\n%s", want, out)
				}
			}
			switch {
			case tc.wantReason == "" && r.Blocked != nil:
				t.Errorf("blocked while another template takes VMs:\n%s", out)
			case tc.wantReason != "" && (r.Blocked == nil || r.Blocked.Reason != tc.wantReason):
				t.Errorf("want blocked by %s:\n%s", tc.wantReason, out)
			}
		})
	}
}

// explainText explains target in w, and the report as WriteText prints it.
func explainText(t *testing.T, w *World, target string) (Report, *bytes.Buffer) {
	t.Helper()
	tg, err := ParseTarget(target, "")
	if err != nil {
		t.Fatal(err)
	}
	r := Explain(w, tg)
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	return r, &text
}
