// Package swtpm runs software TPMs for tests: swtpm's local CA
// (swtpm_localca), which signs each TPM's endorsement key (EK) certificate
// as a Proxmox host's does for its VMs' vTPMs, and swtpm itself serving
// TPM 2.0 commands on a unix socket, which go-tpm and spire-agent's
// tpm_devid open by path as they open /dev/tpmrm0.
//
// It is test world: the product binaries never link it. The tools are
// Debian's swtpm and swtpm-tools packages (swtpm 0.7); a missing tool is
// an error, which the tests turn into a failure, never a skip.
package swtpm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FileScheme prefixes a state that is one file (swtpm's linear file
// backend, which Proxmox uses for a VM's tpmstate0 volume) rather than a
// directory.
const FileScheme = "file://"

// The swtpm_localca state files. Their names are fixed by swtpm_localca
// (the root CA's) or chosen by LocalCA's configuration (the issuer's).
const (
	rootCertFile   = "swtpm-localca-rootca-cert.pem"
	issuerCertFile = "issuercert.pem"
	setupConfFile  = "swtpm_setup.conf"
	caConfFile     = "swtpm-localca.conf"
	caOptionsFile  = "swtpm-localca.options"
)

// LocalCA is swtpm's local CA (swtpm_localca), in its own directory, as
// Proxmox's hosts have one. Its first Manufacture creates a two-level CA
// (swtpm-localca-rootca, which signs the issuing swtpm-localca); every
// TPM it manufactures gets an EK certificate from the issuer.
type LocalCA struct {
	// Dir holds the configuration and the CA's keys and certificates.
	Dir string

	setupConf string
}

// NewLocalCA writes the configuration of a local CA living in dir:
// swtpm_setup's configuration, pointing its certificate tool at
// swtpm_localca with a configuration and options file of its own, so that
// nothing is read from or written to /etc or /var/lib/swtpm-localca.
func NewLocalCA(dir string) (*LocalCA, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("swtpm: local CA directory: %w", err)
	}
	tool, err := exec.LookPath("swtpm_localca")
	if err != nil {
		return nil, fmt.Errorf("swtpm: swtpm_localca is not installed (Debian: apt-get install swtpm-tools; hack/test-deps.sh installs it): %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("swtpm: local CA directory: %w", err)
	}
	ca := &LocalCA{Dir: dir, setupConf: filepath.Join(dir, setupConfFile)}
	files := map[string]string{
		caConfFile: fmt.Sprintf("statedir = %s\nsigningkey = %s\nissuercert = %s\ncertserial = %s\n",
			dir, filepath.Join(dir, "signkey.pem"), filepath.Join(dir, issuerCertFile), filepath.Join(dir, "certserial")),
		// The platform certificate's attributes; swtpm_localca requires
		// them with --create-platform-cert.
		caOptionsFile: "--platform-manufacturer HyperFleet\n--platform-version 2.1\n--platform-model swtpm\n",
		setupConfFile: fmt.Sprintf("create_certs_tool = %s\ncreate_certs_tool_config = %s\ncreate_certs_tool_options = %s\nactive_pcr_banks = sha256\n",
			tool, filepath.Join(dir, caConfFile), filepath.Join(dir, caOptionsFile)),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return nil, fmt.Errorf("swtpm: writing the local CA's %s: %w", name, err)
		}
	}
	return ca, nil
}

// Manufacture creates a TPM 2.0's state as a vendor would: an RSA and an
// ECC EK, their certificates and a platform certificate signed by the
// local CA in NV memory (the RSA EK's at index 0x01c00002), and NV memory
// locked. state is a directory or a "file://<path>" URI (swtpm 0.7's
// swtpm_setup writes the linear file backend too); an existing state is
// overwritten.
func (ca *LocalCA) Manufacture(state string) error {
	if err := makeStateParent(state); err != nil {
		return err
	}
	out, err := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state,
		"--create-ek-cert", "--create-platform-cert", "--lock-nvram",
		"--config", ca.setupConf, "--overwrite").CombinedOutput()
	if err != nil {
		return fmt.Errorf("swtpm: manufacturing a TPM in %s: swtpm_setup: %w\n%s", state, err, out)
	}
	return nil
}

// Init makes the local CA's certificates exist without a TPM to keep:
// swtpm_localca creates its root and issuing CA only while it signs a
// first EK, yet a verifier (spire-server's endorsement_ca_path, the
// cluster's EK CA Secret) must have the bundle before any VM starts. It
// manufactures one throwaway TPM state, in a temporary directory it
// removes, when the CA has no certificates yet; otherwise it does nothing.
func (ca *LocalCA) Init() error {
	if _, err := ca.BundlePEM(); err == nil {
		return nil
	}
	dir, err := os.MkdirTemp("", "swtpm-init-")
	if err != nil {
		return fmt.Errorf("swtpm: initialising the local CA: %w", err)
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := ca.Manufacture(filepath.Join(dir, "state")); err != nil {
		return fmt.Errorf("swtpm: initialising the local CA: %w", err)
	}
	if _, err := ca.BundlePEM(); err != nil {
		return fmt.Errorf("swtpm: initialising the local CA: %w", err)
	}
	return nil
}

// makeStateParent creates the state's directory, or the directory of the
// state's file.
func makeStateParent(state string) error {
	dir := state
	if path, ok := strings.CutPrefix(state, FileScheme); ok {
		dir = filepath.Dir(path)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("swtpm: TPM state directory: %w", err)
	}
	return nil
}

// BundlePEM returns the local CA's certificates, root and issuer, as PEM:
// what a verifier of the EK certificates trusts. SPIRE's tpm_devid server
// passes no intermediates, so both must be in its endorsement bundle. It
// exists after the first Manufacture or Init.
func (ca *LocalCA) BundlePEM() ([]byte, error) {
	var bundle []byte
	for _, name := range []string{rootCertFile, issuerCertFile} {
		b, err := os.ReadFile(filepath.Join(ca.Dir, name))
		if err != nil {
			return nil, fmt.Errorf("swtpm: the local CA's certificate (manufacture a TPM first): %w", err)
		}
		bundle = append(bundle, bytes.TrimSpace(b)...)
		bundle = append(bundle, '\n')
	}
	return bundle, nil
}

// StartTimeout bounds how long swtpm may take to accept on its socket.
const StartTimeout = 10 * time.Second

// TPM is a running swtpm serving TPM 2.0 commands on a unix socket.
type TPM struct {
	// Socket is the TPM command socket: a path go-tpm's OpenTPM and
	// spire-agent's tpm_device_path take.
	Socket string
	// Ctrl is swtpm's control socket, Socket + ".ctrl", where tpm2-tools'
	// swtpm TCTI and QEMU's -tpmdev emulator expect it.
	Ctrl string
	// LogPath is swtpm's log.
	LogPath string

	cmd      *exec.Cmd
	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

// Start runs swtpm on state (a directory or a "file://" URI, as
// Manufacture takes) with its sockets in runDir, already initialised and
// started up (as firmware would have done), and waits until it accepts
// connections. runDir should be short: a unix socket's path is limited to
// 107 bytes.
func Start(state, runDir string) (*TPM, error) {
	tpmstate := "dir=" + state
	if strings.HasPrefix(state, FileScheme) {
		tpmstate = "backend-uri=" + state
	}
	t := &TPM{
		Socket:  filepath.Join(runDir, "tpm.sock"),
		Ctrl:    filepath.Join(runDir, "tpm.sock.ctrl"),
		LogPath: filepath.Join(runDir, "swtpm.log"),
		done:    make(chan struct{}),
	}
	if len(t.Ctrl) > 107 {
		return nil, fmt.Errorf("swtpm: the socket path %s is longer than a unix socket's 107 bytes", t.Ctrl)
	}
	bin, err := exec.LookPath("swtpm")
	if err != nil {
		return nil, fmt.Errorf("swtpm: swtpm is not installed (Debian: apt-get install swtpm; hack/test-deps.sh installs it): %w", err)
	}
	logFile, err := os.Create(t.LogPath)
	if err != nil {
		return nil, fmt.Errorf("swtpm: creating the log: %w", err)
	}
	t.cmd = exec.Command(bin, "socket", "--tpm2", "--tpmstate", tpmstate,
		"--server", "type=unixio,path="+t.Socket,
		"--ctrl", "type=unixio,path="+t.Ctrl,
		"--flags", "not-need-init,startup-clear")
	t.cmd.Stdout = logFile
	t.cmd.Stderr = logFile
	// Its own process group: a terminal's Ctrl-C reaches the test, which
	// stops swtpm itself.
	t.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := t.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("swtpm: starting swtpm: %w", err)
	}
	go func() {
		t.waitErr = t.cmd.Wait()
		_ = logFile.Close()
		close(t.done)
	}()
	if err := t.waitAccepting(StartTimeout); err != nil {
		_ = t.Stop()
		return nil, fmt.Errorf("swtpm: %w\nswtpm log:\n%s", err, t.Log())
	}
	return t, nil
}

// waitAccepting dials the command socket until it accepts, swtpm exits or
// timeout passes, then has the TPM answer one command: swtpm may accept
// before it found out that it cannot keep its state (a state file in a
// missing directory), and exit only then, so accepting alone is not
// ready (TestStartFailsWithoutState failed once that way).
func (t *TPM) waitAccepting(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", t.Socket)
		if err == nil {
			err = answers(ctx, conn)
			_ = conn.Close()
			if err == nil {
				return nil
			}
			select {
			case <-t.done:
				return fmt.Errorf("swtpm exited after accepting on %s: %w (its command: %w)", t.Socket, t.waitErr, err)
			default:
				return fmt.Errorf("swtpm accepted on %s but did not answer a TPM command: %w", t.Socket, err)
			}
		}
		select {
		case <-t.done:
			return fmt.Errorf("swtpm exited before accepting on %s: %w", t.Socket, t.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("swtpm did not accept on %s within %s: %w", t.Socket, timeout, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// answers sends TPM2_GetRandom for 8 bytes on conn and checks that the TPM
// answers it with success.
func answers(ctx context.Context, conn net.Conn) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	// tag TPM_ST_NO_SESSIONS, size 12, TPM_CC_GetRandom, bytesRequested 8
	cmd := []byte{0x80, 0x01, 0, 0, 0, 12, 0, 0, 0x01, 0x7b, 0, 8}
	if _, err := conn.Write(cmd); err != nil {
		return fmt.Errorf("send TPM2_GetRandom: %w", err)
	}
	head := make([]byte, 10)
	if _, err := io.ReadFull(conn, head); err != nil {
		return fmt.Errorf("read the answer to TPM2_GetRandom: %w", err)
	}
	if rc := binary.BigEndian.Uint32(head[6:10]); rc != 0 {
		return fmt.Errorf("TPM2_GetRandom answered response code 0x%x", rc)
	}
	return nil
}

// Stop ends swtpm (SIGTERM, then SIGKILL after 5 seconds) and waits for
// it. It may be called more than once; a swtpm that had exited on its own
// is an error.
func (t *TPM) Stop() error {
	var err error
	t.stopOnce.Do(func() {
		select {
		case <-t.done:
			err = fmt.Errorf("swtpm: swtpm had exited: %w", t.waitErr)
			return
		default:
		}
		_ = t.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-t.done:
		case <-time.After(5 * time.Second):
			_ = t.cmd.Process.Kill()
			<-t.done
		}
		var exit *exec.ExitError
		// A swtpm killed by the signal above is how it stops, not an error.
		if t.waitErr != nil && (!errors.As(t.waitErr, &exit) || exit.Exited()) {
			err = fmt.Errorf("swtpm: stopping swtpm: %w", t.waitErr)
		}
	})
	return err
}

// Log returns swtpm's log so far.
func (t *TPM) Log() string {
	b, err := os.ReadFile(t.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", t.LogPath, err)
	}
	return string(b)
}
