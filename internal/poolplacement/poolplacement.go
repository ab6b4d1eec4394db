// Package poolplacement chooses, for a RunnerPool with more than one
// template (spec.templateRef, then spec.placement.templates), which
// template each new VM is built from, and says what state each template is
// in: the pool's overflow across clusters (docs/runnerpool.md, "Overflow
// across clusters"). Everything here is a pure function of what one pass
// observed: no clock, no memory between passes.
package poolplacement

import (
	"fmt"
	"strings"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Template is one of a pool's templates as a pass sees it. The first of a
// list is the pool's templateRef.
type Template struct {
	Name    string
	Cluster string
	State   hfv1.TemplatePlacementState
	// Message says why the template does not take new VMs.
	Message string
	// Machines counts the pool's unfinished claims built from it.
	Machines int
}

// Facts are what a pass observed of one template, from which its state
// follows (StateOf). The fields are in the order their state wins: a
// template that cannot build VMs for the pool is Invalid whatever its
// cluster says, a cluster that is not connected is Unreachable even when
// its last status said it was full.
type Facts struct {
	// Invalid says why the template cannot build VMs for the pool (it is
	// missing, not ready for a reason other than its cluster, or differs
	// from templateRef in its bootstrap or platform).
	Invalid string
	// Unreachable says why the template's cluster is not connected.
	Unreachable string
	// Full says why the cluster's status shows no room for a VM of the
	// template.
	Full string
	// Waiting counts the pool's claims on the template that wait to be
	// placed, by their Provisioned reason.
	Waiting map[hfv1.ConditionReason]int
}

// StateOf is the state of a template with facts f, and the message that
// says why when it is not Available.
func StateOf(f Facts) (hfv1.TemplatePlacementState, string) {
	waiting := func(reasons ...hfv1.ConditionReason) string {
		var parts []string
		for _, r := range reasons {
			if n := f.Waiting[r]; n > 0 {
				parts = append(parts, fmt.Sprintf("%d%s%s", n, claimsWait, r))
			}
		}
		return strings.Join(parts, ", ")
	}
	switch {
	case f.Invalid != "":
		return hfv1.TemplateInvalid, f.Invalid
	case f.Unreachable != "":
		return hfv1.TemplateUnreachable, f.Unreachable
	}
	if w := waiting(hfv1.ClusterUnavailableReason); w != "" {
		return hfv1.TemplateUnreachable, w
	}
	if f.Full != "" {
		return hfv1.TemplateFull, f.Full
	}
	if w := waiting(hfv1.MaxMachinesReachedReason, hfv1.InsufficientCapacityReason); w != "" {
		return hfv1.TemplateFull, w
	}
	if w := waiting(hfv1.QuotaExceededReason); w != "" {
		return hfv1.TemplateOverQuota, w
	}
	return hfv1.TemplateAvailable, ""
}

// claimsWait is in the message of a state the pool's waiting claims
// showed (StateOf), and in no message of a state the cluster's own status
// showed: Carry tells them apart by it.
const claimsWait = " of the pool's claims wait with "

// SpillReasons are the Provisioned reasons of an unplaced claim that a
// template other than its own may serve: its own cluster is full,
// unreachable or over quota, or its template not ready because of its
// cluster.
var SpillReasons = map[hfv1.ConditionReason]bool{
	hfv1.ClusterUnavailableReason:   true,
	hfv1.MaxMachinesReachedReason:   true,
	hfv1.InsufficientCapacityReason: true,
	hfv1.QuotaExceededReason:        true,
	hfv1.TemplateNotReadyReason:     true,
}

// Choose is the template the next new VM is built from, by index into
// ts: with pack the first Available one, with spread the Available one
// holding the fewest machines (ties to the first). Without an Available
// template it is 0, templateRef: the claim waits there, saying why, as a
// pool of one template does.
func Choose(strategy hfv1.PlacementStrategy, ts []Template) int {
	best := -1
	for j, t := range ts {
		if t.State != hfv1.TemplateAvailable {
			continue
		}
		if best < 0 {
			best = j
			if strategy != hfv1.PlacementSpread {
				break
			}
			continue
		}
		if t.Machines < ts[best].Machines {
			best = j
		}
	}
	return max(best, 0)
}

// Plan chooses the templates of n new VMs one after the other, counting
// each choice as a machine of its template (spread balances within the
// pass too). ts is updated.
func Plan(strategy hfv1.PlacementStrategy, ts []Template, n int) []int {
	out := make([]int, 0, n)
	for range n {
		i := Choose(strategy, ts)
		if len(ts) > 0 {
			ts[i].Machines++
		}
		out = append(out, i)
	}
	return out
}

// Spillable reports whether an unplaced claim of the template at index i,
// waiting with reason, should be replaced on another template: its own is
// not Available, it waits for a reason another cluster may not share, and
// some template is Available.
func Spillable(ts []Template, i int, reason hfv1.ConditionReason) bool {
	if i < 0 || i >= len(ts) || ts[i].State == hfv1.TemplateAvailable || !SpillReasons[reason] {
		return false
	}
	for _, t := range ts {
		if t.State == hfv1.TemplateAvailable {
			return true
		}
	}
	return false
}

// FirstUnavailable is the highest-priority template before index i that
// is not Available: the one a VM built from template i spilled from;
// -1 when none.
func FirstUnavailable(ts []Template, i int) int {
	for j := 0; j < i && j < len(ts); j++ {
		if ts[j].State != hfv1.TemplateAvailable {
			return j
		}
	}
	return -1
}

// Carry keeps the Full or OverQuota state a pass recorded (prev, from the
// pool's status) for a template whose facts now say Available only
// because the claims that showed it were spilled: without it the next new
// VM would go to the full template, wait there and be spilled again, one
// wasted placement per VM and a status flapping between Full and
// Available. The state holds until something observed can have made
// room: one of the pool's VMs on the template ended (machines, the
// pool's live claims on it now, fell below prev.Machines), or the
// cluster's status was refreshed after prev.Since (polled: its
// status.lastPollTime; zero when unknown). A state the cluster's own
// status showed is never carried. It reports the state and
// message to use, and whether they are prev's.
func Carry(prev *hfv1.TemplatePlacement, state hfv1.TemplatePlacementState, msg string, machines int, polled time.Time) (hfv1.TemplatePlacementState, string, bool) {
	if prev == nil || state != hfv1.TemplateAvailable || (prev.State != hfv1.TemplateFull && prev.State != hfv1.TemplateOverQuota) ||
		!strings.Contains(prev.Message, claimsWait) {
		// Only a state the waiting claims showed is carried: one the
		// cluster's status showed (no memory free, at maxMachines) is
		// observed again, or not, on every pass.
		return state, msg, false
	}
	if machines < int(prev.Machines) || prev.Since == nil || (!polled.IsZero() && polled.After(prev.Since.Time)) {
		return state, msg, false
	}
	return prev.State, prev.Message, true
}
