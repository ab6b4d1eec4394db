//go:build e2e && spire

package e2e

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

var spiffeIDLine = regexp.MustCompile(`SPIFFE ID:\s+(spiffe://\S+)`)

// TestSPIFFEGenericScriptFetchesItsSVID: a generic VM whose template attests
// with a join token runs its script with SPIFFE_ENDPOINT_SOCKET pointing at
// the VM's running spire-agent; the script fetches its X509-SVID there with
// `spire-agent api fetch x509`, and the SVID's SPIFFE ID is its claim's.
// Afterwards nothing is left on the SPIRE server.
func TestSPIFFEGenericScriptFetchesItsSVID(t *testing.T) {
	w, watch, _ := startSPIFFEWorld(t)
	ctx := context.Background()
	dir := t.TempDir()
	fetch := `"$HF_SPIRE_AGENT" api fetch x509 -socketPath "${SPIFFE_ENDPOINT_SOCKET#unix://}" -timeout 30s >>"$out.tmp" 2>&1`
	if err := w.AddGenericPool(ctx, devenv.GenericPoolSpec{Name: "batch", Script: genericScript(dir, fetch), MinReplicas: 1, Attest: true}); err != nil {
		t.Fatal(err)
	}
	byUID := map[string]hfv1.MachineClaim{}
	eventually(t, 5*time.Minute, "two scripts ran", func() error {
		var claims hfv1.MachineClaimList
		if err := w.API.Client.List(ctx, &claims, client.InNamespace(devenv.Namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: "batch"}); err != nil {
			return err
		}
		for _, c := range claims.Items {
			if c.Status.Identity != nil && c.Status.Identity.SPIFFEID != "" {
				byUID[string(c.UID)] = c
			}
		}
		if n := len(scriptRuns(t, dir)); n < 2 {
			return fmt.Errorf("%d scripts ran", n)
		}
		return nil
	})
	for uid, run := range scriptRuns(t, dir) {
		c, ok := byUID[uid]
		if !ok {
			t.Errorf("a script ran for claim uid %s, never seen with an identity", uid)
			continue
		}
		var got string
		for _, line := range run[4:] {
			if m := spiffeIDLine.FindStringSubmatch(line); m != nil {
				got = m[1]
			}
		}
		if want := c.Status.Identity.SPIFFEID; got != want {
			t.Errorf("claim %s: the script's SVID is %q, want the claim's SPIFFE ID %q; the script printed:\n%q", c.Name, got, want, run)
		}
	}
	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: devenv.Namespace, Name: "batch"}, &pool); err != nil {
		t.Fatal(err)
	}
	if err := w.API.Client.Delete(ctx, &pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "the generic pool's VMs gone", func() error {
		snap, err := w.Snapshot(ctx)
		if err != nil {
			return err
		}
		if len(snap.VMs) > 0 {
			return fmt.Errorf("%d VMs", len(snap.VMs))
		}
		return nil
	})
	watch.stop()
	waitNothingOnSPIRE(t, w)
}
