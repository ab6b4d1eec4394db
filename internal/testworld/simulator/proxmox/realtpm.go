package proxmoxsim

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
)

// A real guest's TPM, as Proxmox's start_swtpm gives one (qemu-server's
// src/PVE/QemuServer.pm): one swtpm per VM start, on the VM's tpmstate0
// volume, manufactured with an EK certificate by swtpm_setup on the first
// start only (Proxmox passes --not-overwrite on every start), stopped with
// the VM. The volume's content (volume.data) is the swtpm state: written
// to a raw file in the VM's directory that swtpm's file backend
// (--tpmstate backend-uri=file://...) uses, as Proxmox maps the volume,
// and read back when the VM stops, so that a clone copies it as Proxmox's
// qemu-img copy of the volume does. The EK certificates come from one
// local CA per simulator (TPMEndorsementCA), standing for the node's
// /etc/swtpm_setup.conf and its swtpm-localca.

// realTPM is the swtpm of one boot of one VM.
type realTPM struct {
	tpm   *swtpm.TPM
	file  string // the state file swtpm works on
	volid string // the tpmstate0 volume it came from
	once  sync.Once
}

// tpmCALocked is the simulator's local CA, created on first use in the
// guests' work directory.
func (r *realGuests) tpmCALocked() (*swtpm.LocalCA, error) {
	if r.tpmCA != nil {
		return r.tpmCA, nil
	}
	ca, err := swtpm.NewLocalCA(filepath.Join(r.baseDir, "tpm-ca"))
	if err != nil {
		return nil, err
	}
	r.tpmCA = ca
	return ca, nil
}

// startTPMLocked starts the swtpm of v's tpmstate0 (nil when it has
// none) with its sockets in sockDir.
func (r *realGuests) startTPMLocked(v *vm, dir, sockDir string) (*realTPM, error) {
	val, ok := v.conf[tpmKey]
	if !ok {
		return nil, nil
	}
	if ver := tpmVersion(val); ver != tpmV20 {
		// Proxmox would run swtpm without --tpm2; the simulator's CA
		// (internal/testworld/swtpm) manufactures TPM 2.0 only.
		return nil, fmt.Errorf("tpmstate0 version %s: the simulator's QEMU backend emulates TPM 2.0 only", ver)
	}
	volid := parseDrive(val).file
	_, vol := r.s.findVolumeLocked(volid, v.node)
	if vol == nil {
		return nil, fmt.Errorf("volume '%s' does not exist", volid)
	}
	file := filepath.Join(dir, "tpmstate0.raw")
	uri := swtpm.FileScheme + file
	if len(vol.data) > 0 {
		if err := os.WriteFile(file, vol.data, 0o600); err != nil {
			return nil, fmt.Errorf("TPM state: %w", err)
		}
	} else {
		// Never started: manufacture, as swtpm_setup --not-overwrite
		// does with an empty state.
		_ = os.Remove(file)
		ca, err := r.tpmCALocked()
		if err != nil {
			return nil, err
		}
		if err := ca.Manufacture(uri); err != nil {
			return nil, err
		}
	}
	t, err := swtpm.Start(uri, sockDir)
	if err != nil {
		return nil, err
	}
	return &realTPM{tpm: t, file: file, volid: volid}, nil
}

// stopTPMLocked stops a boot's swtpm, once, and keeps its state in the
// volume (when the volume still exists: destroy may have freed it).
func (r *realGuests) stopTPMLocked(t *realTPM, node string) {
	if t == nil {
		return
	}
	t.once.Do(func() {
		if err := t.tpm.Stop(); err != nil {
			r.s.log.Warn("swtpm did not stop cleanly", "err", err)
		}
		data, err := os.ReadFile(t.file)
		if err != nil {
			r.s.log.Warn("Cannot read the TPM state back", "file", t.file, "err", err)
			return
		}
		if _, vol := r.s.findVolumeLocked(t.volid, node); vol != nil {
			vol.data = data
		}
	})
}

// TPMEndorsementCA is the PEM bundle (root and issuing certificate) of the
// local CA that signs the EK certificates of the guests' TPMs, real and
// simulated (guesttpm.go): what a platform team would give the operator
// as the EK CA (spec.spire.tpm.ekCABundleRef) and spire-server as its
// endorsement_ca_path. The CA is created on first use, before any VM
// starts if need be (swtpm.LocalCA.Init), since a verifier is configured
// before the VMs it verifies exist.
func (s *Simulator) TPMEndorsementCA() ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.realGuestsLocked()
	if err != nil {
		return nil, err
	}
	ca, err := r.tpmCALocked()
	if err != nil {
		return nil, err
	}
	if err := ca.Init(); err != nil {
		return nil, err
	}
	return ca.BundlePEM()
}
