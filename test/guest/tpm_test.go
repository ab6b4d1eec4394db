//go:build guest

package guest

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestRealGuestTPM boots one real guest whose config has a tpmstate0 of
// version v2.0, as addVirtualTPM writes it: the guest sees a TPM 2.0
// (/dev/tpmrm0, tpm_version_major 2) on the swtpm the simulator started
// for it, manufactured with an EK certificate from the CA that
// TPMEndorsementCA returns. The guest image has no tpm2-tools, so the EK
// certificate is read on the host from the state the stop left in the
// volume (TestRealTPMState in internal/testworld/simulator/proxmox checks
// its chain and that it survives restarts).
func TestRealGuestTPM(t *testing.T) {
	c, sim := startGuestSimulator(t, t.TempDir())
	c.task(c.must("POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"101"}, "name": {"tpm-101"}}), time.Minute)
	c.must("PUT", "/nodes/pve1/qemu/101/config", url.Values{"tpmstate0": {"local-lvm:1,version=v2.0"}})

	start := time.Now()
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/start", nil), time.Minute)
	ctx := context.Background()
	eventually(t, 5*time.Minute, "the guest sees a TPM 2.0", func() error {
		res, err := sim.GuestExec(ctx, 101, "cat", "/sys/class/tpm/tpm0/tpm_version_major")
		if err != nil {
			return err
		}
		if res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "2" {
			return fmt.Errorf("tpm_version_major: exit %d, %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
		return nil
	})
	t.Logf("TPM 2.0 seen in the guest %s after the start", time.Since(start).Round(time.Second))
	res, err := sim.GuestExec(ctx, 101, "test", "-c", "/dev/tpmrm0")
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("/dev/tpmrm0 is not a character device in the guest: %+v, %v", res, err)
	}

	bundle, err := sim.TPMEndorsementCA()
	if err != nil {
		t.Fatal(err)
	}
	if block, _ := pem.Decode(bundle); block == nil {
		t.Fatalf("TPMEndorsementCA is no PEM: %q", bundle)
	} else if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		t.Fatalf("TPMEndorsementCA: %v", err)
	}
	c.task(c.must("POST", "/nodes/pve1/qemu/101/status/stop", nil), time.Minute)
	if state, ok := sim.TPMState(101); !ok || len(state) == 0 {
		t.Fatal("the stopped VM's tpmstate0 volume holds no TPM state")
	}
	c.task(c.must("DELETE", "/nodes/pve1/qemu/101", nil), time.Minute)
	if _, ok := sim.TPMState(101); ok {
		t.Fatal("the TPM state outlived the VM")
	}
}
