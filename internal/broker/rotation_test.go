package broker

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
)

// TestProofSurvivesAKeyRotation: the documented rotation of the ownership
// key (a new hmac-key-<n> in the Secret and a restart) while a VM is in
// flight: its claim recorded key 0 when its identity was planned, its VM
// holds the broker proof of key 0, and the operator after the rotation
// signs with key 1. The broker hands the VM its credential. Before, it
// derived the proof with the newest key, took the VM's for a stolen
// identity and failed the claim. A key removed from the ring is refused
// without a misuse.
func TestProofSurvivesAKeyRotation(t *testing.T) {
	inflight, orphaned := liveClaim("runner-1"), liveClaim("runner-2")
	zero := int32(0)
	inflight.Status.Identity.KeyID, orphaned.Status.Identity.KeyID = &zero, &zero
	w := newWorld(t, inflight, orphaned)
	svid := w.ca.svid(t, vmID("runner-1"), time.Now().Add(time.Hour))
	proof := w.proofOf(t, svid) // derived before the rotation, in the VM
	w.broker.Proofs = &identity.Issuer{Keys: keyRing(t, 0, 1)}
	rec, ref, resp := w.callWithProof(t, http.MethodPost, svid, proof)
	if rec.Code != http.StatusOK || resp.JITConfig != "jit-runner-1" {
		t.Fatalf("the VM's proof after the key rotation: %d %+v, want its credential", rec.Code, ref)
	}

	// Key 0 removed from the Secret while runner-2 was in flight: its
	// proof cannot be checked, which is no theft.
	w.broker.Proofs = &identity.Issuer{Keys: keyRing(t, 1)}
	svid2 := w.ca.svid(t, vmID("runner-2"), time.Now().Add(time.Hour))
	rec, ref, _ = w.callWithProof(t, http.MethodPost, svid2, proof)
	if rec.Code != http.StatusForbidden || ref.Reason != ReasonKeyUnavailable {
		t.Fatalf("a proof of a removed key: %d %+v, want 403 %s", rec.Code, ref, ReasonKeyUnavailable)
	}
	got := &hfv1.MachineClaim{}
	if err := w.client.Get(context.Background(), client.ObjectKeyFromObject(orphaned), got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Identity.Misuse != nil {
		t.Errorf("a removed key recorded a misuse: %+v", got.Status.Identity.Misuse)
	}
}

// TestRefusalsAreNotAFloodOfLogLines: 3,000 refused requests (no client
// certificate, as a flood sends them) log at debug level, and one Info
// line at most, the summary, instead of one Info line each.
func TestRefusalsAreNotAFloodOfLogLines(t *testing.T) {
	w := newWorld(t, liveClaim("runner-1"))
	var info, debug int
	logger := funcr.NewJSON(func(obj string) {
		if strings.Contains(obj, `"level":0`) {
			info++
		} else {
			debug++
		}
	}, funcr.Options{Verbosity: 1})
	for range 3000 {
		req := newRequest(http.MethodPost, nil, "")
		req = req.WithContext(logr.NewContext(context.Background(), logger))
		rec := serve(w, req)
		if rec.Code != http.StatusUnauthorized || rec.Header().Get("Connection") != "close" {
			t.Fatalf("a request without a certificate: %d, Connection %q; want 401 and a close", rec.Code, rec.Header().Get("Connection"))
		}
	}
	if info > 1 || debug != 3000 {
		t.Errorf("3,000 refusals: %d Info lines, %d debug lines; want at most 1 and 3,000", info, debug)
	}
}
