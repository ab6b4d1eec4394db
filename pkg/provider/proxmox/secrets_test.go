package proxmox

import (
	"bytes"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestNoSecretLeaks: once a VM runs, neither the Proxmox credentials nor
// the workload secret in the cloud-init user-data is anywhere in the
// hypervisor's stored state, in what the Observer received, or in the logs.
// While the guest boots the secret is on storage (the check can find it).
func TestNoSecretLeaks(t *testing.T) {
	for _, auth := range []string{"token", "password"} {
		t.Run(auth, func(t *testing.T) {
			e := newEnv(t)
			cfg := e.cfg
			if auth == "password" {
				cfg.TokenID, cfg.TokenSecret, cfg.Username, cfg.Password = "", "", opUser, opPassword
			}
			p := e.newProvider(cfg)
			spec := testSpec("runner-k", "uid-kkkk")
			secret := workloadSecret("uid-kkkk")

			d := e.ensure(p, spec, provider.Progress{}, provider.PhaseBooting, 60)
			if !strings.Contains(e.stateJSON(), secret) {
				t.Fatal("the workload secret is not on storage while booting; the check below proves nothing")
			}
			d = e.ensure(p, spec, d.prog, provider.PhaseRunning, 200)

			state := e.stateJSON()
			var observed bytes.Buffer
			for _, c := range e.obs.snapshot() {
				observed.WriteString(c.method + " " + c.endpoint + "\n")
			}
			logs := e.logs.String()
			if logs == "" {
				t.Fatal("nothing was logged; the log check proves nothing")
			}
			for _, s := range []string{secret, opTokenSecret, opPassword} {
				for where, text := range map[string]string{"simulator state": state, "observer": observed.String(), "logs": logs} {
					if strings.Contains(text, s) {
						t.Errorf("%s contains secret %q", where, s)
					}
				}
			}
			// Neither the marker's signature nor cloud-init payloads are logged.
			for _, s := range []string{"signature:", "#cloud-config", "instance-id"} {
				if strings.Contains(logs, s) {
					t.Errorf("logs contain %q", s)
				}
			}
		})
	}
}
