package proxmoxsim

import (
	"bytes"
	"crypto/x509"
	"encoding/asn1"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// ekCertOf reads the RSA EK certificate (NV index 0x01c00002) of a swtpm
// state, on a copy of it.
func ekCertOf(t *testing.T, state []byte) *x509.Certificate {
	t.Helper()
	dir, err := os.MkdirTemp("", "hf-ek-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	file := filepath.Join(dir, "state.raw")
	if err := os.WriteFile(file, state, 0o600); err != nil {
		t.Fatal(err)
	}
	tpm, err := swtpm.Start(swtpm.FileScheme+file, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tpm.Stop() }()
	rwc, err := tpm2.OpenTPM(tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := tpm2.NVRead(rwc, tpmutil.Handle(0x01c00002))
	if err != nil {
		t.Fatalf("read the EK certificate: %v", err)
	}
	var der asn1.RawValue
	if _, err := asn1.Unmarshal(raw, &der); err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der.FullBytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRealTPMState: a VM's first start manufactures its TPM state with an
// EK certificate from the simulator's local CA; its stop keeps the state
// in the tpmstate0 volume and a later start uses it unchanged; a clone of
// a VM that has run carries the same EK (Proxmox copies the volume), a
// fresh state gets another. QEMU is not needed: the swtpm side only.
func TestRealTPMState(t *testing.T) {
	e := tpmEnv(t, "")
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/100/config", form("tpmstate0", "local-lvm:1,version=v2.0")))
	s := e.sim
	s.mu.Lock()
	r, err := s.realGuestsLocked()
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	boot := func(vmid int) {
		t.Helper()
		s.mu.Lock()
		defer s.mu.Unlock()
		v := s.vms[vmid]
		dir := r.vmDir(vmid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sock, err := os.MkdirTemp("", "hf-tpm-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(sock)
		tpm, err := r.startTPMLocked(v, dir, sock)
		if err != nil || tpm == nil {
			t.Fatalf("start the TPM of VM %d: %v", vmid, err)
		}
		r.stopTPMLocked(tpm, v.node)
	}
	// The bundle exists before any VM starts (a verifier is configured
	// first), and the VMs' EKs chain to that same bundle.
	bundle, err := s.TPMEndorsementCA()
	if err != nil {
		t.Fatal(err)
	}
	boot(100)
	first, ok := s.TPMState(100)
	if !ok || len(first) == 0 {
		t.Fatal("no TPM state in the volume after the first start")
	}
	ek := ekCertOf(t, first)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatalf("bundle holds no certificate: %s", bundle)
	}
	ek.UnhandledCriticalExtensions = nil // the TPM SAN, which Go does not parse
	if _, err := ek.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("the EK certificate does not verify against TPMEndorsementCA: %v", err)
	}
	boot(100)
	again, _ := s.TPMState(100)
	if !bytes.Equal(ekCertOf(t, again).Raw, ek.Raw) {
		t.Fatal("the second start manufactured a new EK; the state must be kept (swtpm_setup --not-overwrite)")
	}

	// A full clone of VM 100 copies its state: the same EK.
	e.wantExit(e.upid(e.call("POST", "/nodes/pve1/qemu/100/clone", form("newid", "300", "full", "1"))), "OK")
	cloned, ok := s.TPMState(300)
	if !ok || !bytes.Equal(ekCertOf(t, cloned).Raw, ek.Raw) {
		t.Fatal("the clone of a VM that ran does not carry its EK; Proxmox copies the state")
	}
	// A new state on the clone (addVirtualTPM's way) gets its own EK.
	e.mustOK(e.call("PUT", "/nodes/pve1/qemu/300/config", form("tpmstate0", "local-lvm:1,version=v2.0")))
	boot(300)
	fresh, _ := s.TPMState(300)
	if bytes.Equal(ekCertOf(t, fresh).Raw, ek.Raw) {
		t.Fatal("a new TPM state has the EK of the VM it was cloned from")
	}
}
