package sweeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// RunnerScope is one CI platform scope (a repository or organization, with
// the credentials of a template) whose runners the sweep checks.
type RunnerScope struct {
	// Key names the scope in metrics and logs; scopes with equal keys are
	// swept once.
	Key string
	// Provider lists and removes the scope's runners.
	Provider workload.Provider
	// EventObject receives the scope's events: the RunnerPool or
	// HypervisorMachineTemplate the scope comes from.
	EventObject client.Object
}

// RunnerScopes lists the scopes to sweep (implemented by the controllers'
// side of the CI platforms, internal/workloads).
type RunnerScopes interface {
	RunnerScopes(ctx context.Context) ([]RunnerScope, error)
}

// orphanRunner is a runner of this install seen without a live claim.
type orphanRunner struct {
	firstSeen time.Time
	runner    workload.Runner
}

// liveRunners is what the claims say about runners: the names they
// recorded and the UID prefixes default runner names end with.
type liveRunners struct {
	names   map[string]bool
	uidPart map[string]bool
}

func runnersOf(claims []hfv1.MachineClaim) liveRunners {
	l := liveRunners{names: map[string]bool{}, uidPart: map[string]bool{}}
	for i := range claims {
		c := &claims[i]
		if b := c.Status.Bootstrap; b != nil && b.RunnerName != "" {
			l.names[b.RunnerName] = true
		}
		uid := strings.ReplaceAll(string(c.UID), "-", "")
		l.uidPart[uid[:min(8, len(uid))]] = true
	}
	return l
}

// has reports whether a claim may still own the runner: one recorded its
// name, or the name's base ends with the UID prefix of one (a runner
// registered before its claim's status recorded it).
func (l liveRunners) has(name, base string) bool {
	if l.names[name] {
		return true
	}
	i := strings.LastIndexByte(base, '-')
	return l.uidPart[base[i+1:]]
}

// sweepRunners removes, in every scope, the runners whose name verifies as
// this install's (ownership.Signer.RunnerName), that are not busy, whose
// claim exists neither in the cache nor, when about to be removed, on the
// API server, and that have been seen so for the grace period. Runners
// named by anyone else, including users through
// workloadConfig.github.runnerName, are never touched.
func (s *Sweeper) sweepRunners(ctx context.Context, live liveRunners, confirm func() ([]hfv1.MachineClaim, error)) {
	if s.Runners == nil || s.Signer == nil {
		return
	}
	log := ctrl.LoggerFrom(ctx)
	scopes, err := s.Runners.RunnerScopes(ctx)
	if err != nil {
		log.Error(err, "List the CI scopes for the runner sweep")
	}
	seen := map[string]bool{}
	for _, sc := range scopes {
		if seen[sc.Key] {
			continue
		}
		seen[sc.Key] = true
		if err := s.sweepScope(ctx, sc, live, confirm); err != nil {
			log.Error(err, "Runner sweep failed", "scope", sc.Key)
		}
	}
}

func (s *Sweeper) sweepScope(ctx context.Context, sc RunnerScope, live liveRunners, confirm func() ([]hfv1.MachineClaim, error)) error {
	runners, err := sc.Provider.ListRunners(ctx, "")
	if err != nil {
		return fmt.Errorf("list the runners of %s: %w", sc.Key, err)
	}
	metrics.SweepingRunnerScope(sc.Key)
	now := s.Clock.Now()
	listed := map[string]bool{}
	for _, r := range runners {
		base, ours := s.Signer.VerifyRunnerName(r.Name)
		if !ours {
			continue
		}
		k := sc.Key + "/" + r.Name
		listed[k] = true
		if live.has(r.Name, base) || r.State == workload.RunnerBusy {
			// A busy runner's job may be a claim's last one; it becomes a
			// candidate again once idle or offline.
			forget(s, s.runners, k)
			continue
		}
		o := s.orphanRunner(ctx, sc, k, r, now)
		remove, err := removable(s, s.runners, k, o.firstSeen, now, confirm,
			func(claims []hfv1.MachineClaim) bool { return runnersOf(claims).has(r.Name, base) })
		if err != nil {
			return err
		}
		if !remove {
			continue
		}
		if err := s.removeRunner(ctx, sc, k, r); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "Remove orphaned runner", "scope", sc.Key, "runner", r.Name)
		}
	}
	forgetUnlisted(s, s.runners, sc.Key+"/", listed, nil)
	return nil
}

func (s *Sweeper) orphanRunner(ctx context.Context, sc RunnerScope, k string, r workload.Runner, now time.Time) *orphanRunner {
	o, first := sighting(s, s.runners, k, func() *orphanRunner { return &orphanRunner{firstSeen: now, runner: r} })
	if !first {
		return o
	}
	metrics.OrphanRunnersFound.WithLabelValues(sc.Key).Inc()
	mode := s.graceMode("it", "removed")
	ctrl.LoggerFrom(ctx).Info("Found a runner without a MachineClaim", "scope", sc.Key, "runner", r.Name, "runnerID", r.ID, "state", r.State, "dryRun", s.DryRun)
	s.recordOn(sc.EventObject, corev1.EventTypeWarning, "OrphanRunnerFound",
		fmt.Sprintf("Runner %s (id %d, %s) in %s has no MachineClaim; %s", r.Name, r.ID, r.State, sc.Key, mode))
	return o
}

// removeRunner deregisters an orphaned runner. The platform refuses a
// runner that took a job meanwhile (ErrRunnerBusy); it stays.
func (s *Sweeper) removeRunner(ctx context.Context, sc RunnerScope, k string, r workload.Runner) error {
	err := sc.Provider.DeregisterRunner(ctx, r.ID, r.Name)
	if errors.Is(err, workload.ErrRunnerBusy) {
		forget(s, s.runners, k)
		ctrl.LoggerFrom(ctx).Info("Orphaned runner took a job; leaving it until it is idle", "scope", sc.Key, "runner", r.Name)
		return nil
	}
	if err != nil {
		return err
	}
	forget(s, s.runners, k)
	metrics.OrphanRunnersRemoved.WithLabelValues(sc.Key).Inc()
	s.recordOn(sc.EventObject, corev1.EventTypeNormal, "OrphanRunnerRemoved", fmt.Sprintf("Removed runner %s (id %d) of a deleted claim from %s", r.Name, r.ID, sc.Key))
	ctrl.LoggerFrom(ctx).Info("Removed orphaned runner", "scope", sc.Key, "runner", r.Name, "runnerID", r.ID)
	return nil
}

func (s *Sweeper) recordOn(obj client.Object, typ, reason, msg string) {
	if s.Recorder == nil || obj == nil {
		return
	}
	s.Recorder.Event(obj, typ, reason, msg)
}

// OrphanRunners returns the runners currently known as orphans, as
// "scope/name".
func (s *Sweeper) OrphanRunners() []string { return known(s, s.runners) }
