package broker

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// TestBrokerWritesFactsOnly: the broker's four writes (the request mark,
// its undo after a failed mint, the issued bootstrap record, a misuse
// record) are patches of status.identity and status.bootstrap under the
// claim's resourceVersion and nothing else: the conditions and the phase
// the claim reconciler derived stay byte-identical. The reconciler alone
// derives those (docs/architecture.md, "Who writes a claim's status").
func TestBrokerWritesFactsOnly(t *testing.T) {
	derived := func(c *hfv1.MachineClaim) *hfv1.MachineClaim {
		at := metav1.NewTime(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
		c.Status.Phase = hfv1.MachineClaimBootstrapping
		c.Status.Conditions = []metav1.Condition{
			{Type: string(hfv1.MachineClaimProvisionedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.ReadyReason), Message: "up", LastTransitionTime: at, ObservedGeneration: 1},
			{Type: string(hfv1.MachineClaimAttestedCondition), Status: metav1.ConditionTrue, Reason: string(hfv1.AttestedReason), Message: "attested", LastTransitionTime: at, ObservedGeneration: 1},
			{Type: string(hfv1.ReadyCondition), Status: metav1.ConditionFalse, Reason: string(hfv1.WaitingForRunnerReason), Message: "waiting", LastTransitionTime: at, ObservedGeneration: 1},
		}
		return c
	}
	w := newWorld(t, derived(liveClaim("runner-1")), derived(liveClaim("runner-2")))
	var mu sync.Mutex
	var patches []string
	w.broker.Client = interceptor.NewClient(w.client.(client.WithWatch), interceptor.Funcs{
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			t.Errorf("the broker replaced the %s of %s instead of patching its facts", sub, client.ObjectKeyFromObject(obj))
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			data, err := patch.Data(obj)
			if err != nil {
				return err
			}
			mu.Lock()
			patches = append(patches, string(data))
			mu.Unlock()
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	snapshot := func(name string) (conds, phase []byte) {
		got := &hfv1.MachineClaim{}
		if err := w.client.Get(context.Background(), client.ObjectKey{Namespace: "ci", Name: name}, got); err != nil {
			t.Fatal(err)
		}
		conds, _ = json.Marshal(got.Status.Conditions)
		return conds, []byte(got.Status.Phase)
	}
	conds1, phase1 := snapshot("runner-1")
	conds2, phase2 := snapshot("runner-2")
	svid1 := w.ca.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))

	// A failed mint: the request mark, then its undo.
	w.issuer.err = errclass.Errorf(errclass.ClassTransient, "Unavailable", "GitHub is down")
	if rec, _, _ := w.call(t, http.MethodPost, svid1); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("failed mint: %d %s", rec.Code, rec.Body)
	}
	// The delivery: the request mark, then the issued record.
	w.issuer.err = nil
	if rec, _, _ := w.call(t, http.MethodPost, svid1); rec.Code != http.StatusOK {
		t.Fatalf("delivery: %d %s", rec.Code, rec.Body)
	}
	// A stolen identity: the misuse record.
	if rec, ref, _ := w.callWithProof(t, http.MethodPost, w.ca.svid(t, vmID("runner-2"), time.Now().Add(time.Hour)), ""); ref.Reason != ReasonBrokerProofInvalid {
		t.Fatalf("stolen: %d %+v", rec.Code, ref)
	}

	if len(patches) != 5 {
		t.Errorf("%d status writes, want 5 (mark, undo, mark, issued, misuse): %q", len(patches), patches)
	}
	for _, p := range patches {
		var doc map[string]map[string]json.RawMessage
		if err := json.Unmarshal([]byte(p), &doc); err != nil {
			t.Fatalf("patch %s: %v", p, err)
		}
		for top, fields := range doc {
			allowed := map[string][]string{"metadata": {"resourceVersion"}, "status": {"identity", "bootstrap"}}[top]
			if allowed == nil {
				t.Errorf("patch %s writes %s", p, top)
			}
			for f := range fields {
				if !slices.Contains(allowed, f) {
					t.Errorf("patch %s writes %s.%s", p, top, f)
				}
			}
		}
		if _, locked := doc["metadata"]["resourceVersion"]; !locked {
			t.Errorf("patch %s carries no resourceVersion: two replicas could both write", p)
		}
	}
	for name, want := range map[string][2][]byte{"runner-1": {conds1, phase1}, "runner-2": {conds2, phase2}} {
		conds, phase := snapshot(name)
		if string(conds) != string(want[0]) || string(phase) != string(want[1]) {
			t.Errorf("%s: conditions %s phase %s after the broker's writes, want %s %s", name, conds, phase, want[0], want[1])
		}
	}
	got := &hfv1.MachineClaim{}
	if err := w.client.Get(context.Background(), client.ObjectKey{Namespace: "ci", Name: "runner-1"}, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Identity.CredentialRequestedAt == nil || got.Status.Bootstrap == nil || got.Status.Bootstrap.RunnerID != 42 {
		t.Errorf("the delivery's facts are not recorded: identity %+v bootstrap %+v", got.Status.Identity, got.Status.Bootstrap)
	}
}
