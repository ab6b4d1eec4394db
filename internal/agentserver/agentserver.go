// Package agentserver serves the in-VM agent binary (hyperfleet-agent) to
// VMs over HTTPS, for templates with spec.bootstrap.agentSource Operator,
// and takes the agents' power-off notices; the same server carries the
// credential broker (internal/broker).
//
// Why it exists: baking the agent into every Proxmox template ties each
// agent upgrade to rebuilding every template. With the operator serving the
// binary, a VM's cloud-init downloads it at first boot and installs it only
// if its SHA-256 matches the one the operator put into that VM's user-data,
// so the binary is exactly the operator's whatever the network in between
// (internal/cloudinit writes the download script).
//
// The server hands out files named hyperfleet-agent-<os>-<arch> (Go's
// naming: linux-amd64, linux-arm64) from one directory, under
//
//	GET/HEAD /agent/v1/<name>          the binary (application/octet-stream)
//	GET/HEAD /agent/v1/<name>.sha256   "<hex>  <name>\n", as sha256sum prints it
//
// Every file is opened and hashed once, in New: the server then serves the
// bytes it hashed, from the open file, for as long as it runs. The files
// must therefore not change in place while served (a file replaced by
// rename, as a new container image or a volume update does, keeps being
// served in its old version until the next start; writing into it in place
// makes VMs reject the download and power off). Adding a binary needs a
// restart.
//
// Every VM can reach this server and any of them may run a hostile job,
// so it is bounded like an internet-facing endpoint (internal/httpsserver;
// docs/security.md, "The agent server's bounds"): connection caps per
// source address and in all, part of them kept for the broker, the
// enrollment and the hints, each connection's first request line read
// before anything else (a path not served here, or a feature no
// HypervisorCluster configures, is answered 404 and closed there), and
// every download bounded in time.
//
// Every manager replica serves the files (the Server does not need leader
// election), so a Service in front of all replicas is what VMs reach. The
// download URL carries the expected checksum (?sha256=): a replica holding
// another build of the file (during a rolling upgrade) answers 503 so that
// the VM's curl retries, possibly reaching another replica, instead of
// downloading bytes it will reject.
package agentserver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
)

// PathPrefix is the URL path under which binaries are served.
const PathPrefix = "/agent/v1/"

// PowerOffPath is where VMs announce their power-off: POST
// PowerOffPath/<namespace>/<name>/<uid> of their claim
// (agentconfig.PowerOffNotify.NoticeURL) with the claim's bearer token and
// an agentconfig.PowerOffNoticeBody as JSON. The claim is in the path so
// that the token is checked before any body byte is read.
const PowerOffPath = "/hints/v1/power-off"

// ReadyPath is where VMs' agents say they run and wait for the secrets the
// operator places in the VM: POST ReadyPath/<namespace>/<name>/<uid> of
// their claim (agentconfig.PowerOffNotify.ReadyHintURL) with the claim's
// notice token and no body. Checked, and bounded, as power-off notices.
const ReadyPath = "/hints/v1/ready"

// Errors a PowerOffReceiver returns, mapped to answers.
var (
	// ErrBadToken: the token is not the claim's (401). Nothing else was
	// looked at.
	ErrBadToken = errors.New("the token is not this claim's power-off token")
	// ErrRetry: this replica cannot take the notice now (it is not the
	// leader); 503 with Retry-After, the VM's agent retries.
	ErrRetry = errors.New("this replica cannot take power-off notices now")
)

// PowerOffReceiver takes VMs' power-off notices (docs/architecture.md,
// "Power-off hints").
type PowerOffReceiver interface {
	// AuthorizePowerOff verifies token for claim, without any other work
	// (no read, no lock): ErrBadToken when it is not the claim's. The
	// server calls it before it reads the notice's body.
	AuthorizePowerOff(claim agentconfig.ClaimRef, token string) error
	// PowerOffNotice treats an authorized notice as a hint about the
	// claim's VM. ErrRetry is answered 503, any other error 500.
	PowerOffNotice(ctx context.Context, notice agentconfig.PowerOffNotice) error
	// AuthorizeReady is AuthorizePowerOff for a ready hint.
	AuthorizeReady(claim agentconfig.ClaimRef, token string) error
	// ReadyHint treats an authorized ready hint (the claim's agent runs
	// and waits for its secrets) as a reason to look at the claim's VM
	// now. Errors are answered as PowerOffNotice's.
	ReadyHint(ctx context.Context, claim agentconfig.ClaimRef) error
}

// maxNoticeBytes bounds a power-off notice's body (two booleans).
const maxNoticeBytes = 256

// FilePrefix starts every agent binary's file name:
// hyperfleet-agent-<os>-<arch>.
const FilePrefix = "hyperfleet-agent-"

// ChecksumSuffix is appended to a binary's name for its checksum file.
const ChecksumSuffix = ".sha256"

// Platforms are the os-arch pairs (Go naming) the agent is built for.
var Platforms = []string{"linux-amd64", "linux-arm64"}

// runnerPlatforms maps a runner's os and arch, in GitHub's naming
// (spec.bootstrap.github.runner), to the Go naming of the agent's build.
var runnerPlatforms = map[string]string{
	"linux/x64":   "linux-amd64",
	"linux/arm64": "linux-arm64",
}

// FileName is the agent binary's file name for a runner os and arch in
// GitHub's naming (linux/x64 -> hyperfleet-agent-linux-amd64). The error
// says which combinations exist.
func FileName(osName, arch string) (string, error) {
	p, ok := runnerPlatforms[osName+"/"+arch]
	if !ok {
		return "", fmt.Errorf("the HyperFleet agent is built for linux/x64 and linux/arm64 runners only, not %s/%s", osName, arch)
	}
	return FilePrefix + p, nil
}

// Options configure a Server.
type Options struct {
	// Dir holds the binaries, named hyperfleet-agent-<os>-<arch>
	// (required). Other files are ignored.
	Dir string
	// URL is the external base URL VMs reach the server at, such as
	// https://hyperfleet-agent.ci.example.com:9443 (required, https; may
	// have a path when a proxy forwards a prefix). The serving certificate
	// must be valid for its host.
	URL string
	// CAFile is a PEM file with the CA certificate(s) VMs must trust to
	// reach URL; empty: VMs use their system roots. Read once, in New.
	CAFile string

	// Addr is the address Start listens on, such as ":9443".
	Addr string
	// CertFile and KeyFile are the serving certificate (chain) and key, in
	// PEM. They are watched and reloaded when they change, as the webhook
	// receiver's are, so a cert-manager renewal needs no restart.
	CertFile string
	KeyFile  string

	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout bound
	// connections (defaults 5 s, 10 s, 30 s, 30 s). ReadTimeout is how long
	// a whole request, body included, may take to arrive: a VM sends a
	// few hundred bytes. WriteTimeout bounds every answer but a binary's
	// download, which StallTimeout and DownloadTimeout bound instead.
	ReadHeaderTimeout time.Duration
	ReadTimeout       time.Duration
	WriteTimeout      time.Duration
	IdleTimeout       time.Duration
	// StallTimeout is how long a download may make no progress (default
	// 30 s): a client that stops reading is cut.
	StallTimeout time.Duration
	// DownloadTimeout bounds a whole download, progress or not (a client
	// reading a little every 25 s used to hold its connection for
	// hours); 0: StallTimeout plus the largest binary's size at
	// MinDownloadRate, 128 KiB/s (DefaultDownloadTimeout). A VM's curl
	// gives up after 300 s anyway (internal/cloudinit).
	DownloadTimeout time.Duration
	// ShutdownTimeout bounds the wait for in-flight downloads when the
	// manager stops (default 10 s).
	ShutdownTimeout time.Duration
	// Limits cap the connections held open, and keep part of them for
	// the broker, the enrollment and the hints (Classify): a cap of 0 is
	// the default (DefaultLimits), a negative one no cap.
	Limits httpsserver.Limits
	// Logger logs; the zero value discards.
	Logger logr.Logger

	// Broker, when set, is the credential broker (internal/broker), served
	// at BrokerPath on the same listener: VMs already trust this server's
	// certificate. The server then asks every client for a certificate
	// without requiring one; the broker verifies what it gets as an
	// X509-SVID, and downloads need none.
	Broker http.Handler

	// TPMEnrollment, when set, serves the TPM DevID enrollment
	// (internal/tpmenroll) at agentconfig.TPMEnrollPath and
	// agentconfig.TPMActivatePath: the VMs reach it at the broker's host.
	TPMEnrollment http.Handler

	// PowerOff, when set, receives power-off notices at PowerOffPath.
	PowerOff PowerOffReceiver

	// BrokerServed and TPMServed, when set, say whether the broker and
	// the TPM enrollment are served now: whether some HypervisorCluster
	// configures what they serve (the manager watches them). While not,
	// their paths are unknown, answered 404 and the connection closed at
	// the request line, as any other (an endpoint is mounted only when
	// its feature is configured). nil: served whenever set.
	BrokerServed, TPMServed func() bool
}

// MinDownloadRate is the slowest link DownloadTimeout's default gives the
// whole binary to: 1 Mbit/s.
const MinDownloadRate = 128 << 10

// DefaultDownloadTimeout is DownloadTimeout's default for binaries of up
// to size bytes: the stall timeout plus size at MinDownloadRate.
func DefaultDownloadTimeout(size int64, stall time.Duration) time.Duration {
	return stall + time.Duration(size)*time.Second/MinDownloadRate
}

// BrokerPath is where Options.Broker is served.
const BrokerPath = "/broker/v1/credential"

// DefaultLimits are the agent server's connection caps (docs/security.md,
// "The agent server's bounds"). A VM holds one or two connections at a
// time (its download, its broker request, its power-off notice): 256 in
// all, 32 from one address, so that it takes eight addresses, not one or
// two hostile jobs, to hold the cap, while a few VMs behind one NAT
// address still fit. Of the 256, 32 are a reserve that only the broker,
// the TPM enrollment and the hints may use (Classify), two per address,
// so that downloads held long cannot keep a new VM from its credential.
// What each held connection costs the process (about 125 KiB of RSS for a
// stalled download, measured by test/flood) keeps 256 of them within the
// flood test's 64 MiB bound. The per-address cap counts the VMs only
// where the server sees their addresses: the chart's Service keeps them
// (externalTrafficPolicy Local); behind a load balancer that does not,
// raise MaxConnsPerAddress to MaxConns. Each connection's kernel socket
// buffers are capped at 128 KiB (256 KiB as Linux counts them), so that
// 256 stalled downloads hold at most 64 MiB of kernel memory (charged to
// the pod) instead of up to 4 MiB each; a download still moves at 128 KiB
// per round trip, 12 MiB/s at 10 ms.
var DefaultLimits = httpsserver.Limits{MaxConns: 256, MaxConnsPerAddress: 32, SocketBuffer: 128 << 10, Reserved: 32, ReservedPerAddress: 2}

// maxHeaderBytes bounds a request's line and headers: a VM sends a URL
// with a checksum or a claim's name and a bearer token, well under 1 KiB
// (client certificates travel in the TLS handshake, not in headers).
// 8 KiB leaves room for a proxy's additions.
const maxHeaderBytes = 8 << 10

// binary is one served file: opened and hashed once.
type binary struct {
	name    string
	f       *os.File
	size    int64
	modTime time.Time
	sha256  string
}

// Server serves the agent binaries. It is a controller-runtime
// manager.Runnable that runs on every replica (NeedLeaderElection is
// false): add it with mgr.Add. Lookup and CA are safe for concurrent use.
type Server struct {
	opts Options
	base string // opts.URL without a trailing slash
	bins map[string]*binary

	// ca is the CA file's content once read; caErr why it is not (yet):
	// Start reads it again until it can (waitForCA).
	caMu  sync.Mutex
	ca    string
	caErr error

	// Listening answers Addr and Ready, and holds the Status Serve keeps.
	httpsserver.Listening
}

var (
	_ manager.Runnable               = (*Server)(nil)
	_ manager.LeaderElectionRunnable = (*Server)(nil)
)

// New checks opts, reads the CA file and opens and hashes every binary in
// Dir. A Dir without any binary is an error: a server with nothing to serve
// is a configuration mistake. A CA file that is missing or holds no
// certificate is not: like the serving certificate (often in the same
// Secret) it is waited for, and CAError says why until Start has read it.
// Close releases the files (Start does when it returns).
func New(opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("agent server: the binaries directory is required")
	}
	base, err := checkURL(opts.URL)
	if err != nil {
		return nil, err
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.ReadHeaderTimeout, 5*time.Second)
	def(&opts.ReadTimeout, 10*time.Second)
	def(&opts.WriteTimeout, 30*time.Second)
	def(&opts.IdleTimeout, 30*time.Second)
	def(&opts.StallTimeout, 30*time.Second)
	def(&opts.ShutdownTimeout, 10*time.Second)
	opts.Limits = opts.Limits.Or(DefaultLimits)
	if err := opts.Limits.Check("agent-server"); err != nil {
		return nil, fmt.Errorf("agent server: %w", err)
	}
	s := &Server{opts: opts, base: base, bins: map[string]*binary{}}
	if opts.CAFile != "" {
		// An error is kept for CAError; Start reads the file again.
		_ = s.loadCA()
	}
	if err := s.scan(); err != nil {
		s.Close()
		return nil, err
	}
	if s.opts.DownloadTimeout <= 0 {
		var largest int64
		for _, b := range s.bins {
			largest = max(largest, b.size)
		}
		s.opts.DownloadTimeout = DefaultDownloadTimeout(largest, s.opts.StallTimeout)
	}
	return s, nil
}

// DownloadTimeout is how long a download may take in all
// (Options.DownloadTimeout, or its default for the binaries served).
func (s *Server) DownloadTimeout() time.Duration { return s.opts.DownloadTimeout }

func checkURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("agent server: the URL VMs reach it at must be an https:// URL without query or credentials, such as https://hyperfleet-agent.ci.example.com:9443, not %q", raw)
	}
	return strings.TrimRight(raw, "/"), nil
}

// readCA reads the PEM file of the CA VMs trust: the trust bundle their
// agent gets, so it must be one agentconfig accepts.
func readCA(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("agent server: reading the CA VMs trust: %w", err)
	}
	if err := agentconfig.CheckPEMBundle(string(raw), "the CA certificates VMs trust for the agent server"); err != nil {
		return "", fmt.Errorf("agent server: CA file %s: %w", path, err)
	}
	return strings.TrimSpace(string(raw)) + "\n", nil
}

// scan opens and hashes the binaries in Dir.
func (s *Server) scan() error {
	for _, p := range Platforms {
		name := FilePrefix + p
		path := filepath.Join(s.opts.Dir, name)
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("agent server: %w", err)
		}
		b, err := hashFile(name, f)
		if err != nil {
			_ = f.Close()
			return fmt.Errorf("agent server: %s: %w", path, err)
		}
		s.bins[name] = b
	}
	if len(s.bins) == 0 {
		return fmt.Errorf("agent server: %s holds no agent binary; put %s-<os>-<arch> files there (%s)", s.opts.Dir, strings.TrimSuffix(FilePrefix, "-"), strings.Join(s.expected(), ", "))
	}
	return nil
}

func (s *Server) expected() []string {
	out := make([]string, len(Platforms))
	for i, p := range Platforms {
		out[i] = FilePrefix + p
	}
	return out
}

func hashFile(name string, f *os.File) (*binary, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	h := sha256.New()
	n, err := io.Copy(h, io.NewSectionReader(f, 0, st.Size()))
	if err != nil {
		return nil, fmt.Errorf("hashing: %w", err)
	}
	if n != st.Size() {
		return nil, fmt.Errorf("changed while being hashed (%d of %d bytes)", n, st.Size())
	}
	return &binary{name: name, f: f, size: n, modTime: st.ModTime(), sha256: hex.EncodeToString(h.Sum(nil))}, nil
}

// Close releases the open binaries. The server serves nothing afterwards.
func (s *Server) Close() {
	for _, b := range s.bins {
		_ = b.f.Close()
	}
}

// Lookup returns the download URL and SHA-256 (64 lower-case hex digits)
// of the agent for a runner os and arch in GitHub's naming (linux and x64
// or arm64, as in spec.bootstrap.github.runner); ok is false when the
// server has no such binary. The URL carries the checksum as a query
// parameter so that a replica serving another build refuses it.
func (s *Server) Lookup(osName, arch string) (downloadURL, sha256 string, ok bool) {
	name, err := FileName(osName, arch)
	if err != nil {
		return "", "", false
	}
	b, ok := s.bins[name]
	if !ok {
		return "", "", false
	}
	return s.base + PathPrefix + name + "?sha256=" + b.sha256, b.sha256, true
}

// CA is the PEM CA bundle VMs must trust to reach the server, empty when
// they use their system roots, or while CAError is not nil.
func (s *Server) CA() string {
	s.caMu.Lock()
	defer s.caMu.Unlock()
	return s.ca
}

// CAError is why the CA file (Options.CAFile) is not read yet, nil once it
// is (or without one): VMs cannot be told what to trust until then.
func (s *Server) CAError() error {
	s.caMu.Lock()
	defer s.caMu.Unlock()
	if s.caErr != nil {
		return fmt.Errorf("the agent server waits for the CA file VMs trust: %w", s.caErr)
	}
	return nil
}

// loadCA reads the CA file, keeping why it could not.
func (s *Server) loadCA() error {
	ca, err := readCA(s.opts.CAFile)
	s.caMu.Lock()
	defer s.caMu.Unlock()
	if err == nil {
		s.ca = ca
	}
	s.caErr = err
	return err
}

// waitForCA reads the CA file until it can, as the serving certificate is
// waited for (httpsserver.WaitFor).
func (s *Server) waitForCA(ctx context.Context) {
	if httpsserver.WaitFor(ctx, s.loadCA, func(err error) {
		s.opts.Logger.Error(err, "agent server: waiting for the CA file VMs trust (--agent-server-ca): templates with agentSource Operator are not valid until then, and everything else keeps running",
			"caFile", s.opts.CAFile)
	}) {
		s.opts.Logger.Info("agent server: read the CA file VMs trust after waiting for it", "caFile", s.opts.CAFile)
	}
}

// Binaries are the names of the served binaries, sorted.
func (s *Server) Binaries() []string {
	out := make([]string, 0, len(s.bins))
	for n := range s.bins {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: every
// replica serves the binaries.
func (*Server) NeedLeaderElection() bool { return false }

// Check is a readiness check (controller-runtime's healthz.Checker): nil
// while the server serves and its CA file is read, else why not, such as
// the certificate it waits for (httpsserver.Status).
func (s *Server) Check(r *http.Request) error {
	if err := s.CAError(); err != nil {
		return err
	}
	return s.Status.Check(r)
}

// Handler serves the binaries and their checksums under PathPrefix, and
// power-off notices at PowerOffPath when Options.PowerOff is set, and the
// broker at BrokerPath and the TPM enrollment when there are and they are
// served now (Options.BrokerServed, TPMServed: 404 and a closed
// connection otherwise).
func (s *Server) Handler() http.Handler {
	if s.opts.Broker == nil && s.opts.PowerOff == nil && s.opts.TPMEnrollment == nil {
		return http.HandlerFunc(s.serve)
	}
	mux := http.NewServeMux()
	if s.opts.Broker != nil {
		mux.Handle(BrokerPath, s.whenServed(s.brokerServed, s.opts.Broker))
	}
	if s.opts.TPMEnrollment != nil {
		enroll := s.whenServed(s.tpmServed, s.opts.TPMEnrollment)
		mux.Handle(agentconfig.TPMEnrollPath, enroll)
		mux.Handle(agentconfig.TPMActivatePath, enroll)
	}
	if s.opts.PowerOff != nil {
		mux.HandleFunc(PowerOffPath+"/", s.servePowerOff)
		mux.HandleFunc(PowerOffPath, s.serveOldPowerOff)
		mux.HandleFunc(ReadyPath+"/", s.serveReady)
	}
	mux.HandleFunc("/", s.serve)
	return mux
}

// whenServed is h while served says so, else a 404 that closes the
// connection: the gate answers a connection's first request so
// (Classify), this the ones after it.
func (s *Server) whenServed(served func() bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !served() {
			s.notFound(w, r.URL.Path)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) brokerServed() bool {
	return s.opts.Broker != nil && (s.opts.BrokerServed == nil || s.opts.BrokerServed())
}

func (s *Server) tpmServed() bool {
	return s.opts.TPMEnrollment != nil && (s.opts.TPMServed == nil || s.opts.TPMServed())
}

// Classify says what a request line asks of the server (the gate of
// httpsserver.Options.Classify): a binary or its checksum (a download,
// general: it may hold its connection for DownloadTimeout), the broker,
// the TPM enrollment or a hint (reserved: short, checked by its proof or
// token before anything else, so they may use the connections kept for
// them), or nothing served here, which is answered 404 and closed before
// any header is read. The broker and the enrollment are served only while
// their feature is configured.
func (s *Server) Classify(_, path string) httpsserver.RequestClass {
	switch {
	case strings.HasPrefix(path, PathPrefix):
		return httpsserver.RequestGeneral
	case path == BrokerPath && s.brokerServed(),
		(path == agentconfig.TPMEnrollPath || path == agentconfig.TPMActivatePath) && s.tpmServed(),
		s.opts.PowerOff != nil && (path == PowerOffPath || strings.HasPrefix(path, PowerOffPath+"/") || strings.HasPrefix(path, ReadyPath+"/")):
		return httpsserver.RequestReserved
	}
	return httpsserver.RequestUnknown
}

// BrokerURL is the broker's URL as VMs reach it; empty without a broker.
func (s *Server) BrokerURL() string {
	if s.opts.Broker == nil {
		return ""
	}
	return s.base + BrokerPath
}

// ReadyURL is the base URL VMs' agents send their ready hint to (each
// under its claim's path: agentconfig.PowerOffNotify.ReadyHintURL), empty
// without a PowerOffReceiver.
func (s *Server) ReadyURL() string {
	if s.opts.PowerOff == nil {
		return ""
	}
	return s.base + ReadyPath
}

// PowerOffURL is the base URL VMs announce their power-off at (each under
// its claim's path: agentconfig.PowerOffNotify.NoticeURL), empty without a
// PowerOffReceiver.
func (s *Server) PowerOffURL() string {
	if s.opts.PowerOff == nil {
		return ""
	}
	return s.base + PowerOffPath
}

// hintRefusal answers a refused hint and closes the connection, so that
// whoever has no token holds nothing.
func hintRefusal(w http.ResponseWriter, code int, msg string) {
	httpsserver.DropConnection(w)
	http.Error(w, msg, code)
}

// authorizeHint checks a hint's method, path (base/<namespace>/<name>/<uid>)
// and bearer token, before any byte of its body is read, answering every
// refusal itself (ok false). what names the hint in the answers.
func (s *Server) authorizeHint(w http.ResponseWriter, r *http.Request, base, what string, authorize func(agentconfig.ClaimRef, string) error) (agentconfig.ClaimRef, bool) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		hintRefusal(w, http.StatusMethodNotAllowed, what+"s are POSTed")
		return agentconfig.ClaimRef{}, false
	}
	claim, ok := claimOfPath(base, r.URL.Path)
	if !ok {
		hintRefusal(w, http.StatusBadRequest, "a "+what+" is POSTed to "+base+"/<namespace>/<name>/<uid> of the VM's claim")
		return agentconfig.ClaimRef{}, false
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		hintRefusal(w, http.StatusUnauthorized, "unauthorized: a "+what+" carries its claim's bearer token")
		return agentconfig.ClaimRef{}, false
	}
	if err := authorize(claim, token); err != nil {
		hintRefusal(w, http.StatusUnauthorized, "unauthorized")
		return agentconfig.ClaimRef{}, false
	}
	return claim, true
}

// servePowerOff takes one power-off notice at
// PowerOffPath/<namespace>/<name>/<uid>. The token is checked before any
// byte of the body is read; every refusal closes the connection. The
// answer says only accepted, refused or retry.
func (s *Server) servePowerOff(w http.ResponseWriter, r *http.Request) {
	claim, ok := s.authorizeHint(w, r, PowerOffPath, "power-off notice", s.opts.PowerOff.AuthorizePowerOff)
	if !ok {
		return
	}
	notice := agentconfig.PowerOffNotice{ClaimRef: claim}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxNoticeBytes)).Decode(&notice.PowerOffNoticeBody); err != nil {
			hintRefusal(w, http.StatusBadRequest, fmt.Sprintf("a power-off notice's body is empty or a JSON object of runnerOnline and jobStarted, at most %d bytes", maxNoticeBytes))
			return
		}
	}
	s.answerHint(w, claim, "Power-off notice", s.opts.PowerOff.PowerOffNotice(r.Context(), notice))
}

// serveReady takes one ready hint at ReadyPath/<namespace>/<name>/<uid>:
// the token is checked first, as for a power-off notice, and a hint has
// no body: one that declares any is refused unread.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	claim, ok := s.authorizeHint(w, r, ReadyPath, "ready hint", s.opts.PowerOff.AuthorizeReady)
	if !ok {
		return
	}
	if r.ContentLength != 0 {
		hintRefusal(w, http.StatusBadRequest, "a ready hint has no body")
		return
	}
	s.answerHint(w, claim, "Ready hint", s.opts.PowerOff.ReadyHint(r.Context(), claim))
}

// answerHint answers a hint the receiver took (err nil: 202), asked to
// retry (503) or failed on.
func (s *Server) answerHint(w http.ResponseWriter, claim agentconfig.ClaimRef, what string, err error) {
	switch {
	case err == nil:
		w.WriteHeader(http.StatusAccepted)
	case errors.Is(err, ErrRetry):
		w.Header().Set("Retry-After", "1")
		http.Error(w, "retry", http.StatusServiceUnavailable)
	default:
		s.opts.Logger.Error(err, what, "namespace", claim.Namespace, "name", claim.Name)
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}

// serveOldPowerOff answers the notices of agents from before the claim
// moved into the path (a JSON body naming the claim, POSTed to
// PowerOffPath itself): 400, saying what changed, without reading the
// body. The VM's power-off is still seen in the hypervisor's listing.
func (s *Server) serveOldPowerOff(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	httpsserver.DropConnection(w)
	http.Error(w, "this power-off notice has the old format: notices are now POSTed to "+PowerOffPath+
		"/<namespace>/<name>/<uid> of the claim, with a body of runnerOnline and jobStarted only; "+
		"update the VM's agent to the operator's version (the VM's power-off is still seen in the hypervisor's listing)",
		http.StatusBadRequest)
}

// claimOfPath reads the claim from base/<namespace>/<name>/<uid>.
func claimOfPath(base, path string) (agentconfig.ClaimRef, bool) {
	rest, ok := strings.CutPrefix(path, base+"/")
	if !ok {
		return agentconfig.ClaimRef{}, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || slices.Contains(parts, "") {
		return agentconfig.ClaimRef{}, false
	}
	return agentconfig.ClaimRef{Namespace: parts[0], Name: parts[1], UID: parts[2]}, true
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "only GET and HEAD are served", http.StatusMethodNotAllowed)
		return
	}
	name, found := strings.CutPrefix(r.URL.Path, PathPrefix)
	if !found {
		s.notFound(w, r.URL.Path)
		return
	}
	sum := false
	if n, ok := strings.CutSuffix(name, ChecksumSuffix); ok {
		name, sum = n, true
	}
	b, ok := s.bins[name]
	if !ok {
		s.notFound(w, r.URL.Path)
		return
	}
	if want := r.URL.Query().Get("sha256"); want != "" && want != b.sha256 {
		// Another replica (or this one before a restart) handed out the
		// URL for a different build: let the client retry elsewhere.
		w.Header().Set("Retry-After", "2")
		http.Error(w, fmt.Sprintf("this server has another build of %s (sha256 %s, not %s); retry, another replica may have it", name, b.sha256, want), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if sum {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		body := b.sha256 + "  " + b.name + "\n"
		http.ServeContent(w, r, "", b.modTime, strings.NewReader(body))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("ETag", `"sha256:`+b.sha256+`"`)
	w.Header().Set("Content-Disposition", `attachment; filename="`+b.name+`"`)
	// ServeContent sets Content-Length, answers HEAD without a body and
	// handles Range and conditional requests. The write deadline follows
	// progress: a client that stops reading is cut after StallTimeout,
	// and every download after DownloadTimeout.
	sw := httpsserver.NewStallWriter(w, s.opts.StallTimeout).Until(time.Now().Add(s.opts.DownloadTimeout))
	http.ServeContent(sw, r, "", b.modTime, io.NewSectionReader(b.f, 0, b.size))
}

// notFound answers a path the server does not serve, and closes the
// connection: whoever asks for it is no VM of this operator's.
func (s *Server) notFound(w http.ResponseWriter, path string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	httpsserver.DropConnection(w)
	w.WriteHeader(http.StatusNotFound)
	var names []string
	for _, n := range s.Binaries() {
		names = append(names, PathPrefix+n)
	}
	fmt.Fprintf(w, "%s is not an agent binary served here. Served: %s (each also as <name>%s). "+
		"Missing binaries go into the operator's --agent-binaries-dir, named %s<os>-<arch> (%s), followed by a restart.\n",
		path, strings.Join(names, ", "), ChecksumSuffix, FilePrefix, strings.Join(Platforms, ", "))
}

// Start implements manager.Runnable: it serves until ctx ends, then waits
// up to ShutdownTimeout for in-flight downloads, and closes the files.
func (s *Server) Start(ctx context.Context) error {
	defer s.MarkReady()
	defer s.Close()
	logger := s.opts.Logger
	if s.opts.Addr == "" || s.opts.CertFile == "" || s.opts.KeyFile == "" {
		return errors.New("agent server: the listen address, certificate file and key file are required to serve")
	}
	if s.CAError() != nil {
		caCtx, stopCA := context.WithCancel(ctx)
		defer stopCA()
		go s.waitForCA(caCtx)
	}

	srv := &http.Server{
		Handler:           s.Handler(),
		TLSConfig:         s.tlsConfig(),
		ReadHeaderTimeout: s.opts.ReadHeaderTimeout,
		ReadTimeout:       s.opts.ReadTimeout,
		WriteTimeout:      s.opts.WriteTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// httpsserver.Serve serves HTTP/1.1 only: a VM makes a handful of
		// requests in its life, and HTTP/2 would let one connection carry
		// many concurrent streams, each with upload buffers, past the
		// connection caps.
	}
	return httpsserver.Serve(ctx, httpsserver.Options{
		Name: "agent server", Server: "agent", Limits: s.opts.Limits, Addr: s.opts.Addr, CertFile: s.opts.CertFile, KeyFile: s.opts.KeyFile,
		ShutdownTimeout: s.opts.ShutdownTimeout, Status: &s.Status, Logger: logger, Classify: s.Classify,
	}, srv, func(addr net.Addr) {
		s.Listened(addr)
		logger.Info("Serving agent binaries", "address", addr.String(), "url", s.base+PathPrefix, "binaries", s.Binaries(),
			"downloadTimeout", s.opts.DownloadTimeout.String(), "maxConns", s.opts.Limits.MaxConns,
			"maxConnsPerAddress", s.opts.Limits.MaxConnsPerAddress, "reservedConns", s.opts.Limits.Reserved)
		s.MarkReady()
	})
}

// tlsConfig asks clients for a certificate when the broker is served
// (without requiring or verifying one: the broker verifies SVIDs itself,
// against bundles that change at run time).
func (s *Server) tlsConfig() *tls.Config {
	if s.opts.Broker == nil {
		return &tls.Config{}
	}
	return &tls.Config{ClientAuth: tls.RequestClientCert}
}
