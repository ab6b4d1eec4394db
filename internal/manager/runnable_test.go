package manager

import (
	"context"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	ctrl "sigs.k8s.io/controller-runtime"
	crmanager "sigs.k8s.io/controller-runtime/pkg/manager"
)

type plainRunnable struct{}

func (p plainRunnable) Start(ctx context.Context) error {
	ctrl.LoggerFrom(ctx).Info("started")
	return nil
}

type nonLeaderRunnable struct{ plainRunnable }

func (nonLeaderRunnable) NeedLeaderElection() bool { return false }

// TestLoggedRunnable: the wrapped runnable logs through the logger it was
// given, and keeps its leader election answer (a runnable that does not
// say runs on the leader only, as controller-runtime runs it), so that the
// wrapper never moves the resync onto every replica nor the metrics
// collector onto the leader alone.
func TestLoggedRunnable(t *testing.T) {
	var lines []string
	log := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})
	for _, tc := range []struct {
		name   string
		r      crmanager.Runnable
		leader bool
	}{
		{"silent about leader election", plainRunnable{}, true},
		{"not on the leader only", nonLeaderRunnable{}, false},
	} {
		lines = nil
		w := loggedRunnable{Runnable: tc.r, log: log}
		if got := w.NeedLeaderElection(); got != tc.leader {
			t.Errorf("%s: NeedLeaderElection = %v, want %v", tc.name, got, tc.leader)
		}
		if err := w.Start(logr.NewContext(context.Background(), logr.Discard())); err != nil {
			t.Fatal(err)
		}
		if len(lines) != 1 {
			t.Errorf("%s: the runnable's line did not reach the manager's logger: %q", tc.name, lines)
		}
	}
}
