package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Defaults of broker mode (workloadMethod broker).
const (
	// DefaultSPIREAgent is where docs/templates.md has the template install
	// SPIRE's spire-agent.
	DefaultSPIREAgent = "/opt/spire/bin/spire-agent"
	// DefaultAttestTimeout bounds attesting and fetching the credential.
	DefaultAttestTimeout = 5 * time.Minute
)

// SPIREDir is where (under Options.Root) the agent keeps, in a private
// directory of each run, what spire-agent needs while it attests: its
// config (with the join token), the trust bundle, the TPM DevID's files
// (attestationMethod tpm), its data directory, the Workload API socket and
// the fetched X509-SVID. /run is a tmpfs, so not
// even a crash leaves them on the disk; the agent removes them anyway as
// soon as it has the credential.
const SPIREDir = "/run/hyperfleet/spire"

// Names in the run directory.
const (
	spireConfigFile = "agent.conf"
	spireBundleFile = "bundle.pem"
	spireDataDir    = "data"
	spireSocket     = "api.sock"
	spireSVIDDir    = "svid"
	// The TPM DevID's files (attestationMethod tpm), which spire-agent's
	// tpm_devid attestor reads when it starts.
	devIDCertFile = "devid.pem"
	devIDPubFile  = "devid.pub"
	devIDPrivFile = "devid.priv"
)

// maxSocketPath is the longest unix socket path Linux takes (108 bytes
// with the terminating NUL).
const maxSocketPath = 107

// spireStopGrace is how long spire-agent has to exit after SIGTERM.
const spireStopGrace = 10 * time.Second

// firstFetchInterval and fetchInterval bound the pause between two
// Workload API fetches: an agent syncs its registration entries every 5
// seconds, so an SVID can take a few seconds to appear after the
// attestation, but its socket often appears within a fraction of one, and
// a second lost there is a second of every VM's start (and of every case
// of the agent's property tests). The pause doubles from the first to the
// second.
const (
	firstFetchInterval = 50 * time.Millisecond
	fetchInterval      = time.Second
)

// errJoinTokenRefused marks the attestation failure of a join token the
// SPIRE server refused (used already, or expired): the agent says so in
// its power-off notice, since a used token the VM never used is a stolen
// one (agentconfig.AttestationJoinTokenRefused).
var errJoinTokenRefused = errors.New("the SPIRE server refused the join token")

// refusedToken are what spire-agent logs when the server refuses its join
// token; it then retries for a minute for nothing, which the agent does
// not wait for.
var refusedToken = []string{
	"join token does not exist or has already been used",
	"join token expired",
}

// agentConfigTemplate is spire-agent's configuration: the server, the
// bundle it is trusted by, the node attestor's settings (nodeAttestor),
// keys in memory (nothing to remove from the disk afterwards; the agent
// stops spire-agent once it has its credential, and a join-token agent
// cannot attest again after a restart anyway), and the unix workload
// attestor, which identifies the agent by its uid. Values are quoted with
// hclString.
const agentConfigTemplate = `agent {
	data_dir = %s
	server_address = %s
	server_port = %d
	socket_path = %s
	trust_bundle_path = %s
	trust_domain = %s
%s	log_level = "INFO"
}

plugins {
	NodeAttestor %s {
		plugin_data {%s}
	}
	KeyManager "memory" {
		plugin_data {}
	}
	WorkloadAttestor "unix" {
		plugin_data {}
	}
}
`

// nodeAttestor is how spire-agent attests: with the join token (in its
// 0600 config file rather than on the command line, since
// /proc/<pid>/cmdline is world-readable), or, when devID is set, with the
// TPM DevID the operator certified (SPIRE's tpm_devid attestor; its files
// are in the run directory, the TPM at tpmDevice).
type nodeAttestor struct {
	joinToken string
	devID     *devIDFiles
	tpmDevice string
}

// devIDFiles are the paths of the DevID's files spire-agent's tpm_devid
// reads: the certificate in PEM, the TPM's public and private blobs.
type devIDFiles struct {
	cert, pub, priv string
}

// hclString quotes s for an HCL file. Only printable ASCII is accepted, so
// that no value can end its string and add settings of its own.
func hclString(field, s string) (string, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return "", fail(ExitBadConfig, "%s holds a character spire-agent's config cannot take (byte %d); use printable ASCII", field, i)
		}
	}
	return strconv.Quote(s), nil
}

// spireAgentConfig renders spire-agent's config for s, attesting with
// att, in dir.
func spireAgentConfig(s *agentconfig.SPIFFE, att nodeAttestor, dir string) ([]byte, error) {
	host, portText, err := net.SplitHostPort(s.ServerAddress)
	if err != nil {
		return nil, fail(ExitBadConfig, "spiffe.serverAddress: %v", err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil || port == 0 {
		return nil, fail(ExitBadConfig, "spiffe.serverAddress: port %q is not a port number", portText)
	}
	var errs []error
	quote := func(field, value string) string {
		q, err := hclString(field, value)
		if err != nil {
			errs = append(errs, err)
		}
		return q
	}
	// The attestor's settings, one per line, in the agent block (the
	// join token) or in the plugin's plugin_data (tpm_devid).
	var agentSettings, plugin, pluginData string
	if d := att.devID; d != nil {
		plugin = `"tpm_devid"`
		pluginData = "\n" +
			"\t\t\tdevid_cert_path = " + quote("the SPIRE directory", d.cert) + "\n" +
			"\t\t\tdevid_priv_path = " + quote("the SPIRE directory", d.priv) + "\n" +
			"\t\t\tdevid_pub_path = " + quote("the SPIRE directory", d.pub) + "\n" +
			"\t\t\ttpm_device_path = " + quote("spiffe.tpmDevicePath", att.tpmDevice) + "\n\t\t"
	} else {
		plugin = `"join_token"`
		agentSettings = "\tjoin_token = " + quote("the join token at secretsFile", att.joinToken) + "\n"
	}
	conf := fmt.Appendf(nil, agentConfigTemplate,
		quote("the SPIRE directory", filepath.Join(dir, spireDataDir)),
		quote("spiffe.serverAddress", host),
		port,
		quote("the SPIRE directory", filepath.Join(dir, spireSocket)),
		quote("the SPIRE directory", filepath.Join(dir, spireBundleFile)),
		quote("spiffe.trustDomain", s.TrustDomain),
		agentSettings, plugin, pluginData)
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return conf, nil
}

// spireRun is one attestation: a private directory and, unless the agent
// uses a pre-installed spire-agent's socket, the spire-agent it started.
type spireRun struct {
	log    *slog.Logger
	bin    string // spire-agent, for `api fetch x509` in both modes
	dir    string // private run directory (0700)
	base   string // its parent, SPIREDir under the root
	socket string
	token  string // the join token, redacted from every message

	// Set when the agent started spire-agent itself.
	cmd     *exec.Cmd
	out     *tailBuffer
	done    chan struct{} // closed when spire-agent exited
	waitErr error         // read after done
	conf    string        // removed once the agent attested

	// fetchAs, when set, is the user the SVID is fetched as: a generic
	// VM's script user, whom the VM's entry selects instead of the
	// agent (HoldIdentity). Nil: the agent's own user.
	fetchAs *credential
}

// newSPIRERun creates a private directory for one run under base (created
// 0700 when missing).
func newSPIRERun(log *slog.Logger, bin, base string) (*spireRun, error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, fail(ExitAttestation, "create the SPIRE directory: %w", err)
	}
	dir, err := os.MkdirTemp(base, "attest-")
	if err != nil {
		return nil, fail(ExitAttestation, "create the SPIRE directory: %w", err)
	}
	return &spireRun{log: log, bin: bin, dir: dir, base: base}, nil
}

// start writes spire-agent's config (attesting with att) and trust bundle
// and starts it; it returns at once, before the attestation.
func (r *spireRun) start(s *agentconfig.SPIFFE, att nodeAttestor) error {
	r.token = att.joinToken
	r.socket = filepath.Join(r.dir, spireSocket)
	if len(r.socket) > maxSocketPath {
		return fail(ExitAttestation, "the Workload API socket path %s is longer than %d bytes; use a shorter --root", r.socket, maxSocketPath)
	}
	conf, err := spireAgentConfig(s, att, r.dir)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(r.dir, spireBundleFile), []byte(s.TrustBundle), 0o600); err != nil {
		return fail(ExitAttestation, "write the SPIRE trust bundle: %w", err)
	}
	r.conf = filepath.Join(r.dir, spireConfigFile)
	if err := os.WriteFile(r.conf, conf, 0o600); err != nil {
		return fail(ExitAttestation, "write spire-agent's config: %w", err)
	}
	r.out = &tailBuffer{max: 32 << 10}
	cmd := exec.Command(r.bin, "run", "-config", r.conf)
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		return fail(ExitAttestation, "start spire-agent (--spire-agent %s; docs/templates.md, \"SPIFFE mode: installing spire-agent\"): %w", r.bin, err)
	}
	r.cmd = cmd
	r.done = make(chan struct{})
	go func() {
		r.waitErr = r.cmd.Wait()
		close(r.done)
	}()
	method := "join_token"
	if att.devID != nil {
		method = "tpm_devid"
	}
	r.log.Info("spire-agent started", "pid", r.cmd.Process.Pid, "serverAddress", s.ServerAddress, "trustDomain", s.TrustDomain, "nodeAttestor", method, "dir", r.dir)
	return nil
}

// useSocket makes the run fetch from a pre-installed spire-agent's
// Workload API.
func (r *spireRun) useSocket(socket string) {
	r.socket = socket
}

// waitSVID fetches the X509-SVID from the Workload API until it gets one,
// ctx ends, spire-agent exits or the server refuses the join token. The
// join token leaves the disk as soon as the Workload API is up (the agent
// has attested). It returns the SVID's certificate and key, whose files
// are gone again.
func (r *spireRun) waitSVID(parent, ctx context.Context, s *agentconfig.SPIFFE) (tls.Certificate, string, error) {
	svidDir := filepath.Join(r.dir, spireSVIDDir)
	if err := os.Mkdir(svidDir, 0o700); err != nil {
		return tls.Certificate{}, "", fail(ExitAttestation, "create the SVID directory: %w", err)
	}
	defer os.RemoveAll(svidDir)
	pause := firstFetchInterval
	wait := time.NewTimer(pause)
	defer wait.Stop()
	last := "the Workload API socket does not exist yet"
	for {
		if r.out != nil && r.out.containsAny(refusedToken) {
			return tls.Certificate{}, "", fail(ExitAttestation,
				"%w (used already, or expired): ask for a new VM; spire-agent's last lines:\n%s", errJoinTokenRefused, r.logTail())
		}
		if isSocket(r.socket) {
			r.removeToken()
			if err := r.openToFetcher(svidDir); err != nil {
				return tls.Certificate{}, "", err
			}
			out, err := r.fetch(ctx, svidDir)
			if err == nil {
				return r.loadSVID(svidDir, s)
			}
			last = out
			if last == "" {
				last = err.Error()
			}
		}
		select {
		case <-parent.Done():
			return tls.Certificate{}, "", fmt.Errorf("attestation stopped: %w", parent.Err())
		case <-ctx.Done():
			return tls.Certificate{}, "", fail(ExitAttestation, "no X509-SVID from the Workload API at %s before the attestation deadline (--attest-timeout, expiresAt); last answer: %s%s",
				r.socket, r.redact(last), r.logTailSuffix())
		case <-r.done:
			return tls.Certificate{}, "", fail(ExitAttestation, "spire-agent exited (%v) before the agent had its X509-SVID; spire-agent's last lines:\n%s", r.waitErr, r.logTail())
		case <-wait.C:
			pause = min(2*pause, fetchInterval)
			wait.Reset(pause)
		}
	}
}

// fetch runs `spire-agent api fetch x509` once, writing the SVID into dir,
// and returns its output on failure.
func (r *spireRun) fetch(ctx context.Context, dir string) (string, error) {
	cmd := exec.CommandContext(ctx, r.bin, "api", "fetch", "x509", "-socketPath", r.socket, "-write", dir, "-silent", "-timeout", "5s")
	if r.fetchAs != nil {
		// The Workload API tells callers apart by their uid: the SVID
		// is the fetcher's only.
		cmd.SysProcAttr = fetchProcAttr(r.fetchAs)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(tailString(string(out), 1024)), fmt.Errorf("spire-agent api fetch x509: %w", err)
	}
	return "", nil
}

// openToFetcher lets fetchAs, another user than the agent's, reach the
// socket and write the SVID into svidDir: the directories above the
// socket become traversable (0711, not listable), the socket writable
// (spire-agent makes it 0750 under its umask), and svidDir fetchAs's own.
// It runs after removeToken, so no file left in them holds the join
// token, and after the guest secrets were read and removed from
// /run/hyperfleet, the parent of SPIREDir, which stays private until
// then. spire-agent's data directory stays 0700. Every local process may
// reach a Workload API: the unix workload attestor tells its callers
// apart by uid, so only the entry's user gets the VM's SVID.
func (r *spireRun) openToFetcher(svidDir string) error {
	if r.fetchAs == nil {
		return nil
	}
	for _, dir := range []string{filepath.Dir(r.base), r.base, r.dir} {
		if err := os.Chmod(dir, 0o711); err != nil {
			return fail(ExitInternal, "open %s to the script user: %v", dir, err)
		}
	}
	if r.cmd != nil {
		// Ours; a pre-installed spire-agent's socket is its owner's.
		if err := os.Chmod(r.socket, 0o777); err != nil {
			return fail(ExitInternal, "open the Workload API socket to the script user: %v", err)
		}
	}
	if err := os.Chown(svidDir, int(r.fetchAs.Uid), int(r.fetchAs.Gid)); err != nil {
		return fail(ExitInternal, "hand the SVID directory to the script user: %v", err)
	}
	return nil
}

// removeToken removes spire-agent's config, the one file that holds the
// join token: spire-agent read it at start and has attested.
func (r *spireRun) removeToken() {
	if r.conf == "" {
		return
	}
	if err := os.Remove(r.conf); err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Error("cannot remove spire-agent's config, which holds the join token", "path", r.conf, "error", err)
		return
	}
	r.log.Info("spire-agent attested; its config with the join token removed", "path", r.conf)
	r.conf = ""
}

// loadSVID reads the SVID files `api fetch x509 -write` left in dir
// (svid.N.pem, svid.N.key, bundle.N.pem), picks the one for s.SPIFFEID
// (any one in the trust domain when unset), and removes them.
func (r *spireRun) loadSVID(dir string, s *agentconfig.SPIFFE) (tls.Certificate, string, error) {
	defer os.RemoveAll(dir)
	var ids []string
	for i := 0; ; i++ {
		certPEM, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("svid.%d.pem", i)))
		if errors.Is(err, os.ErrNotExist) {
			break
		}
		if err != nil {
			return tls.Certificate{}, "", fail(ExitAttestation, "read the X509-SVID: %w", err)
		}
		id, err := svidID(certPEM)
		if err != nil {
			return tls.Certificate{}, "", fail(ExitAttestation, "the Workload API's X509-SVID %d: %w", i, err)
		}
		ids = append(ids, id)
		if (s.SPIFFEID != "" && id != s.SPIFFEID) || !inTrustDomain(id, s.TrustDomain) {
			continue
		}
		keyPEM, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("svid.%d.key", i)))
		if err != nil {
			return tls.Certificate{}, "", fail(ExitAttestation, "read the X509-SVID's key: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		clear(keyPEM)
		if err == nil && cert.Leaf == nil {
			// Go fills Leaf in unless GODEBUG x509keypairleaf=0 says not to.
			cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
		}
		if err != nil {
			return tls.Certificate{}, "", fail(ExitAttestation, "load the X509-SVID %s: %w", id, err)
		}
		return cert, id, nil
	}
	want := s.SPIFFEID
	if want == "" {
		want = "an ID in trust domain " + s.TrustDomain
	}
	return tls.Certificate{}, "", fail(ExitAttestation,
		"the Workload API issued uid %d %s, not %s (spiffe.spiffeID): check the registration entry of the VM (parent, selector unix:uid:%[1]d or that user's name)",
		r.fetcherUID(), strings.Join(ids, ", "), want)
}

// fetcherUID is the uid the SVID is fetched as.
func (r *spireRun) fetcherUID() int {
	if r.fetchAs != nil {
		return int(r.fetchAs.Uid)
	}
	return os.Getuid()
}

// svidID is the SPIFFE ID of the leaf certificate in certPEM: its one URI
// SAN, a spiffe:// URI.
func svidID(certPEM []byte) (string, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return "", errors.New("no PEM certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "", fmt.Errorf("parse the certificate: %w", err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].Scheme != "spiffe" || cert.URIs[0].Host == "" {
		return "", fmt.Errorf("not an X509-SVID: it has %d URI SANs, want one spiffe:// ID", len(cert.URIs))
	}
	return cert.URIs[0].String(), nil
}

func inTrustDomain(id, trustDomain string) bool {
	rest, ok := strings.CutPrefix(id, "spiffe://"+trustDomain)
	return ok && (rest == "" || strings.HasPrefix(rest, "/"))
}

// stop ends spire-agent (SIGTERM, then SIGKILL) and removes the run
// directory with everything of the identity: the config if still there,
// the data directory, the socket, any SVID file.
func (r *spireRun) stop() {
	if r.cmd != nil {
		select {
		case <-r.done:
		default:
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(spireStopGrace):
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
		r.log.Info("spire-agent stopped", "pid", r.cmd.Process.Pid)
	}
	if err := os.RemoveAll(r.dir); err != nil {
		r.log.Error("cannot remove the SPIRE directory", "path", r.dir, "error", err)
		return
	}
	r.log.Info("SPIRE directory removed", "path", r.dir)
}

func (r *spireRun) redact(s string) string {
	return agentconfig.RedactSecrets(s, r.token)
}

// logTail is spire-agent's last lines, join token redacted (its agent ID,
// spiffe://<trust domain>/spire/agent/join_token/<token>, holds it).
func (r *spireRun) logTail() string {
	if r.out == nil {
		return "(spire-agent was not started by this agent)"
	}
	return r.redact(r.out.lastLines(20))
}

func (r *spireRun) logTailSuffix() string {
	if r.out == nil {
		return ""
	}
	return "; spire-agent's last lines:\n" + r.logTail()
}

func isSocket(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&os.ModeSocket != 0
}

// tailBuffer keeps the last max bytes written to it: spire-agent's log,
// for error messages, never on the disk.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) containsAny(subs []string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range subs {
		if bytes.Contains(t.b, []byte(s)) {
			return true
		}
	}
	return false
}

// lastLines returns the last n complete or partial lines.
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimRight(string(t.b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// fetchJWT runs `spire-agent api fetch jwt` once and returns the JWT-SVID
// for audience of spiffeID (the one SVID the Workload API gives when
// empty). Its errors never quote a token.
func (r *spireRun) fetchJWT(ctx context.Context, audience, spiffeID string) (string, error) {
	args := []string{"api", "fetch", "jwt", "-audience", audience, "-socketPath", r.socket, "-timeout", "5s"}
	if spiffeID != "" {
		args = append(args, "-spiffeID", spiffeID)
	}
	out, err := exec.CommandContext(ctx, r.bin, args...).Output()
	if err != nil {
		var exit *exec.ExitError
		msg := ""
		if errors.As(err, &exit) {
			msg = ": " + strings.TrimSpace(tailString(string(exit.Stderr), 1024))
		}
		return "", fmt.Errorf("spire-agent api fetch jwt: %w%s", err, r.redact(msg))
	}
	return parseJWTSVID(out, spiffeID)
}

// parseJWTSVID picks the token of spiffeID (any when empty) from the pretty
// output of `spire-agent api fetch jwt`:
//
//	token(spiffe://example.org/vm/...):
//		eyJhbGciOi...
//	bundle(spiffe://example.org):
//		{"keys": ...}
func parseJWTSVID(out []byte, spiffeID string) (string, error) {
	lines := strings.Split(string(out), "\n")
	var ids []string
	for i := 0; i+1 < len(lines); i++ {
		id, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "token(")
		if !ok || !strings.HasSuffix(id, "):") {
			continue
		}
		id = strings.TrimSuffix(id, "):")
		ids = append(ids, id)
		if spiffeID != "" && id != spiffeID {
			continue
		}
		if tok := strings.TrimSpace(lines[i+1]); strings.Count(tok, ".") == 2 {
			return tok, nil
		}
	}
	if len(ids) == 0 {
		return "", errors.New("spire-agent api fetch jwt printed no JWT-SVID")
	}
	return "", fmt.Errorf("spire-agent api fetch jwt gave JWT-SVIDs for %s, not %s (spiffe.spiffeID)", strings.Join(ids, ", "), spiffeID)
}
