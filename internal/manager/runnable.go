package manager

import (
	"context"

	"github.com/go-logr/logr"
	ctrl "sigs.k8s.io/controller-runtime"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"
)

// loggedRunnable starts a runnable with the manager's logger in its
// context. controller-runtime hands its controllers the manager's logger,
// but a runnable's Start gets a context without one, so its
// ctrl.LoggerFrom(ctx) falls back to the process-wide logger
// (ctrl.SetLogger): the binary sets it, an embedding of Setup (the
// operator the controller tests start, with its own log) need not, and the
// resync's, sweeper's and listeners' lines would be lost there.
type loggedRunnable struct {
	crmanager.Runnable
	log logr.Logger
}

// withManagerLogger wraps r so that it logs through mgr's logger.
func withManagerLogger(mgr ctrl.Manager, r crmanager.Runnable) crmanager.Runnable {
	return loggedRunnable{Runnable: r, log: mgr.GetLogger()}
}

// Start implements manager.Runnable.
func (r loggedRunnable) Start(ctx context.Context) error {
	return r.Runnable.Start(ctrl.LoggerInto(ctx, r.log))
}

// NeedLeaderElection keeps the wrapped runnable's answer; one that does not
// say runs on the leader only, as controller-runtime would run it.
func (r loggedRunnable) NeedLeaderElection() bool {
	if l, ok := r.Runnable.(crmanager.LeaderElectionRunnable); ok {
		return l.NeedLeaderElection()
	}
	return true
}
