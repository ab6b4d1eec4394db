// Package refusal finds the fields of an object that the API server accepts
// but this operator does not act on (not implemented yet, or not supported
// in this combination), so that each reconciler refuses the object with a
// reason and a message that names the field and the way out.
package refusal

import (
	"fmt"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// A Refusal is a field the API server accepts but this operator does not
// act on (not implemented yet, or not supported in this combination). The
// object carrying it is refused at reconcile time, with Ready=False, the
// refusal's reason and a message that names the field and the way out,
// before any VM is cloned or any credential issued: an accepted field
// either works as documented or is refused (docs/security.md, "An honest
// API"). Not-yet-implemented features are refused here rather than by CEL
// so that the API stays the same when they are implemented.
type Refusal struct {
	Reason  hfv1.ConditionReason
	Message string
}

// Template is the first field of tmpl this operator does not act
// on, or nil.
func Template(ws *workload.Backends, tmpl *hfv1.HypervisorMachineTemplate) *Refusal {
	if _, t, ok := ws.Template(tmpl); ok && t.Runner.OS != "linux" && t.Runner.OS != "win" {
		// The operator renders user data for cloud-init (a systemd unit)
		// and cloudbase-init (a Windows service) only (docs/cloud-init.md,
		// docs/windows.md); win needs spec.guest.os windows (CEL).
		return &Refusal{hfv1.UnsupportedReason, fmt.Sprintf(
			"%s.runner.os: %s is not supported: the HyperFleet agent runs on Linux (systemd) and Windows (spec.guest.os windows) VMs only; set os: linux (or remove it) and use a Linux template", t.Field, t.Runner.OS)}
	}

	return nil
}

// Pool is the first field of pool this operator does not act on,
// or nil: a workload type no registered back-end serves. The operator
// binary registers a back-end for every type the API takes
// (cmd/hyperfleet); a build that leaves one out (tests, a trimmed binary)
// refuses its pools here rather than build VMs that would run no runner.
func Pool(ws *workload.Backends, pool *hfv1.RunnerPool) *Refusal {
	if t := pool.Spec.Workload.Type; !served(ws, t) {
		return &Refusal{hfv1.NotImplementedReason, fmt.Sprintf(
			"spec.workload.type: %s is not served by this operator build (no back-end registered for it); %s", t, servedTypes(ws))}
	}
	return nil
}

// Claim is the first field of claim this operator does not act
// on, or nil: as Pool, a workload type no registered back-end serves.
func Claim(ws *workload.Backends, claim *hfv1.MachineClaim) *Refusal {
	if wc := claim.Spec.WorkloadConfig; wc != nil && !served(ws, wc.Type) {
		return &Refusal{hfv1.NotImplementedReason, fmt.Sprintf(
			"spec.workloadConfig.type: %s is not served by this operator build (no back-end registered for it); %s, or remove spec.workloadConfig", wc.Type, servedTypes(ws))}
	}
	return nil
}

// served reports whether a back-end serves workload type t.
func served(ws *workload.Backends, t hfv1.WorkloadType) bool {
	_, ok := ws.For(t)
	return ok
}

// servedTypes says which workload types this build serves, as the way
// out of a refusal: "this operator serves github-actions, generic: set
// type: github-actions or generic".
func servedTypes(ws *workload.Backends) string {
	types := ws.Types()
	if len(types) == 0 {
		return "this operator runs no CI platform"
	}
	names := make([]string, len(types))
	for i, t := range types {
		names[i] = string(t)
	}
	return fmt.Sprintf("this operator serves %s: set type: %s", strings.Join(names, ", "), strings.Join(names, " or "))
}
