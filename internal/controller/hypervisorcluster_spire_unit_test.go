package controller

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/spire"
)

// TestConnectSPIREWarnsOncePerOutage: a cluster whose SPIRE server stops
// answering gets one SPIREUnavailable warning when SPIREConnected turns
// False, also when it was True before (the transition an operator must
// see), and none while it stays down.
func TestConnectSPIREWarnsOncePerOutage(t *testing.T) {
	refused := func(context.Context, spire.Config) (identity.ServerAPI, error) {
		return nil, errors.New("dial unix /run/spire/server.sock: connect: connection refused")
	}
	connected := metav1.Condition{Type: string(hfv1.HypervisorClusterSPIREConnectedCondition), Status: metav1.ConditionTrue,
		Reason: string(hfv1.ReadyReason), Message: "Connected earlier", LastTransitionTime: metav1.Time{Time: unitEpoch}}
	for _, tc := range []struct {
		name   string
		before []metav1.Condition
		events int
	}{
		{name: "first pass", events: 1},
		{name: "connected until now", before: []metav1.Condition{connected}, events: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cluster := &hfv1.HypervisorCluster{
				ObjectMeta: metav1.ObjectMeta{Name: "pve", Generation: 1},
				Spec: hfv1.HypervisorClusterSpec{SPIRE: &hfv1.SPIREConfig{TrustDomain: "ci.example.org",
					ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire/server.sock"}}},
				Status: hfv1.HypervisorClusterStatus{Conditions: append([]metav1.Condition(nil), tc.before...)},
			}
			rec := record.NewFakeRecorder(8)
			r := &HypervisorClusterReconciler{Identity: &identity.Registry{Dial: refused}, Recorder: rec}
			for range 3 {
				if _, err := r.connectSPIRE(context.Background(), &clusterScope{cluster: cluster}); err != nil {
					t.Fatal(err)
				}
			}
			close(rec.Events)
			var got []string
			for e := range rec.Events {
				got = append(got, e)
			}
			if len(got) != tc.events {
				t.Fatalf("events %q; want %d SPIREUnavailable warning", got, tc.events)
			}
			if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition); c == nil || c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.SPIREUnavailableReason) {
				t.Fatalf("SPIREConnected %+v", c)
			}
		})
	}
}
