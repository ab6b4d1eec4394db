// Package why answers "why is my job not running?" from what the operator
// already records: CIJobs, the conditions of RunnerPools, MachineClaims,
// HypervisorMachineTemplates and HypervisorClusters, and the events the
// webhook receiver and the controllers write. Given a job (by id, by the
// URL its CI platform prints, or by its CIJob's name), a pool or a claim,
// Explain builds the chain from demand to VM (job -> pool -> template ->
// cluster -> claims -> VM) and names the one reason it is blocked, with
// the object and field that say so and the fix. It only reads: the
// functions here are pure over a World, which cmd/hyperfleet (`hyperfleet
// why`, `kubectl hyperfleet why`) fills from the API server.
//
// The reasons and where they are read from (docs/troubleshooting.md has an
// entry for each):
//
//   - no pool matches the job's labels: no CIJob, and a Warning event
//     NoMatchingRunnerPool (internal/webhook/receiver.go) on each pool in
//     the job's scope naming the labels its runners lack; or a CIJob whose
//     pool's runner labels (pkg/workload.RunnerLabels, as routing computes
//     them) no longer cover it; AmbiguousJobRouting events likewise;
//   - the pool's scope not verified: RunnerPool ScopeVerified False;
//   - the CI platform's rate limit: RunnerPool CapacityAvailable False or
//     MachineClaim Provisioned False, reason RateLimited; ScopeVerified
//     False ScopeCheckFailed whose message names the rate limit;
//   - template not ready: the template missing, or its Valid (else Ready)
//     condition False; RunnerPool CapacityAvailable TemplateInvalid;
//   - cluster down: HypervisorCluster Ready or Connected False;
//     CapacityAvailable or Provisioned ClusterUnavailable;
//   - pool at max: CapacityAvailable False AtMaxReplicas (status.replicas
//     against spec.scaling.maxReplicas), WaitingForTermination;
//   - quota: Provisioned False MaxMachinesReached (the cluster's
//     spec.limits.maxMachines);
//   - namespace quota: Provisioned or CapacityAvailable False
//     QuotaExceeded (the limit of spec.tenancy[i].limits the message
//     names, with the namespace's usage and the VM's need);
//   - no capacity: Provisioned False InsufficientCapacity, IPPoolExhausted;
//   - replacements held back: ReplacementBackoff / CapacityAvailable
//     ConsecutiveFailures;
//   - waiting on the hypervisor's task: MachineClaim Stuck True, or
//     Provisioned False BuildingVM with status.task;
//   - credential not delivered: Bootstrapped False with a credential
//     reason (CredentialNotDelivered, SecretStoreUnavailable ...).
package why

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// World is what Explain reads: the objects of the namespace (or
// namespaces) the question is about, as the API server returned them.
type World struct {
	Jobs      []hfv1.CIJob
	Pools     []hfv1.RunnerPool
	Claims    []hfv1.MachineClaim
	Templates []hfv1.HypervisorMachineTemplate
	Clusters  []hfv1.HypervisorCluster
	// Events are core/v1 Events about HyperFleet objects.
	Events []corev1.Event
	// Backends read a pool's runner labels as routing does; nil: the
	// labels of a recorded job are not compared with its pool's.
	Backends *workload.Backends
	// Now is the time ages are printed against.
	Now time.Time
}

// Link is one object of the chain from demand to VM.
type Link struct {
	// Kind is the object's kind (CIJob, RunnerPool, ...), or "VM".
	Kind string `json:"kind"`
	// Name is namespace/name, or the name of a cluster-scoped object.
	Name string `json:"name"`
	// State says what the object reports, in a few words.
	State string `json:"state"`
}

// Blocker is why the chain does not go on.
type Blocker struct {
	// Reason is the condition or event reason that decides it.
	Reason string `json:"reason"`
	// Object is the kind and name of the object that records it.
	Object string `json:"object"`
	// Field is where on Object it is recorded.
	Field string `json:"field"`
	// Message is what the operator wrote there, or what was compared.
	Message string `json:"message"`
	// Fix is what a platform engineer does about it.
	Fix string `json:"fix"`
	// Doc is the troubleshooting entry, relative to the repository.
	Doc string `json:"doc"`
}

// Report is the answer: the chain, and the blocker when there is one.
type Report struct {
	// Target is what was asked about.
	Target string `json:"target"`
	// Chain is the objects from demand to VM, in order.
	Chain []Link `json:"chain"`
	// Blocked is the reason the chain stops; nil when nothing blocks it.
	Blocked *Blocker `json:"blocked,omitempty"`
	// Verdict says what is happening when nothing blocks (running,
	// completed, starting ...).
	Verdict string `json:"verdict,omitempty"`
}

// troubleshooting is the document every Blocker links into.
const troubleshooting = "docs/troubleshooting.md"

// doc is the link to the entry of a reason: GitHub's anchor of its
// "#### <Reason>" heading.
func doc(anchor string) string { return troubleshooting + "#" + strings.ToLower(anchor) }

// Explain answers for target in w.
func Explain(w *World, t Target) Report {
	switch t.Kind {
	case TargetPool:
		return explainPool(w, t)
	case TargetClaim:
		return explainClaim(w, t)
	default:
		return explainJob(w, t)
	}
}

// nsName prints an object's namespace/name.
func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// age prints how long ago t was, rounded for a person.
func age(now, t time.Time) string {
	if t.IsZero() || now.IsZero() {
		return ""
	}
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		return d.Round(time.Minute).String()
	}
	return d.Round(time.Hour).String()
}

// list prints labels for a person.
func list(ss []string) string {
	if len(ss) == 0 {
		return "(none)"
	}
	return strings.Join(ss, ", ")
}

// plural is "1 claim", "2 claims".
func plural(n int, what string) string {
	if n == 1 {
		return fmt.Sprintf("1 %s", what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}
