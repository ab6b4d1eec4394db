package controller_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// shiftedClock is the real clock moved forward by an offset the test
// advances: the API server stamps claims with real time, and the
// operator's lifecycle limits read this clock.
type shiftedClock struct {
	clock.RealClock
	offset atomic.Int64
}

func (c *shiftedClock) Now() time.Time                  { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *shiftedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c *shiftedClock) advance(d time.Duration)         { c.offset.Add(int64(d)) }

// genericTemplate creates a template with spec.bootstrap.generic beside
// the fixture's GitHub one, on its cluster.
func (f *fixture) genericTemplate(ttl time.Duration) *hfv1.HypervisorMachineTemplate {
	f.t.Helper()
	tmpl := &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "batch"},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: f.cluster.Name},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{Generic: &hfv1.GenericBootstrap{
				Script: "echo hello from $HYPERFLEET_CLAIM",
				TTL:    &metav1.Duration{Duration: ttl},
			}},
		},
	}
	f.create(tmpl)
	return tmpl
}

// waitScriptRunning waits until a generic claim's VM runs and the claim
// says so.
func waitScriptRunning(t *testing.T, c *hfv1.MachineClaim) *hfv1.MachineClaim {
	t.Helper()
	var got *hfv1.MachineClaim
	eventually(t, 60*time.Second, fmt.Sprintf("claim %s runs its script", c.Name), func() error {
		var err error
		if got, err = getClaim(t, c); err != nil {
			return err
		}
		cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimBootstrappedCondition)
		if got.Status.VMRef == nil || cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != string(hfv1.ScriptRunningReason) {
			return fmt.Errorf("phase %q, conditions %+v", got.Status.Phase, got.Status.Conditions)
		}
		return nil
	})
	return got
}

// TestGenericClaim: a hand-made claim of a generic template gets a VM and
// no runner credential, is busy running its script, and is ended by the
// operator once its template's ttl has passed.
func TestGenericClaim(t *testing.T) {
	sim := startSim(t, nil)
	clk := &shiftedClock{}
	startOperator(t, operatorOptions{clock: clk})
	f := newFixture(t, sim, nil)
	tmpl := f.genericTemplate(time.Hour)
	waitTemplate(t, tmpl, metav1.ConditionTrue, "")
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "batch-1"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
	}
	f.create(claim)
	got := waitScriptRunning(t, claim)
	b := got.Status.Bootstrap
	if b == nil || b.RunnerState != hfv1.RunnerStateBusy || b.RegisteredAt == nil || b.CredentialRequestedAt != nil || b.CredentialIssuedAt != nil || b.RunnerName != "" {
		t.Errorf("status.bootstrap = %+v; want busy, no credential and no runner", b)
	}
	wantEvents(t, got, string(hfv1.ScriptRunningReason))
	// Nothing was placed in the running VM: a generic VM without SPIFFE
	// receives no secret at all.
	if _, _, err := sim.GuestFile(context.Background(), int(got.Status.VMRef.VMID), agentconfig.SecretsFile); err == nil {
		t.Error("the operator placed secrets in a generic VM")
	}

	// The ttl ends the claim (its VM destroyed, the hand-made claim
	// deleted), with the event that says why.
	clk.advance(time.Hour + time.Minute)
	poke(t, claim)
	eventually(t, 60*time.Second, "claim gone after its ttl", func() error {
		if _, err := getClaim(t, claim); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Errorf("VMs left after the ttl: %+v", vms)
	}
	wantEvents(t, got, string(hfv1.MaxLifetimeReason))

	// A generic claim of a GitHub template waits, naming the mismatch,
	// and nothing is built for it.
	mismatch := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "mismatch"},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name},
			WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGeneric}},
	}
	f.create(mismatch)
	cond := waitClaimProvisioned(t, mismatch, metav1.ConditionFalse, string(hfv1.InvalidSpecReason))
	if !strings.Contains(cond.Message, "spec.bootstrap.generic") {
		t.Errorf("the mismatch's message %q does not name the missing section", cond.Message)
	}
	wantNothingBuilt(t, sim, mismatch)
}

// poke changes a label of the claim so that the operator reconciles it
// now (as after its requeue, without waiting for it).
func poke(t *testing.T, c *hfv1.MachineClaim) {
	t.Helper()
	err := retry.RetryOnConflict(conflictRetry, func() error {
		got, err := getClaim(t, c)
		if err != nil {
			return err
		}
		got.Labels["test.hyperfleet.io/poke"] = fmt.Sprint(time.Now().UnixNano())
		return env.Client.Update(context.Background(), got)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestGenericPool: a generic pool keeps minReplicas VMs, each running its
// script, and replaces one whose VM powers off.
func TestGenericPool(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	tmpl := f.genericTemplate(time.Hour)
	waitTemplate(t, tmpl, metav1.ConditionTrue, "")
	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "batch"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: tmpl.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGeneric},
			Scaling:     hfv1.Scaling{MinReplicas: 2, MaxReplicas: 3},
			Lifecycle:   hfv1.Lifecycle{History: &hfv1.ClaimHistory{Limit: 10}},
		},
	}
	f.create(pool)
	ctx := context.Background()
	live := func() ([]hfv1.MachineClaim, []hfv1.MachineClaim, error) {
		var list hfv1.MachineClaimList
		if err := env.Client.List(ctx, &list, client.InNamespace(f.namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
			return nil, nil, err
		}
		var running, ended []hfv1.MachineClaim
		for _, c := range list.Items {
			if c.Ended() || c.IsFinished() {
				ended = append(ended, c)
				continue
			}
			running = append(running, c)
		}
		return running, ended, nil
	}
	var first []hfv1.MachineClaim
	eventually(t, 90*time.Second, "two generic claims running their script", func() error {
		running, _, err := live()
		if err != nil {
			return err
		}
		n := 0
		for _, c := range running {
			if wc := c.Spec.WorkloadConfig; wc == nil || wc.Type != hfv1.WorkloadGeneric {
				return fmt.Errorf("claim %s has workloadConfig %+v, want type generic", c.Name, wc)
			}
			if hfv1.HasReason(hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimBootstrappedCondition), hfv1.ScriptRunningReason) {
				n++
			}
		}
		if len(running) != 2 || n != 2 {
			return fmt.Errorf("%d claims, %d running their script", len(running), n)
		}
		first = running
		return nil
	})
	var got hfv1.RunnerPool
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &got); err != nil {
		t.Fatal(err)
	}
	if c := hfv1.FindCondition(got.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition); c != nil {
		t.Errorf("a generic pool has a ScopeVerified condition: %+v", c)
	}

	// The script's end powers the VM off: its claim ends, and the pool
	// replaces it.
	gone := first[0]
	if err := sim.GuestPowerOff(int(gone.Status.VMRef.VMID)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "the powered-off claim ended and replaced", func() error {
		running, ended, err := live()
		if err != nil {
			return err
		}
		var endedGone bool
		for _, c := range ended {
			if c.UID == gone.UID && c.EndReason() == hfv1.EndPoweredOff {
				endedGone = true
			}
		}
		replaced := false
		for _, c := range running {
			if c.UID == gone.UID {
				return fmt.Errorf("claim %s still running", c.Name)
			}
			if c.UID != first[1].UID {
				replaced = true
			}
		}
		if !endedGone || !replaced || len(running) != 2 {
			return fmt.Errorf("ended %d (the powered-off one among them: %v), running %d (a replacement among them: %v)", len(ended), endedGone, len(running), replaced)
		}
		return nil
	})
}
