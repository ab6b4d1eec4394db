package controller_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// TestCheapWorldNamespaceQuota: with spec.tenancy[0].limits.machines 2,
// four claims of the namespace get two VMs; the other two wait with
// Provisioned False QuotaExceeded naming the limit, the usage and the
// need, and the waiting-claims metric says 2. Deleting a placed claim lets
// exactly one more be placed.
func TestCheapWorldNamespaceQuota(t *testing.T) {
	w := newCheapWorld(t, cheapOptions{})
	sim := w.StartSim(nil)
	cluster, secret := cheapCluster("pve", sim)
	cluster.Spec.AllowedNamespaces = &metav1.LabelSelector{MatchLabels: map[string]string{"hyperfleet.io/tenant": "yes"}}
	cluster.Spec.Tenancy = []hfv1.TenancyRule{{
		NamespaceSelector: metav1.LabelSelector{MatchLabels: map[string]string{"hyperfleet.io/tenant": "yes"}},
		Templates:         []hfv1.AllowedTemplate{{ID: ptr.To[int32](9000)}},
		Storages:          []string{"local-lvm"},
		Limits:            &hfv1.TenantLimits{Machines: ptr.To[int32](2)},
	}}
	w.Create(secret)
	w.Create(cluster)
	w.ensurePATSecret()
	w.Create(cheapTemplate("debian", cluster.Name))
	claims := make([]*hfv1.MachineClaim, 4)
	for i := range claims {
		claims[i] = cheapClaim(fmt.Sprintf("c%d", i), "debian")
		w.Create(claims[i])
	}
	waitingGauge := metrics.QuotaWaitingClaims.WithLabelValues(cheapNamespace, "pve")
	// split reads the claims: those with a VM, and those waiting for the
	// quota with a message naming the limit.
	split := func() (placed, waiting []*hfv1.MachineClaim, err error) {
		for _, c := range claims {
			if !w.Get(c) {
				continue
			}
			p := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			switch {
			case w.hasVM(sim, c) == nil:
				placed = append(placed, c)
			case p != nil && p.Status == metav1.ConditionFalse && p.Reason == string(hfv1.QuotaExceededReason):
				if !strings.Contains(p.Message, "spec.tenancy[0].limits.machines of HypervisorCluster pve: limit 2, in use 2, this VM needs 1") {
					return nil, nil, fmt.Errorf("claim %s waits with %q", c.Name, p.Message)
				}
				waiting = append(waiting, c)
			default:
				return nil, nil, fmt.Errorf("claim %s neither placed nor waiting for quota: phase %s, %v", c.Name, c.Status.Phase, p)
			}
		}
		return placed, waiting, nil
	}
	// expect checks that want claims have a VM, wait claims wait for the
	// quota and the metric says so.
	expect := func(want, wait int) ([]*hfv1.MachineClaim, error) {
		p, waiting, err := split()
		if err != nil {
			return nil, err
		}
		if len(p) != want || len(waiting) != wait {
			return nil, fmt.Errorf("%d placed, %d waiting", len(p), len(waiting))
		}
		if got := testutil.ToFloat64(waitingGauge); got != float64(wait) {
			return nil, fmt.Errorf("hyperfleet_quota_waiting_claims = %v, want %d", got, wait)
		}
		return p, nil
	}
	var placed []*hfv1.MachineClaim
	w.RunUntil(5*time.Minute, "two claims placed, two waiting for quota", func() (err error) {
		placed, err = expect(2, 2)
		return err
	})
	if n := countVMs(sim); n != 2 {
		t.Fatalf("%d VMs on the cluster under a limit of 2 machines", n)
	}
	for _, c := range claims {
		if w.Events.of(c.UID)[string(hfv1.QuotaExceededReason)] > 1 {
			t.Errorf("claim %s got %d QuotaExceeded events, want one per wait", c.Name, w.Events.of(c.UID)[string(hfv1.QuotaExceededReason)])
		}
	}
	w.Delete(placed[0])
	w.RunUntil(10*time.Minute, "one more claim placed after a deletion", func() error {
		if w.Get(placed[0]) {
			return errors.New("the deleted claim is still there")
		}
		_, err := expect(2, 1)
		return err
	})
	if n := countVMs(sim); n != 2 {
		t.Fatalf("%d VMs on the cluster under a limit of 2 machines", n)
	}
}

// countVMs counts the simulator's VMs that are not templates.
func countVMs(sim *cheapSim) int {
	n := 0
	for _, vm := range sim.VMs() {
		if !vm.Template {
			n++
		}
	}
	return n
}
