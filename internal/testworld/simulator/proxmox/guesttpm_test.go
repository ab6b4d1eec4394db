package proxmoxsim

import (
	"context"
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// guestTPMMain is the guest program of TestProcessGuestTPM: it opens the
// TPM at <root>/dev/tpmrm0 as the agent does (go-tpm, by path), writes
// its RSA EK certificate to <VM dir>/ek.der and waits to be stopped.
func guestTPMMain() int {
	rwc, err := tpm2.OpenTPM(filepath.Join(os.Getenv(EnvRoot), guestTPMDevice))
	if err != nil {
		fmt.Fprintln(os.Stderr, "open the TPM:", err)
		return 1
	}
	raw, err := tpm2.NVRead(rwc, tpmutil.Handle(0x01c00002))
	_ = rwc.Close()
	if err != nil {
		fmt.Fprintln(os.Stderr, "read the EK certificate:", err)
		return 1
	}
	if err := os.WriteFile(filepath.Join(os.Getenv(EnvVMDir), "ek.der"), raw, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	waitToBeKilled()
	return 0
}

// TestProcessGuestTPM: a process guest whose VM has a tpmstate0 v2.0 finds
// a TPM at <root>/dev/tpmrm0 (a link to a swtpm's socket, which go-tpm
// opens through the link), with an EK certificate from the simulator's
// local CA (TPMEndorsementCA, taken before the VM existed); stopping the
// VM stops the swtpm (its socket goes) and keeps the state in the volume.
func TestProcessGuestTPM(t *testing.T) {
	ctx := context.Background()
	sim, c, work := guestEnvWith(t, "tpm", func(cfg *Config) {
		cfg.Guest.WriteFiles = true
		cfg.Templates[0].TPMVersion = tpmV20
	})
	bundle, err := sim.TPMEndorsementCA()
	if err != nil {
		t.Fatal(err)
	}
	vm := bootWithSeed(ctx, t, c, "#cloud-config\n")
	ekFile := filepath.Join(work, "vm-150", "ek.der")
	var raw []byte
	eventually(t, "the guest read its EK certificate", func() bool {
		raw, _ = os.ReadFile(ekFile)
		return len(raw) > 0 || vmStatus(sim, 150) != "running"
	})
	if len(raw) == 0 {
		console, _ := os.ReadFile(filepath.Join(work, "vm-150", "console.log"))
		t.Fatalf("the guest powered off without reading its TPM; console:\n%s", console)
	}
	var der asn1.RawValue
	if _, err := asn1.Unmarshal(raw, &der); err != nil {
		t.Fatal(err)
	}
	ek, err := x509.ParseCertificate(der.FullBytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(bundle)
	ek.UnhandledCriticalExtensions = nil // the TPM SAN, which Go does not parse
	if _, err := ek.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the guest's EK does not chain to TPMEndorsementCA: %v", err)
	}
	device := filepath.Join(work, "vm-150", "root", guestTPMDevice)
	socket, err := os.Readlink(device)
	if err != nil {
		t.Fatal(err)
	}

	task, err := vm.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waitOK(ctx, t, task)
	quietConsole(t, work)
	if _, err := os.Stat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the TPM's socket %s is still there after the VM stopped: %v", socket, err)
	}
	state, ok := sim.TPMState(150)
	if !ok || len(state) == 0 {
		t.Fatal("the VM's TPM state is not in its volume after it stopped")
	}
	if got := ekCertOf(t, state); !got.Equal(ek) {
		t.Fatal("the volume holds another TPM than the one the guest read")
	}
}
