//go:build !windows

package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/githubvm"
)

// The cheap world of property 11's broker path: the test binary stands in
// for spire-agent (fakeSPIREAgent), the in-memory SPIRE server
// (identitytest) attests its join token and signs the VM's X509-SVID, and
// a credential broker that hands the runner credential to that SVID and
// broker proof only. The real spire-agent and spire-server are exercised
// by spiffe_spire_test.go (build tag spire).

// fakeSPIREAgentEnv makes the test binary act as spire-agent.
const fakeSPIREAgentEnv = "HF_TEST_FAKE_SPIRE_AGENT"

func init() {
	if os.Getenv(fakeSPIREAgentEnv) == "1" {
		os.Exit(fakeSPIREAgent(os.Args[1:]))
	}
}

// fakeAttestation is what the fake agent attests with: its join token or
// its DevID certificate (PEM).
type fakeAttestation struct {
	JoinToken string `json:"joinToken,omitempty"`
	DevIDCert []byte `json:"devIDCert,omitempty"`
}

// fakeSVID is what the fake agent's Workload API hands out.
type fakeSVID struct {
	Cert, Key, Bundle []byte
}

var (
	confString = func(key string) *regexp.Regexp { return regexp.MustCompile(key + ` = "([^"]*)"`) }
	confPort   = regexp.MustCompile(`server_port = ([0-9]+)`)
)

// fakeSPIREAgent is spire-agent as far as the agent uses it: `run -config
// FILE` attests with the join token of the config at the server (here an
// HTTP endpoint of the test process at server_address:server_port, which
// answers with the X509-SVID of the VM's entry or refuses the token as
// SPIRE logs it) and serves the SVID on the Workload API socket until it
// is stopped; `api fetch x509 -socketPath S -write DIR` writes what the
// socket serves as svid.0.pem, svid.0.key and bundle.0.pem.
func fakeSPIREAgent(args []string) int {
	switch {
	case len(args) == 3 && args[0] == "run" && args[1] == "-config":
		return fakeSPIREAgentRun(args[2])
	case len(args) >= 3 && args[0] == "api" && args[1] == "fetch" && args[2] == "x509":
		var socket, dir string
		for i := 3; i+1 < len(args); i++ {
			switch args[i] {
			case "-socketPath":
				socket = args[i+1]
			case "-write":
				dir = args[i+1]
			}
		}
		return fakeSPIREAgentFetch(socket, dir)
	}
	fmt.Fprintf(os.Stderr, "fake spire-agent: unexpected arguments %q\n", args)
	return 2
}

func fakeSPIREAgentRun(confPath string) int {
	// An agent that forgot to stop it must not leave it behind the test.
	parent := os.Getppid()
	go func() {
		for os.Getppid() == parent {
			time.Sleep(100 * time.Millisecond)
		}
		os.Exit(3)
	}()
	raw, err := os.ReadFile(confPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	conf := string(raw)
	field := func(k string) string {
		if m := confString(k).FindStringSubmatch(conf); m != nil {
			return m[1]
		}
		return ""
	}
	port := confPort.FindStringSubmatch(conf)
	req := fakeAttestation{JoinToken: field("join_token")}
	if p := field("devid_cert_path"); p != "" {
		// tpm_devid: the DevID certificate the operator issued; the
		// stand-in skips the proof of possession SPIRE's attestor asks
		// the TPM for.
		if req.DevIDCert, err = os.ReadFile(p); err != nil {
			fmt.Fprintln(os.Stderr, "fake spire-agent:", err)
			return 1
		}
	}
	socket := field("socket_path")
	if req.JoinToken == "" && req.DevIDCert == nil || socket == "" || port == nil {
		fmt.Fprintf(os.Stderr, "fake spire-agent: config without join_token or devid_cert_path, socket_path or server_port:\n%s\n", conf)
		return 1
	}
	body, err := json.Marshal(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake spire-agent:", err)
		return 1
	}
	resp, err := http.Post("http://"+net.JoinHostPort(field("server_address"), port[1])+"/attest", "application/json", bytes.NewReader(body))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake spire-agent:", err)
		return 1
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// What spire-agent logs for a refused token; it then retries
		// until it is stopped.
		fmt.Println(`level=error msg="Agent crashed" error="failed to attest: join token does not exist or has already been used"`)
		select {}
	}
	fmt.Println(`level=info msg="Node attestation was successful"`)
	l, err := net.Listen("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake spire-agent:", err)
		return 1
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return 1
		}
		_, _ = c.Write(body)
		_ = c.Close()
	}
}

func fakeSPIREAgentFetch(socket, dir string) int {
	c, err := net.Dial("unix", socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rpc error: code = Unavailable desc = connection error:", err)
		return 1
	}
	defer c.Close()
	var s fakeSVID
	if err := json.NewDecoder(bufio.NewReader(c)).Decode(&s); err != nil {
		fmt.Fprintln(os.Stderr, "fake spire-agent: reading the Workload API:", err)
		return 1
	}
	for name, b := range map[string][]byte{"svid.0.pem": s.Cert, "svid.0.key": s.Key, "bundle.0.pem": s.Bundle} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// identityWorld is the SPIRE server and credential broker of the VMs of
// property 11's broker path.
type identityWorld struct {
	spire *identitytest.Server
	// attestAddr is the attestation endpoint the fake spire-agent calls
	// (host and port of spiffe.serverAddress).
	attestAddr string
	bundlePEM  string
	broker     *httptest.Server
	brokerCA   string
	// spireAgent is the stand-in's executable.
	spireAgent string
	// tpm is the VMs' TPM (one swtpm: the cases run one after the
	// other), and tpmOp the operator's enrollment endpoints, served
	// beside the broker as the agent server serves them.
	tpm   *swtpm.TPM
	tpmOp *tpmOperator

	mu  sync.Mutex
	vms map[string]*brokerVM // by SPIFFE ID
	// wrongAsks counts broker requests that were not a VM's own SVID
	// with its own proof.
	wrongAsks int
}

// brokerVM is what the operator set up for one VM: its registration
// entry's SPIFFE ID, the join token whose agent parents it, its broker
// proof, and the credential the broker hands out once.
type brokerVM struct {
	id         spiffeid.ID
	tpm        bool
	token      string
	proof      string
	credential []byte // the broker's 200 answer
	asks       int
	handedOut  int
}

// newIdentityWorld starts the world; withTPM starts the swtpm and the
// operator's enrollment endpoints too.
func newIdentityWorld(t *testing.T, withTPM bool) *identityWorld {
	t.Helper()
	w := &identityWorld{spire: identitytest.NewServer(t, "example.org"), vms: map[string]*brokerVM{}}
	b, err := w.spire.X509Bundle(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range b.X509Authorities() {
		w.bundlePEM += string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
	}
	attest := httptest.NewServer(http.HandlerFunc(w.serveAttest))
	t.Cleanup(attest.Close)
	w.attestAddr = attest.Listener.Addr().String()

	mux := http.NewServeMux()
	mux.HandleFunc("/", w.serveBroker)
	if withTPM {
		var ekBundle []byte
		w.tpm, ekBundle = testTPM(t, swtpm.NewLocalCAForTest(t))
		w.tpmOp = newTPMOperator(t, ekBundle, p11EnrollmentProof, nil)
		mux.Handle(agentconfig.TPMEnrollPath, w.tpmOp)
		mux.Handle(agentconfig.TPMActivatePath, w.tpmOp)
	}
	w.broker = httptest.NewUnstartedServer(mux)
	w.broker.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	pool := x509.NewCertPool()
	for _, c := range b.X509Authorities() {
		pool.AddCert(c)
	}
	// The broker trusts SVIDs of the trust domain's CA only, as the
	// operator's does; the enrollment endpoints take no certificate.
	w.broker.TLS = &tls.Config{ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool}
	w.broker.StartTLS()
	t.Cleanup(w.broker.Close)
	w.brokerCA = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.broker.Certificate().Raw}))

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w.spireAgent = filepath.Join(t.TempDir(), "spire-agent")
	writeScript(t, w.spireAgent, fakeSPIREAgentEnv+`=1 exec "`+self+`" "$@"`)
	return w
}

// p11EnrollmentProof is the enrollment proof of every TPM VM (the
// operator's per-claim proofs are property 14's concern).
const p11EnrollmentProof = "p11-enrollment-proof-of-the-claim"

// serveAttest is the SPIRE server's side of the fake agent's attestation:
// a join token is spent and its agent gets the X509-SVID of the entry its
// alias parents (identitytest); a DevID certificate must be one the
// operator's DevID CA issued, naming the VM's entry (its common name, the
// selector tpm_devid:subject:cn of the VM's node alias), as SPIRE's
// tpm_devid attestor and the alias entry decide.
func (w *identityWorld) serveAttest(rw http.ResponseWriter, r *http.Request) {
	var req fakeAttestation
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	var vm *brokerVM
	var cert tls.Certificate
	var err error
	if req.JoinToken != "" {
		if !w.spire.Attest(req.JoinToken) {
			http.Error(rw, "join token does not exist or has already been used", http.StatusForbidden)
			return
		}
		w.mu.Lock()
		for _, v := range w.vms {
			if v.token == req.JoinToken {
				vm = v
			}
		}
		w.mu.Unlock()
		if vm == nil {
			http.Error(rw, "no entry for this agent", http.StatusForbidden)
			return
		}
		cert, err = w.spire.X509SVID(req.JoinToken, vm.id, time.Hour)
	} else {
		if vm, err = w.devIDVM(req.DevIDCert); err != nil {
			http.Error(rw, err.Error(), http.StatusForbidden)
			return
		}
		now := time.Now()
		cert, err = w.spire.SignX509SVID(vm.id, now.Add(-time.Minute), now.Add(time.Hour))
	}
	if err != nil {
		http.Error(rw, err.Error(), http.StatusForbidden)
		return
	}
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	_ = json.NewEncoder(rw).Encode(fakeSVID{Cert: certPEM, Key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), Bundle: []byte(w.bundlePEM)})
}

// devIDVM is the TPM VM a DevID certificate (PEM) names, if the
// operator's DevID CA issued it.
func (w *identityWorld) devIDVM(certPEM []byte) (*brokerVM, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, fmt.Errorf("no DevID certificate")
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("DevID certificate: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(w.tpmOp.devID.Certificate())
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("DevID certificate not issued by the operator's DevID CA: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range w.vms {
		if v.tpm && devIDCommonName(v.id.String()) == c.Subject.CommonName {
			return v, nil
		}
	}
	return nil, fmt.Errorf("no VM's alias selects DevID %s", c.Subject.CommonName)
}

// serveBroker hands a VM its credential once: to a client certificate
// that is an X509-SVID of the trust domain (verified by the TLS
// handshake) naming a VM the operator set up, with that VM's proof.
func (w *identityWorld) serveBroker(rw http.ResponseWriter, r *http.Request) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var id string
	if certs := r.TLS.PeerCertificates; len(r.TLS.VerifiedChains) > 0 && len(certs[0].URIs) == 1 {
		id = certs[0].URIs[0].String()
	}
	vm := w.vms[id]
	if r.Method != http.MethodPost || vm == nil || r.Header.Get(agentconfig.BrokerProofHeader) != vm.proof {
		w.wrongAsks++
		rw.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(rw, `{"reason":"NotThisVM","message":"no VM of this SVID and proof"}`)
		return
	}
	vm.asks++
	if vm.handedOut > 0 {
		rw.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(rw, `{"reason":"CredentialIssued","message":"the credential was handed out already"}`)
		return
	}
	vm.handedOut++
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(vm.credential)
}

// addVM sets a VM up as the operator does: a join token whose agent alias
// parents the VM's entry, a broker proof, and the credential the broker
// will hand it. It returns the guest secrets the operator places in it.
func (w *identityWorld) addVM(t interface{ Fatal(...any) }, name string, tpm bool, method agentconfig.BootstrapMethod, secret, registrationURL string) (*brokerVM, agentconfig.GuestSecrets) {
	ctx := context.Background()
	vm := &brokerVM{id: spiffeid.RequireFromString("spiffe://example.org/vm/ci/" + name + "/uid-" + name), tpm: tpm,
		token: "jt-" + name + "-" + fmt.Sprint(time.Now().UnixNano()), proof: "proof-" + name}
	alias := spiffeid.RequireFromString("spiffe://example.org/hyperfleet/node/ci/" + name + "/uid")
	if _, err := w.spire.CreateJoinToken(ctx, vm.token, 10*time.Minute, alias); err != nil {
		t.Fatal(err)
	}
	if err := w.spire.EnsureEntry(ctx, spire.Entry{ID: "hyperfleet." + name, SPIFFEID: vm.id, ParentID: alias}); err != nil {
		t.Fatal(err)
	}
	answer := map[string]string{"method": string(method), "expiresAt": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}
	if method == githubvm.MethodRegistrationToken {
		answer["registrationToken"], answer["registrationURL"] = secret, registrationURL
	} else {
		answer["jitConfig"] = secret
	}
	var err error
	if vm.credential, err = json.Marshal(answer); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.vms[vm.id.String()] = vm
	w.mu.Unlock()
	if tpm {
		return vm, agentconfig.GuestSecrets{EnrollmentProof: p11EnrollmentProof, BrokerProof: vm.proof}
	}
	return vm, agentconfig.GuestSecrets{JoinToken: vm.token, BrokerProof: vm.proof}
}

// spiffe is the config's spiffe section for vm; a TPM VM's TPM is at
// /dev/tpmrm0 under root.
func (w *identityWorld) spiffe(t interface{ Fatal(...any) }, vm *brokerVM, root string) *agentconfig.SPIFFE {
	host, port, _ := net.SplitHostPort(w.attestAddr)
	if vm.tpm {
		if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(w.tpm.Socket, filepath.Join(root, "dev", "tpmrm0")); err != nil {
			t.Fatal(err)
		}
		return &agentconfig.SPIFFE{
			AttestationMethod: agentconfig.AttestationTPM, TPMDevicePath: "/dev/tpmrm0", SPIFFEID: vm.id.String(),
			TrustDomain: "example.org", TrustBundle: w.bundlePEM, ServerAddress: net.JoinHostPort(host, port),
			BrokerURL: w.broker.URL + "/v1/credential", BrokerCA: w.brokerCA,
		}
	}
	return &agentconfig.SPIFFE{
		AttestationMethod: agentconfig.AttestationJoinToken, SPIFFEID: vm.id.String(),
		TrustDomain: "example.org", TrustBundle: w.bundlePEM, ServerAddress: net.JoinHostPort(host, port),
		BrokerURL: w.broker.URL + "/v1/credential", BrokerCA: w.brokerCA,
	}
}

// asked reports how often vm asked the broker with its own SVID and proof
// and how often it was handed its credential, and the requests that came
// with another identity or proof.
func (w *identityWorld) asked(vm *brokerVM) (asks, handedOut, wrong int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return vm.asks, vm.handedOut, w.wrongAsks
}

// TestBootstrapServiceWithTPM is property 11's broker path with a VM that
// attests with its TPM (property 14's other attestation method, from the
// VM's side), in fixed cases: the TPM's enrollment costs 1 to 5 s of
// swtpm's key generation, too much for every generated case. The agent
// enrolls a DevID in the VM's swtpm at the operator's enrollment
// endpoints (served beside the broker), starts spire-agent with the
// tpm_devid attestor, obtains the X509-SVID of its entry, fetches its
// credential from the broker with it and its broker proof, registers one
// runner, and ends as the job or the idle timeout says, with every check
// of TestBootstrapServiceProperty.
func TestBootstrapServiceWithTPM(t *testing.T) {
	w := newBootstrapWorld(t, true)
	for _, c := range []bootstrapCase{
		{name: "p11-tpm-jit", source: "tpm", delivery: "before start", outcome: "success"},
		{name: "p11-tpm-token", token: true, source: "tpm", delivery: "late", delayMS: 50, outcome: "idle", idleMS: 300},
	} {
		t.Run(c.name, func(t *testing.T) { w.run(t, t, c) })
	}
	enrolls, activates, issued := w.iw.tpmOp.counts()
	if enrolls != 2 || activates != 2 || len(issued) != 2 {
		t.Errorf("the TPM enrolled %d times, activated %d times, %d DevIDs issued; want two of each, one per VM", enrolls, activates, len(issued))
	}
}
