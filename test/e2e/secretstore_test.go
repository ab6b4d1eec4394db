//go:build e2e && spire

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// TestSPIFFESecretStorePoolRunsJobs: with spec.spire.secretStore on the
// cluster (docs/secrets-store.md), every VM attests with a real spire-agent,
// logs in to the store (a fake Vault whose JWT auth trusts the real
// spire-server's keys) with its real JWT-SVID and reads its credential
// once. The operator wrote each credential after the VM attested; the
// broker handed out none; no cloud-init held one; afterwards neither the
// store nor the SPIRE server holds anything of the VMs.
func TestSPIFFESecretStorePoolRunsJobs(t *testing.T) {
	const n = 3
	delivered := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered))
	w, watch, seeds := startSPIFFEWorld(t, func(o *devenv.Options) { o.SecretStore = true })
	data := devenv.VaultKVMount + "/data/" + devenv.VaultPathPrefix + "/"
	if _, err := w.EnqueueJobs(n, jobDuration); err != nil {
		t.Fatal(err)
	}
	waitDone(t, w, 10*time.Minute)
	watch.stop()
	checkJobs(t, w, watch, n)

	if got := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(broker.ReasonDelivered)) - delivered; got != 0 {
		t.Errorf("the broker delivered %v credentials; the store should have", got)
	}
	stored := 0
	for name, reasons := range claimEvents(t, w) {
		if msg := reasons[string(hfv1.CredentialStoredReason)]; msg != "" {
			stored++
			if !strings.Contains(msg, w.VaultURL) {
				t.Errorf("claim %s: CredentialStored event %q does not name the store", name, msg)
			}
		}
		if msg := reasons["FailedStoreCredential"]; msg != "" {
			t.Errorf("claim %s: %s", name, msg)
		}
	}
	writes := w.Vault.RequestsUnder("PUT", data) + w.Vault.RequestsUnder("POST", data)
	reads := w.Vault.RequestsUnder("GET", data)
	t.Logf("store: %d claims stored a credential, %d writes, %d reads, %d logins", stored, writes, reads, w.Vault.RequestsUnder("PUT", "auth/"+devenv.VaultAuthMount+"/login"))
	if stored != n || writes != n || reads != n {
		t.Errorf("%d claims stored %d credentials and the VMs read %d, want %d of each (one per job)", stored, writes, reads, n)
	}
	eventually(t, time.Minute, "nothing left in the secrets store", func() error {
		if paths, roles := w.Vault.SecretPaths(devenv.VaultKVMount), w.Vault.RoleNames(devenv.VaultAuthMount); len(paths)+len(roles) > 0 {
			return fmt.Errorf("secrets %v, roles %v", paths, roles)
		}
		return nil
	})

	seeds.mu.Lock()
	if len(seeds.seeds) < n {
		t.Errorf("saw the cloud-init of %d VMs, want at least %d", len(seeds.seeds), n)
	}
	for _, b := range seeds.bad {
		t.Error(b)
	}
	seeds.mu.Unlock()
	waitNothingOnSPIRE(t, w)
}
