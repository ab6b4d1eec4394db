package proxmoxsim

import (
	"fmt"
	"os"
	"path/filepath"
)

// A simulated (process) guest's TPM: the same swtpm a real guest gets
// (realtpm.go: on the VM's tpmstate0 volume, manufactured with the
// simulator's local CA on the first start, its state kept in the volume
// when it stops), served to the guest program as the device its kernel
// would give it, /dev/tpmrm0 under the guest's root (HF_SIM_ROOT): the
// agent's --root puts spiffe.tpmDevicePath there, and go-tpm and
// spire-agent's tpm_devid open a unix socket path as a TPM.

// guestTPMDevice is where the guest finds its TPM, under its root.
const guestTPMDevice = "dev/tpmrm0"

// guestTPM is the TPM of one boot of a process guest.
type guestTPM struct {
	tpm     *realTPM
	node    string
	sockDir string
}

// startGuestTPMLocked starts the swtpm of v's tpmstate0 for a process
// guest whose root is root, and links <root>/dev/tpmrm0 to its command
// socket; nil when v has no tpmstate0. The socket lives in a short
// directory of its own, not under root: a unix socket's path is limited to
// 107 bytes and the guests' work directory may be anywhere (a test's
// temporary directory is named after the test). go-tpm and spire-agent
// follow the link (os.Stat), as the kernel's device node would be opened.
func (s *Simulator) startGuestTPMLocked(v *vm, dir, root string) (*guestTPM, error) {
	val, ok := v.conf[tpmKey]
	if !ok {
		return nil, nil
	}
	if ver := tpmVersion(val); ver != tpmV20 {
		return nil, fmt.Errorf("tpmstate0 version %s: the simulator's guests get TPM 2.0 only", ver)
	}
	r, err := s.realGuestsLocked()
	if err != nil {
		return nil, err
	}
	sockDir, err := os.MkdirTemp("", "hf-tpm-")
	if err != nil {
		return nil, fmt.Errorf("TPM socket directory: %w", err)
	}
	t, err := r.startTPMLocked(v, dir, sockDir)
	if err != nil {
		_ = os.RemoveAll(sockDir)
		return nil, err
	}
	g := &guestTPM{tpm: t, node: v.node, sockDir: sockDir}
	device := filepath.Join(root, filepath.FromSlash(guestTPMDevice))
	if err := os.MkdirAll(filepath.Dir(device), 0o755); err != nil {
		s.stopGuestTPMLocked(g)
		return nil, fmt.Errorf("the guest's /dev: %w", err)
	}
	_ = os.Remove(device)
	if err := os.Symlink(t.tpm.Socket, device); err != nil {
		s.stopGuestTPMLocked(g)
		return nil, fmt.Errorf("the guest's %s: %w", guestTPMDevice, err)
	}
	return g, nil
}

// stopGuestTPMLocked stops a process guest's swtpm (once; its state goes
// back to the volume) and removes its sockets; nil is no TPM.
func (s *Simulator) stopGuestTPMLocked(g *guestTPM) {
	if g == nil || s.real == nil {
		return
	}
	s.real.stopTPMLocked(g.tpm, g.node)
	_ = os.RemoveAll(g.sockDir)
}
