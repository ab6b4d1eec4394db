package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	clocktesting "k8s.io/utils/clock/testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Credentials of the operator's user in the test cluster. The secrets are
// distinctive so leak checks can search for them.
const (
	opUser        = "hyperfleet@pve"
	opPassword    = "pw-3f9a1c7e-hyperfleet-password"
	opTokenName   = "operator"
	opTokenSecret = "tok-5b2e8d41-hyperfleet-token-secret"
	operatorID    = "test"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// recorder is an Observer that keeps every measurement.
type recorder struct {
	mu     sync.Mutex
	calls  []apiCall
	queues []int
}

type apiCall struct {
	method, endpoint string
	code             int
}

func (r *recorder) APICall(method, endpoint string, code int, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, apiCall{method, endpoint, code})
}

func (r *recorder) CloneQueue(waiting int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queues = append(r.queues, waiting)
}

func (r *recorder) snapshot() []apiCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]apiCall(nil), r.calls...)
}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls, r.queues = nil, nil
}

// count returns the calls matching method and endpoint ("" matches all).
func (r *recorder) count(method, endpoint string) int {
	n := 0
	for _, c := range r.snapshot() {
		if (method == "" || c.method == method) && (endpoint == "" || c.endpoint == endpoint) {
			n++
		}
	}
	return n
}

// logBuffer captures everything the provider logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.buf.WriteString(prefix + " " + args + "\n")
	}, funcr.Options{Verbosity: 10})
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// env is a simulated Proxmox cluster served over TLS on loopback, with fake
// clocks for the simulator and the provider that tests advance together.
type env struct {
	t        testing.TB
	sim      *proxmoxsim.Simulator
	srv      *httptest.Server
	simClock *proxmoxsim.FakeClock
	clock    *clocktesting.FakeClock
	obs      *recorder
	logs     *logBuffer
	signer   *ownership.Signer
	cfg      provider.ClusterConfig
	p        *Provider
}

type envOption func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig)

func testSigner(t testing.TB, id string) *ownership.Signer {
	t.Helper()
	key := sha256.Sum256([]byte("ownership key of " + id))
	s, err := ownership.NewSigner(id, key[:])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// simConfig is the simulator's default cluster with the operator's user
// and no 401 delay (that one is wall-clock time).
func simConfig() proxmoxsim.Config {
	cfg := proxmoxsim.DefaultConfig()
	cfg.AuthFailureDelay = 0
	no := false
	cfg.Users = append(cfg.Users, proxmoxsim.UserConfig{
		ID: opUser, Password: opPassword,
		Privileges: proxmoxsim.Privileges{"/": {"Administrator"}},
		Tokens:     []proxmoxsim.TokenConfig{{ID: opTokenName, Secret: opTokenSecret, Privsep: &no}},
	})
	cfg.Pools = []proxmoxsim.PoolConfig{{ID: "ci", Comment: "runners"}}
	return cfg
}

func newEnv(t testing.TB, opts ...envOption) *env { return newEnvWith(t, nil, opts...) }

// newEnvWith is newEnv with extra simulator options (a call log).
func newEnvWith(t testing.TB, simOpts []proxmoxsim.Option, opts ...envOption) *env {
	simCfg := simConfig()
	simClock := proxmoxsim.NewFakeClock(t0)
	cfg := provider.ClusterConfig{
		Name: "lab", TokenID: opUser + "!" + opTokenName, TokenSecret: opTokenSecret,
		Settings: ClusterSettings{ISOStorage: "local"}, DefaultBridge: "vmbr0", VMIDStart: 1000, VMIDEnd: 1999,
		ClonesPerNode: 2, ClonesPerStorage: 2, Tags: []string{"ci"}, RequestTimeout: 10 * time.Second,
	}
	for _, o := range opts {
		o(&simCfg, &cfg)
	}
	sim, err := proxmoxsim.New(simCfg, append([]proxmoxsim.Option{proxmoxsim.WithClock(simClock), proxmoxsim.WithAdmin(true)}, simOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	cfg.Endpoint = srv.URL + "/api2/json"
	if cfg.FingerprintSHA256 == "" && len(cfg.CABundle) == 0 && !cfg.InsecureSkipVerify {
		cfg.FingerprintSHA256 = fingerprint(srv)
	}
	sim.SetFingerprint(fingerprint(srv))
	e := &env{t: t, sim: sim, srv: srv, simClock: simClock, clock: clocktesting.NewFakeClock(t0), obs: &recorder{},
		logs: &logBuffer{}, signer: testSigner(t, operatorID).ForCluster(simIdentity(simCfg, cfg)), cfg: cfg}
	e.p = e.newProvider(cfg)
	return e
}

// simIdentity is the cluster identity a provider for cfg on the simulated
// cluster binds ownership blocks to (Provider.marker).
func simIdentity(sim proxmoxsim.Config, cfg provider.ClusterConfig) ownership.ClusterIdentity {
	name := sim.ClusterName
	if name == "" {
		name = "node/" + sim.Nodes[0].Name
	}
	return ownership.ClusterIdentity{Name: cfg.Name, HypervisorName: name}
}

func fingerprint(srv *httptest.Server) string {
	return proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw))
}

// newProvider builds another Provider on the same cluster and clocks (as
// after an operator restart).
func (e *env) newProvider(cfg provider.ClusterConfig) *Provider {
	p, err := New(cfg, provider.Deps{Signer: e.signer, Observer: e.obs, Clock: e.clock, Log: e.logs.logger()})
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	return p
}

// advance moves both clocks.
func (e *env) advance(d time.Duration) {
	if d <= 0 {
		return
	}
	e.simClock.Advance(d)
	e.clock.Step(d)
}

func (e *env) state() proxmoxsim.State { return e.sim.State() }

// vm returns the simulator's VM vmid, nil if absent.
func (e *env) vm(vmid int) *proxmoxsim.VMState {
	for _, v := range e.state().VMs {
		if v.VMID == vmid {
			v := v
			return &v
		}
	}
	return nil
}

// volume returns a volume by id, nil if absent.
func (e *env) volume(volid string) *proxmoxsim.VolumeState {
	for _, s := range e.state().Storages {
		for i := range s.Volumes {
			if s.Volumes[i].VolID == volid {
				return &s.Volumes[i]
			}
		}
	}
	return nil
}

// nonTemplateVMs counts VMs other than templates.
func (e *env) nonTemplateVMs() int {
	n := 0
	for _, v := range e.state().VMs {
		if !v.Template {
			n++
		}
	}
	return n
}

// testSpec is a claim's VM with a distinctive workload secret in its
// user-data.
func testSpec(name, uid string) *provider.VMSpec {
	return &provider.VMSpec{
		Owner: provider.Owner{Namespace: "ci", Name: name, UID: uid, Pool: "linux", CreatedAt: t0},
		Name:  name, Description: "HyperFleet runner " + name,
		Source:   provider.TemplateSource{Linked: true, Settings: TemplateRef{ID: 9000}},
		CPUCores: 4, MemoryBytes: 4 << 30, DiskBytes: 40 << 30,
		Network: provider.NetworkSpec{Bridge: "vmbr0", VLAN: 20, Model: "virtio", MACAddress: macFor(uid)},
		CloudInit: provider.CloudInit{
			UserData:      []byte("#cloud-config\nwrite_files:\n- path: /etc/hf/jit\n  content: " + workloadSecret(uid) + "\n"),
			MetaData:      []byte("instance-id: " + uid + "\nlocal-hostname: " + name + "\n"),
			NetworkConfig: []byte("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n"),
		},
		Tags: []string{"linux", "x64"},
	}
}

func workloadSecret(uid string) string { return "JIT-SECRET-" + uid + "-do-not-leak" }

func macFor(uid string) string {
	h := sha256.Sum256([]byte(uid))
	return fmt.Sprintf("bc:24:11:%02x:%02x:%02x", h[0], h[1], h[2])
}

// outcome is where driving EnsureVM ended.
type outcome struct {
	res   *provider.EnsureResult
	prog  provider.Progress
	calls int
	errs  []error
}

// ensure calls EnsureVM until phase want, advancing the clocks by each
// RetryAfter (one second after a transient error). Other errors fail the
// test.
func (e *env) ensure(p *Provider, spec *provider.VMSpec, prog provider.Progress, want provider.Phase, maxCalls int) outcome {
	e.t.Helper()
	var d outcome
	d.prog = prog
	for d.calls < maxCalls {
		d.calls++
		res, err := p.EnsureVM(context.Background(), spec, d.prog)
		if err != nil {
			if provider.Classify(err) != provider.ClassTransient {
				e.t.Fatalf("EnsureVM call %d (progress %+v): %s error: %v", d.calls, d.prog, provider.Classify(err), err)
			}
			d.errs = append(d.errs, err)
			e.advance(time.Second)
			continue
		}
		d.res, d.prog = res, res.Progress
		if res.Phase == want {
			return d
		}
		e.advance(res.RetryAfter)
	}
	e.t.Fatalf("EnsureVM did not reach %s in %d calls; last %+v, errors %v", want, maxCalls, d.res, d.errs)
	return d
}

// remove calls DeleteVM until Done.
func (e *env) remove(p *Provider, owner provider.Owner, prog provider.Progress, maxCalls int) provider.Progress {
	e.t.Helper()
	for i := 0; i < maxCalls; i++ {
		res, err := p.DeleteVM(context.Background(), owner, prog)
		if err != nil {
			if provider.Classify(err) != provider.ClassTransient {
				e.t.Fatalf("DeleteVM: %s error: %v", provider.Classify(err), err)
			}
			e.advance(time.Second)
			continue
		}
		prog = res.Progress
		if res.Done {
			return prog
		}
		e.advance(res.RetryAfter)
	}
	e.t.Fatalf("DeleteVM not done in %d calls", maxCalls)
	return prog
}

// stateJSON is the simulator's full state dump, read from its admin API
// (GET /_sim/state).
func (e *env) stateJSON() string {
	res, err := e.srv.Client().Get(e.srv.URL + "/_sim/state")
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		e.t.Fatalf("GET /_sim/state: %s %v", res.Status, err)
	}
	// Uploaded bytes are base64 in the dump; decode the state so the raw
	// contents are searched too.
	var st proxmoxsim.State
	if err := json.Unmarshal(raw, &st); err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	b.Write(raw)
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			b.Write(v.Data)
		}
	}
	return b.String()
}
