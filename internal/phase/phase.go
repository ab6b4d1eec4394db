// Package phase is the one step type every HyperFleet reconciler runs its
// phases with (docs/architecture.md, "One skeleton for every reconciler"): a
// phase answers with a Result (Next, Recheck, Stop, StopAndRequeue), and Run
// runs a scope's phase list in order until one stops or fails, keeping the
// soonest requeue any of them asked for.
//
// A reconcile opens a scope (the object, what it depends on, one patch
// helper), runs an ordered list of phases against it, and closes the scope,
// which derives the status and writes the object once. A phase, and every
// service a phase calls, answers with a Result: go on to the next phase
// (Next), go on but look again within some time (Recheck), or end the pass
// here (Stop, StopAndRequeue). The answer is a value with a name, never a
// bare bool, so that "go on" cannot mean "stop" somewhere else.
package phase

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Result is what one phase decided.
type Result struct {
	// stop ends the pass after this phase.
	stop bool
	// after is when to reconcile again; zero: no wish. For a phase that
	// goes on it is a wish the pass keeps (the shortest one wins); for
	// the phase that stops it is the pass's requeue.
	after time.Duration
}

// Next lets the following phase run in the same pass.
func Next() Result { return Result{} }

// Recheck lets the following phase run, and asks for the object to be
// reconciled again within d (d <= 0: no wish).
func Recheck(d time.Duration) Result { return Result{after: max(d, 0)} }

// Stop ends the pass; the object is reconciled again on its next event.
func Stop() Result { return Result{stop: true} }

// StopAndRequeue ends the pass and reconciles the object again after d
// (d <= 0: on its next event only).
func StopAndRequeue(d time.Duration) Result { return Result{stop: true, after: max(d, 0)} }

// FromCtrl turns a controller-runtime result into a Stop: for a phase that
// hands over to code still speaking ctrl.Result.
func FromCtrl(res ctrl.Result) Result { return StopAndRequeue(res.RequeueAfter) }

// Stopped reports whether the pass ends here.
func (r Result) Stopped() bool { return r.stop }

// After is when the object wants to be reconciled again (zero: no wish).
func (r Result) After() time.Duration { return r.after }

// Sooner returns the result with the earlier of r's and d's wishes.
func (r Result) Sooner(d time.Duration) Result {
	r.after = Soonest(r.after, d)
	return r
}

// Soonest is the shortest of the non-zero durations, zero if none is.
func Soonest(ds ...time.Duration) time.Duration {
	var out time.Duration
	for _, d := range ds {
		if d > 0 && (out == 0 || d < out) {
			out = d
		}
	}
	return out
}

// Func is one phase of a reconcile of scope S.
type Func[S any] func(ctx context.Context, s S) (Result, error)

// Run runs phases in order until one stops the pass or fails, and returns
// the pass's controller-runtime result: the soonest requeue any phase that
// ran asked for. An error ends the pass at once; its requeue is the
// controller's backoff, so no result accompanies it.
func Run[S any](ctx context.Context, s S, phases ...Func[S]) (ctrl.Result, error) {
	res, err := Sequence(phases...)(ctx, s)
	if err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: res.after}, nil
}

// Sequence is phases as one phase, for a list a reconciler chooses during
// the pass (the MachineClaim's list for its state): they run in order until
// one stops or fails; the Result stops when one of them stopped, and keeps
// the soonest wish of those that ran.
func Sequence[S any](phases ...Func[S]) Func[S] {
	return func(ctx context.Context, s S) (Result, error) {
		var after time.Duration
		for _, p := range phases {
			res, err := p(ctx, s)
			if err != nil {
				return Result{}, err
			}
			after = Soonest(after, res.after)
			if res.stop {
				return Result{stop: true, after: after}, nil
			}
		}
		return Result{after: after}, nil
	}
}
