package sweeper

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// fakeCI is one CI platform scope holding runners; only the calls the
// sweeper makes are implemented.
type fakeCI struct {
	scope workload.Scope
	mu    sync.Mutex
	next  int64
	list  []workload.Runner
	// takesJob names runners that take a job just before a removal
	// arrives: the platform then refuses to remove them.
	takesJob map[string]bool
}

func (c *fakeCI) add(name string, state workload.RunnerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.list = append(c.list, workload.Runner{ID: c.next, Name: name, State: state})
}

func (c *fakeCI) setState(name string, state workload.RunnerState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.list {
		if c.list[i].Name == name {
			c.list[i].State = state
		}
	}
}

func (c *fakeCI) byName(name string) (workload.Runner, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.list {
		if r.Name == name {
			return r, true
		}
	}
	return workload.Runner{}, false
}

func (c *fakeCI) names() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, r := range c.list {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return out
}

var errUnused = errors.New("not used by the sweeper")

func (c *fakeCI) Scope() workload.Scope { return c.scope }
func (c *fakeCI) IssueCredential(context.Context, workload.RunnerSpec) (workload.Credential, error) {
	return workload.Credential{}, errUnused
}
func (c *fakeCI) GetRunner(_ context.Context, name string) (workload.Runner, error) {
	if r, ok := c.byName(name); ok {
		return r, nil
	}
	return workload.Runner{}, workload.ErrNotFound
}
func (c *fakeCI) QueuedJobs(context.Context, []string) ([]workload.Job, error) { return nil, errUnused }
func (c *fakeCI) Repositories(context.Context) ([]string, error)               { return nil, errUnused }
func (c *fakeCI) GetJob(context.Context, string, string) (workload.Job, error) {
	return workload.Job{}, errUnused
}
func (c *fakeCI) CancelRun(context.Context, string, int64) error { return errUnused }
func (c *fakeCI) VerifyScope(context.Context) error              { return errUnused }

func (c *fakeCI) ListRunners(_ context.Context, prefix string) ([]workload.Runner, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []workload.Runner
	for _, r := range c.list {
		if strings.HasPrefix(r.Name, prefix) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (c *fakeCI) DeregisterRunner(_ context.Context, id int64, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.list {
		if r.ID != id {
			continue
		}
		if c.takesJob[r.Name] {
			c.list[i].State = workload.RunnerBusy
		}
		if c.list[i].State == workload.RunnerBusy {
			return workload.ErrRunnerBusy
		}
		c.list = slices.Delete(c.list, i, i+1)
		return nil
	}
	return nil
}

// runnerWorld is a world with one CI scope and the runners of the cases
// TestLeakRunners checks.
type runnerWorld struct {
	*world
	ci                                             *fakeCI
	orphan, busy, racing, live, recorded           string
	unmarked, forged, userNamed, otherInstallNamed string
}

func newRunnerWorld(t *testing.T, dryRun bool) *runnerWorld {
	w := &runnerWorld{world: newWorld(t, dryRun)}
	w.ci = &fakeCI{scope: workload.Scope{Owner: "octo", Repository: "app"}, takesJob: map[string]bool{}}
	w.world.ci = []*fakeCI{w.ci}
	other, err := ownership.NewSigner("leaktest", bytes.Repeat([]byte{9}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	otherInstall, err := ownership.NewSigner("elsewhere", bytes.Repeat([]byte{3}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	w.claim("keeper") // UID uid-keeper
	recorded := w.claim("recorded")
	w.recorded = w.signer.RunnerName("custom-runner")
	var c hfv1.MachineClaim
	if err := w.kube.Get(context.Background(), client.ObjectKey{Namespace: recorded.Namespace, Name: recorded.Name}, &c); err != nil {
		t.Fatal(err)
	}
	c.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: w.recorded}
	if err := w.kube.Status().Update(context.Background(), &c); err != nil {
		t.Fatal(err)
	}

	w.orphan = w.signer.RunnerName("victim-uidvicti") // its claim uid-victim is gone
	w.busy = w.signer.RunnerName("busy-0badc0de")
	w.racing = w.signer.RunnerName("racing-0ddba11s")
	w.live = w.signer.RunnerName("keeper-uidkeepe")
	w.unmarked = "victim-uidvicti"
	w.forged = other.RunnerName("ghost-12345678")
	w.userNamed = "my-own-runner"
	w.otherInstallNamed = otherInstall.RunnerName("ghost-12345678")
	w.ci.add(w.orphan, workload.RunnerOffline)
	w.ci.add(w.busy, workload.RunnerBusy)
	w.ci.add(w.racing, workload.RunnerIdle)
	w.ci.takesJob[w.racing] = true
	w.ci.add(w.live, workload.RunnerIdle)
	w.ci.add(w.recorded, workload.RunnerOffline)
	for _, n := range []string{w.unmarked, w.forged, w.userNamed, w.otherInstallNamed} {
		w.ci.add(n, workload.RunnerOffline)
	}
	return w
}

// TestLeakRunners: a runner named by this install whose claim is gone is
// removed after the grace period, once it is not busy; a runner of a live
// claim, one the platform refuses to remove because it took a job, and
// every runner this install did not name (unmarked, marked with another
// key or by another install) stay. Removals are reported only once the
// runner is gone.
func TestLeakRunners(t *testing.T) {
	w := newRunnerWorld(t, false)
	w.sweepFor(grace / 2)
	if len(w.ci.names()) != 9 {
		t.Fatalf("a runner went before the grace period: %v", w.ci.names())
	}
	w.sweepFor(2 * grace)
	if !slices.Equal(w.removedRunners, []string{w.orphan}) {
		t.Errorf("removed %v, want only the orphan %s", w.removedRunners, w.orphan)
	}
	// The busy orphan finishes its job and goes offline: it goes too.
	w.ci.setState(w.busy, workload.RunnerOffline)
	w.sweepFor(2 * grace)
	want := []string{w.forged, w.live, w.otherInstallNamed, w.racing, w.recorded, w.unmarked, w.userNamed}
	slices.Sort(want)
	if got := w.ci.names(); !slices.Equal(got, want) {
		t.Errorf("runners left %v, want %v", got, want)
	}
	if !slices.Equal(w.removedRunners, []string{w.orphan, w.busy}) {
		t.Errorf("removed %v, want the orphan, then the formerly busy one", w.removedRunners)
	}
	key := w.cluster + "-" + w.ci.scope.String()
	if got := counter(t, metrics.OrphanRunnersRemoved.WithLabelValues(key)); got != 2 {
		t.Errorf("runners removed metric %v, want 2", got)
	}
}

// TestLeakRunnersDryRun: orphaned runners are reported once and none is
// removed.
func TestLeakRunnersDryRun(t *testing.T) {
	w := newRunnerWorld(t, true)
	w.sweepFor(3 * grace)
	if len(w.ci.names()) != 9 {
		t.Errorf("dry-run removed runners: %v left", w.ci.names())
	}
	key := w.cluster + "-" + w.ci.scope.String()
	// The orphan and the idle racing one; the busy one is not a candidate.
	if got := counter(t, metrics.OrphanRunnersFound.WithLabelValues(key)); got != 2 {
		t.Errorf("runners found metric %v, want 2", got)
	}
}
