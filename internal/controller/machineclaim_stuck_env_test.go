package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
)

// TestClaimStuckInPending: a claim whose template does not exist stays
// Pending; past the manager's Pending bound it is Stuck, with a message
// naming the phase and what it waits on, and one Stuck event.
func TestClaimStuckInPending(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{stuckBounds: &stuck.Bounds{Pending: time.Second}})
	f := newFixture(t, sim, nil)
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "orphaned-template"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: "no-such-template"}},
	}
	f.create(claim)
	eventually(t, 60*time.Second, "the claim reported Stuck", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		c := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimStuckCondition)
		if got.Status.Phase != hfv1.MachineClaimPending || c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(hfv1.NoProgressReason) ||
			!strings.Contains(c.Message, "In phase Pending") || !strings.Contains(c.Message, string(hfv1.TemplateNotFoundReason)) {
			return fmt.Errorf("phase %s, Stuck %+v", got.Status.Phase, c)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the Stuck event", func() error {
		var list corev1.EventList
		if err := env.Client.List(context.Background(), &list, client.InNamespace(f.namespace)); err != nil {
			return err
		}
		for _, e := range list.Items {
			if e.InvolvedObject.Name == claim.Name && e.Reason == string(hfv1.MachineClaimStuckCondition) {
				if e.Count > 1 {
					return fmt.Errorf("Stuck event recorded %d times", e.Count)
				}
				return nil
			}
		}
		return fmt.Errorf("no Stuck event")
	})
}
