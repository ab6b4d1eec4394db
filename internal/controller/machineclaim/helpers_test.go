package machineclaim

import (
	"context"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// ciPlatforms are the CI platform back-ends of the unit tests: GitHub
// Actions, registered by workload type as the operator binary registers it.
var ciPlatforms = func() *workload.Backends {
	b, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		panic(err)
	}
	return b
}()

// ciDouble is the claim's CI platforms (CIPlatforms) in the unit tests:
// the GitHub Actions back-ends (ciPlatforms) read the objects' runner
// settings; BootstrapVars and Release answer as the test says and count
// their calls.
type ciDouble struct {
	// runnerName, when set, is the name BootstrapVars gives the runner;
	// varsErr is its answer.
	runnerName string
	varsErr    error
	// release is Release's answer.
	release error

	mu                  sync.Mutex
	varsCalls, releases int
}

func (d *ciDouble) Workloads() *workload.Backends { return ciPlatforms }

func (d *ciDouble) BootstrapVars(_ context.Context, _ *hfv1.MachineClaim, _ *hfv1.HypervisorMachineTemplate, v *cloudinit.Vars) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.varsCalls++
	if d.varsErr != nil {
		return d.varsErr
	}
	if d.runnerName != "" {
		v.RunnerName = d.runnerName
	}
	return nil
}

func (d *ciDouble) Release(context.Context, *hfv1.MachineClaim, *hfv1.HypervisorMachineTemplate) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.releases++
	return d.release
}

// calls are how often BootstrapVars and Release were called.
func (d *ciDouble) calls() (vars, releases int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.varsCalls, d.releases
}

// unitEpoch is the unit tests' "now".
var unitEpoch = time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

// unitClaim is a claim in namespace default created age after unitEpoch.
func unitClaim(name string, age time.Duration) hfv1.MachineClaim {
	return hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{
		Name:              name,
		Namespace:         "default",
		UID:               types.UID("uid-" + name),
		CreationTimestamp: metav1.Time{Time: unitEpoch.Add(age)},
	}}
}

// deliver runs one Deliver step and writes the conditions it found, as
// the scope's close does.
func deliver(ctx context.Context, s *secretsService, claim *hfv1.MachineClaim, p provider.Provider) (time.Duration, string, error) {
	var facts claimFacts
	retry, failure, err := s.Deliver(ctx, claim, &facts, p)
	setConditions(claim, &facts)
	return retry, failure, err
}

// inScope runs step on a scope of claim with r's collaborators and writes
// the conditions it found, as the scope's close does.
func inScope(r *Reconciler, claim *hfv1.MachineClaim, step func(s *claimScope)) {
	s := &claimScope{claim: claim, claimEnv: r.env()}
	step(s)
	setConditions(claim, &s.facts)
}

// Annotate writes the reservation of the VM at p as an operator before
// status.vmRef was stored ahead of the clone request did: into
// VMReservationAnnotation, signed over the claim's UID, cluster, node and
// provider ID (the claims such an operator placed, which this one still
// reads).
func Annotate(claim *hfv1.MachineClaim, signer *ownership.Signer, cluster string, p provider.Progress) {
	if claim.Annotations == nil {
		claim.Annotations = map[string]string{}
	}
	sig := signer.SignReservation(ownership.Reservation{ClaimUID: string(claim.UID), Cluster: cluster, Node: p.Node, VM: string(p.ID)})
	claim.Annotations[hfv1.VMReservationAnnotation] = strings.Join([]string{cluster, p.Node, sig, string(p.ID)}, "/")
}
