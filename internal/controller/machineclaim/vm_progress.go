package machineclaim

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// The provider's progress has two parts, kept in two places. Where the VM
// is (its id and node) is persisted in the claim's status (status.vmRef):
// a restarted operator must find its VM. The hypervisor task in flight is
// kept in the reconciler's memory only (claimMemory.progress): writing each
// task reference was one status write per hypervisor task (clone, upload,
// start, boot, stop, destroy: six per job), read by nobody but a restarted
// operator, and a restarted operator does without them, as the provider
// contract requires (pkg/provider, "Never block"): given a Progress without
// its task, a provider reads where the VM stands and goes on from there.
// status.task is no longer written; a value an older operator wrote is
// read once (Progress) and cleared by the next status write.

// Progress is the provider progress persisted in the claim's status.
// Building is not a field of its own: it is recorded by the Provisioned
// condition, which says BuildingVM once the provider reported the build
// under way (vm.go), and True once the VM ran.
func Progress(claim *hfv1.MachineClaim) provider.Progress {
	var p provider.Progress
	if ref := claim.Status.VMRef; ref != nil {
		p.ID, p.Node = provider.ID(ref.ID()), ref.Node
		if c := hfv1.FindCondition(claim.Status.Conditions, hfv1.MachineClaimProvisionedCondition); c != nil {
			p.Building = c.Reason == string(hfv1.BuildingVMReason) || c.Status == metav1.ConditionTrue
		}
	}
	if t := claim.Status.Task; t != nil {
		p.Task = &provider.Task{ID: t.ID, Operation: t.Operation}
		if t.StartTime != nil {
			p.Task.StartTime = t.StartTime.Time
		}
	}
	return p
}

// progressOf is the claim's provider progress: the one this process kept
// for the VM its status records (with its task in flight), else the
// persisted one (Progress).
func (m *claimMemory) progressOf(claim *hfv1.MachineClaim) provider.Progress {
	p := Progress(claim)
	if kept := m.recall(claim.UID).progress; kept != nil && p.ID != "" && kept.ID == p.ID {
		return *kept
	}
	return p
}

// recordProgress keeps the provider's progress: the VM's location in the
// claim's status (persisted by the scope's status write, before anything
// waits on it), the task in memory (progressOf). It reports a clone
// request once, and logs each new task: the task in flight is in
// the log and, once the claim is stuck, in its Stuck condition, not in its
// status.
func (s *claimScope) recordProgress(ctx context.Context, cluster string, prev, next provider.Progress) {
	claim := s.claim
	if next.ID == "" {
		claim.Status.VMRef = nil
	} else {
		claim.Status.VMRef = hfv1.NewVMReference(cluster, string(next.ID), next.Node)
	}
	s.memory.keepProgress(claim.UID, next)
	claim.Status.Task = nil
	if t := next.Task; t != nil && (prev.Task == nil || prev.Task.ID != t.ID) {
		ctrl.LoggerFrom(ctx).Info("Hypervisor task started", "vm", next.ID, "node", next.Node, "operation", t.Operation, "task", t.ID)
		if t.Operation == "clone" {
			metrics.CreatedToCloneRequest.Observe(s.clock.Since(claim.CreationTimestamp.Time).Seconds())
		}
	}
	if prev.ID != "" && next.ID != "" && prev.ID != next.ID {
		ctrl.LoggerFrom(ctx).Info("VM id changed (the previous one was taken)", "previousVM", prev.ID, "vm", next.ID)
	}
}

// keepTask keeps t as the claim's task in flight, its VM unchanged (a
// step that reports a task but not where the VM is, such as removing its
// cloud-init media).
func (m *claimMemory) keepTask(claim *hfv1.MachineClaim, t *provider.Task) {
	p := m.progressOf(claim)
	claim.Status.Task = nil
	if p.ID == "" {
		return
	}
	p.Task = t
	m.keepProgress(claim.UID, p)
}

// forgetProgress drops the claim's kept progress (its VM is gone).
func (m *claimMemory) forgetProgress(claim *hfv1.MachineClaim) {
	m.keepProgress(claim.UID, provider.Progress{})
}

// taskInFlight says which hypervisor task the claim waits on, for its
// Stuck condition; "" without one.
func (m *claimMemory) taskInFlight(claim *hfv1.MachineClaim) string {
	if t := m.progressOf(claim).Task; t != nil {
		return fmt.Sprintf("hypervisor task %s (%s)", t.Operation, t.ID)
	}
	return ""
}

// vmRefOf is the provider's reference of the VM ref records; a reference
// written before providerID existed reads as its Proxmox ID
// (hfv1.VMReference.ID).
func vmRefOf(ref *hfv1.VMReference) provider.VMRef {
	return provider.VMRef{ID: provider.ID(ref.ID()), Node: ref.Node}
}
