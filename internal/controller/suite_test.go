package controller_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/externaldns"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/testworld/credmethods"
	"github.com/hyperfleet/hyperfleet/internal/testworld/eventdump"
	"github.com/hyperfleet/hyperfleet/internal/testworld/extdns"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var env *testenv.Environment

// TestMain starts the API server with HyperFleet's CRDs and external-dns's
// DNSEndpoint, which the clusters of the external-dns DNS types write.
func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &env, extdns.CRDDir())) }

// dnsProviders are the DNS back-ends the operator binary registers
// (cmd/hyperfleet).
func dnsProviders() map[hfv1.DNSProviderType]dnsreg.Factory {
	out := map[hfv1.DNSProviderType]dnsreg.Factory{dnsreg.TypeRFC2136: rfc2136.Factory}
	for _, t := range dnsreg.ExternalDNSTypes {
		out[t] = externaldns.Factory(t)
	}
	return out
}

const (
	simTokenID     = "root@pam!sim"
	simTokenSecret = "00000000-0000-0000-0000-000000000000"
	// secretNamespace holds the clusters' credentials.
	secretNamespace = "hyperfleet-system"
)

// testSigner is shared by every operator the tests start, as one install's
// key would be across restarts.
var testSigner = func() *ownership.Signer {
	s, err := ownership.NewSigner("test", bytes.Repeat([]byte{42}, ownership.MinKeyLength))
	if err != nil {
		panic(err)
	}
	return s
}()

// operator is a running manager with its log captured.
type operator struct {
	components *manager.Components
	cancel     context.CancelFunc
	done       chan error
	logs       *syncBuffer
	// cache is the manager's informer cache.
	cache cache.Cache
	// successor is the operator restart started; it is stopped with this
	// one, after the test's fixtures are cleaned up.
	successor *operator
	// failureState is what a failed test's world adds before the log in
	// the file writeLogOnFailure writes (claims, VMs, runners).
	failureState string
}

type syncBuffer struct {
	mu sync.Mutex
	// blocks hold the log in fixed-size pieces: one growing buffer would
	// copy the whole log, under the lock, each time it doubles, stalling
	// every logging reconcile of a long benchmark.
	blocks [][]byte
}

const logBlockSize = 1 << 20

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.blocks); n == 0 || len(b.blocks[n-1])+len(p) > cap(b.blocks[n-1]) {
		b.blocks = append(b.blocks, make([]byte, 0, max(logBlockSize, len(p))))
	}
	last := &b.blocks[len(b.blocks)-1]
	*last = append(*last, p...)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(bytes.Join(b.blocks, nil))
}

type operatorOptions struct {
	sweepInterval time.Duration
	orphanGrace   time.Duration
	dryRun        bool
	// github, when set, runs the operator's GitHub accounts over this
	// transport (to the GitHub simulator) instead of the test stand-in.
	github http.RoundTripper
	// webhook, when set, serves GitHub webhooks.
	webhook *manager.WebhookOptions
	// resyncInterval is the RunnerPool resync interval (default 30s).
	resyncInterval time.Duration
	// clock replaces the operator's clock (lifecycle limits).
	clock clock.Clock
	// maxRetryDelay caps claim retry backoff (default 5m); fault tests
	// lower it so that a run of injected errors cannot outlast their wait.
	maxRetryDelay time.Duration
	// minRetryDelay is that backoff's first wait (default 2s).
	minRetryDelay time.Duration
	// agentServer, when set, serves agent binaries (agentSource Operator).
	agentServer *manager.AgentServerOptions
	// backoff replaces the RunnerPools' replacement backoff.
	backoff *scaling.Backoff
	// stuckBounds replaces the manager's Stuck bounds (defaults: minutes).
	stuckBounds *stuck.Bounds
	// spireDial replaces the SPIRE Server API client (identitytest).
	spireDial identity.Dialer
	// kubeCalls, when set, counts the manager's Kubernetes API requests.
	kubeCalls *kubeCallCounter
	// infoLogs logs at the binary's default level (info) instead of debug;
	// benchmarks use it so that they measure what production does.
	infoLogs bool
}

// startOperator runs the full manager wiring against the test API server.
// It is stopped when the test ends (or earlier with stop).
func startOperator(t testing.TB, o operatorOptions) *operator {
	t.Helper()
	op := newOperator(t, o)
	// Cleanups run last first: the log is written after the operators
	// stopped, and after the test's own cleanups set failureState.
	t.Cleanup(func() { op.writeLogOnFailure(t) })
	t.Cleanup(func() { op.stopAll(t) })
	return op
}

// writeLogOnFailure writes a failed test's operator logs (this operator's
// and its successors', after failureState) to
// /tmp/hyperfleet-<test>.log, where CI's machine keeps them, and shows
// their tail.
func (o *operator) writeLogOnFailure(t testing.TB) {
	if !t.Failed() {
		return
	}
	var b strings.Builder
	b.WriteString(o.failureState)
	for op, i := o, 0; op != nil; op, i = op.successor, i+1 {
		if i > 0 {
			fmt.Fprintf(&b, "--- operator %d (after a restart)\n", i+1)
		}
		b.WriteString(op.logs.String())
	}
	logs := b.String()
	file := filepath.Join(os.TempDir(), "hyperfleet-"+strings.ReplaceAll(t.Name(), "/", "-")+".log")
	if err := os.WriteFile(file, []byte(logs), 0o600); err == nil {
		t.Logf("operator log: %s", file)
	}
	if len(logs) > 5000 {
		logs = logs[len(logs)-5000:]
	}
	t.Logf("operator log tail:\n%s", logs)
}

// restart stops the operator and starts a new one (same install) in its
// place, as a crash and a new leader would.
func (o *operator) restart(t testing.TB, opts operatorOptions) *operator {
	t.Helper()
	o.stop(t)
	o.successor = newOperator(t, opts)
	return o.successor
}

func (o *operator) stopAll(t testing.TB) {
	for op := o; op != nil; op = op.successor {
		op.stop(t)
	}
}

func newOperator(t testing.TB, o operatorOptions) *operator {
	t.Helper()
	logs := &syncBuffer{}
	level := zapcore.DebugLevel
	if o.infoLogs {
		level = zapcore.InfoLevel
	}
	logger := zap.New(zap.WriteTo(logs), zap.UseDevMode(false), zap.Level(level),
		zap.JSONEncoder(func(c *zapcore.EncoderConfig) { c.EncodeTime = zapcore.RFC3339NanoTimeEncoder }))
	// Like ctrl.GetConfig in the binary: no client-side rate limit (the API
	// server's priority and fairness applies). envtest's config would
	// otherwise throttle the operator to client-go's 5 requests/s.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS = -1
	if o.kubeCalls != nil {
		cfg.Wrap(o.kubeCalls.wrap)
	}
	mgrOpts := ctrl.Options{
		Scheme:                 env.Scheme,
		Logger:                 logger,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Tests start several managers in one process, one after another.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	// As the binary does: Secrets read uncached, watched as metadata only.
	manager.ConfigureSecretReads(&mgrOpts, nil)
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	ctx, cancel := context.WithCancel(ctrl.LoggerInto(context.Background(), logger))
	opts := manager.Options{
		Signer:            testSigner,
		SweepInterval:     o.sweepInterval,
		OrphanGracePeriod: o.orphanGrace,
		SweepDryRun:       o.dryRun,
		// GitHub Actions, as the operator binary registers it: its
		// back-end reads the objects' spec.bootstrap.github and
		// spec.workload.github even where testBootstrap stands in for
		// its accounts.
		Workloads: githubsimtest.Workloads(),
		Bootstrap: testBootstrap{},
		// The DNS back-ends the operator binary registers.
		DNSProviders: dnsProviders(),
		Namespace:    secretNamespace,
	}
	if o.github != nil {
		opts.Bootstrap, opts.WorkloadTransport = nil, o.github
	}
	opts.Webhook, opts.ResyncInterval, opts.Clock, opts.MaxRetryDelay = o.webhook, o.resyncInterval, o.clock, o.maxRetryDelay
	opts.MinRetryDelay = o.minRetryDelay
	opts.AgentServer = o.agentServer
	opts.SPIREDial = o.spireDial
	opts.StuckBounds = o.stuckBounds
	opts.ReplacementBackoff = o.backoff
	comps, err := manager.Setup(ctx, mgr, opts)
	if err != nil {
		cancel()
		t.Fatalf("setup: %v", err)
	}
	op := &operator{components: comps, cancel: cancel, done: make(chan error, 1), logs: logs, cache: mgr.GetCache()}
	go func() { op.done <- mgr.Start(ctx) }()
	return op
}

// stop cancels the manager and waits for it; an error from it (not a
// clean shutdown) fails the test.
func (o *operator) stop(t testing.TB) {
	t.Helper()
	if o.cancel == nil {
		return
	}
	o.cancel()
	if err := <-o.done; err != nil {
		t.Errorf("manager: %v", err)
	}
	o.cancel = nil
}

// testBootstrap stands in for the CI platforms' accounts: it hands each VM
// a recognisable single-use credential so the tests can check that it never
// lingers anywhere.
type testBootstrap struct{}

func jitSecretOf(uid string) string { return "jit-secret-" + uid }

func (testBootstrap) Release(context.Context, *hfv1.MachineClaim, *hfv1.HypervisorMachineTemplate) error {
	return nil
}

// testCredentialsIssued counts the credentials testBootstrap issued, by
// claim UID (an *atomic.Int64 each).
var testCredentialsIssued sync.Map

// credentialsIssuedFor is how many credentials testBootstrap issued for the
// claim.
func credentialsIssuedFor(claim *hfv1.MachineClaim) int64 {
	if n, ok := testCredentialsIssued.Load(claim.UID); ok {
		return n.(*atomic.Int64).Load()
	}
	return 0
}

// VerifyPoolScope vouches for every pool's scope: the stand-in has no CI
// platform to ask (the operator's own check is tested with the GitHub
// simulator).
func (testBootstrap) VerifyPoolScope(context.Context, *hfv1.RunnerPool, *hfv1.HypervisorMachineTemplate) error {
	return nil
}

func (testBootstrap) BootstrapVars(context.Context, *hfv1.MachineClaim, *hfv1.HypervisorMachineTemplate, *cloudinit.Vars) error {
	return nil
}

// RunnerCredential issues the stand-in credential placed in the claim's
// running VM, and records it as workloads.Platforms does.
func (testBootstrap) RunnerCredential(_ context.Context, claim *hfv1.MachineClaim) (workload.Credential, error) {
	n, _ := testCredentialsIssued.LoadOrStore(claim.UID, new(atomic.Int64))
	id := n.(*atomic.Int64).Add(1)
	now := time.Now()
	cred := workload.Credential{Method: credmethods.MethodJIT, Secret: workload.NewSecret(jitSecretOf(string(claim.UID))),
		RunnerName: claim.Name, RunnerID: id, IssuedAt: now, ExpiresAt: now.Add(time.Hour)}
	st := &hfv1.BootstrapStatus{RunnerName: cred.RunnerName, RunnerID: cred.RunnerID, CredentialIssuedAt: &metav1.Time{Time: now}}
	if old := claim.Status.Bootstrap; old != nil {
		st.CredentialRequestedAt = old.CredentialRequestedAt
	}
	claim.Status.Bootstrap = st
	return cred, nil
}

// simulator is a Proxmox simulator on loopback TLS.
type simulator struct {
	*proxmoxsim.Simulator
	url         string
	fingerprint string
	// clusterName is the Proxmox cluster name ownership blocks are bound to.
	clusterName string
	// onRequest, when set, sees every request before the simulator does
	// (benchmarks time clone requests with it).
	onRequest atomic.Pointer[func(*http.Request)]
	// onResponse, when set, sees every request with the status code the
	// simulator answered; 0 when it took the connection over: its errors
	// (written by hand, with Proxmox's reason phrase) and dropped
	// connections.
	onResponse atomic.Pointer[func(*http.Request, int)]
}

// statusRecorder tells answered the status code a handler wrote (0 when
// it took the connection over) the moment it writes it, before the client
// can read it: a test that reads its log once the operator has acted on an
// answer finds the answer there. Reporting after the handler returned
// raced with the client on a hijacked connection, whose bytes go out as
// the simulator writes them (a CI run's TestObservabilityProperty read an
// empty log for a clone the operator had already failed on).
type statusRecorder struct {
	http.ResponseWriter
	answered func(code int)
	done     bool
}

// serveRecorded serves r with h, telling answered its status code.
func serveRecorded(h http.Handler, w http.ResponseWriter, r *http.Request, answered func(*http.Request, int)) {
	rec := &statusRecorder{ResponseWriter: w, answered: func(code int) { answered(r, code) }}
	h.ServeHTTP(rec, r)
	// A handler that wrote nothing answered 200.
	rec.answer(http.StatusOK)
}

func (s *statusRecorder) answer(code int) {
	if !s.done {
		s.done = true
		s.answered(code)
	}
}

func (s *statusRecorder) WriteHeader(code int) {
	s.answer(code)
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	s.answer(http.StatusOK)
	return s.ResponseWriter.Write(b)
}

// Hijack lets the simulator drop a connection, or write its own status
// line, through the recorder.
func (s *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := s.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, fmt.Errorf("%T cannot hijack", s.ResponseWriter)
	}
	s.answer(0)
	return h.Hijack()
}

// fastLatency keeps lifecycles short in wall time but every step still
// takes a task.
func fastLatency() proxmoxsim.Latency {
	ms := func(n int) proxmoxsim.Duration { return proxmoxsim.Duration(time.Duration(n) * time.Millisecond) }
	return proxmoxsim.Latency{
		CloneBase: ms(200), Config: ms(20), Resize: ms(50), Start: ms(50), Boot: ms(300),
		Stop: ms(50), Shutdown: ms(100), Destroy: ms(100), Upload: ms(20),
	}
}

func startSim(t testing.TB, mutate func(*proxmoxsim.Config), opts ...proxmoxsim.Option) *simulator {
	t.Helper()
	cfg := proxmoxsim.DefaultConfig()
	cfg.Latency = fastLatency()
	cfg.AuthFailureDelay = proxmoxsim.Duration(10 * time.Millisecond)
	cfg.RefreshInterval = proxmoxsim.Duration(200 * time.Millisecond)
	if mutate != nil {
		mutate(&cfg)
	}
	sim, err := proxmoxsim.New(cfg, append([]proxmoxsim.Option{proxmoxsim.WithAdmin(true)}, opts...)...)
	if err != nil {
		t.Fatalf("simulator: %v", err)
	}
	out := &simulator{Simulator: sim, clusterName: cfg.ClusterName}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hook := out.onRequest.Load(); hook != nil {
			(*hook)(r)
		}
		if hook := out.onResponse.Load(); hook != nil {
			serveRecorded(sim, w, r, *hook)
			return
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	sum := sha256.Sum256(srv.Certificate().Raw)
	var fp []string
	for _, b := range sum {
		fp = append(fp, fmt.Sprintf("%02X", b))
	}
	out.url, out.fingerprint = srv.URL+"/api2/json", strings.Join(fp, ":")
	return out
}

// holdRequests holds the simulator's requests that match (every one when
// match is nil) until release is called or the client gives up, as an API
// that stopped answering behind a partition does; held counts those held
// so far. Register release as a cleanup after the fixtures that use the
// simulator (cleanups run last first), so that their deletion and the
// operator's stop do not wait out a held pass's timeout.
func (s *simulator) holdRequests(match func(*http.Request) bool) (held *atomic.Int32, release func()) {
	held = &atomic.Int32{}
	done := make(chan struct{})
	hook := func(r *http.Request) {
		if match != nil && !match(r) {
			return
		}
		held.Add(1)
		select {
		case <-done:
		case <-r.Context().Done():
		}
	}
	s.onRequest.Store(&hook)
	var once sync.Once
	return held, func() { once.Do(func() { close(done) }) }
}

// fixture is one test's objects: a namespace, a cluster and a template.
type fixture struct {
	t         testing.TB
	ctx       context.Context
	namespace string
	cluster   *hfv1.HypervisorCluster
	template  *hfv1.HypervisorMachineTemplate
	// hypervisorName is the simulated Proxmox cluster's name.
	hypervisorName string
}

var fixtureSeq int

// signer is testSigner bound to the fixture's cluster, as the operator's
// provider for that cluster binds it: blocks it writes verify there only.
func (f *fixture) signer() *ownership.Signer {
	return testSigner.ForCluster(ownership.ClusterIdentity{Name: f.cluster.Name, HypervisorName: f.hypervisorName})
}

// newFixture creates a namespace, the token Secret, a HypervisorCluster
// pointing at sim and a HypervisorMachineTemplate for template 9000. The
// objects are deleted (and their finalizers awaited) when the test ends,
// before the operator stops.
func newFixture(t testing.TB, sim *simulator, mutateCluster func(*hfv1.HypervisorCluster)) *fixture {
	t.Helper()
	ctx := context.Background()
	fixtureSeq++
	f := &fixture{t: t, ctx: ctx, hypervisorName: sim.clusterName, namespace: fmt.Sprintf("t%d-%s", fixtureSeq, strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-")))}
	if len(f.namespace) > 40 {
		f.namespace = f.namespace[:40]
	}
	f.namespace = strings.TrimRight(strings.ReplaceAll(f.namespace, "_", "-"), "-")
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.namespace, Labels: map[string]string{"hyperfleet.io/tenant": "yes"}}})
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: secretNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secretName := "pve-" + f.namespace
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: secretName},
		StringData: map[string]string{"id": simTokenID, "secret": simTokenSecret},
	})
	f.cluster = &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "pve-" + f.namespace},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox,
			Endpoint: sim.url,
			Credentials: hfv1.HypervisorCredentials{
				TokenID:     &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: secretName, Key: "id"},
				TokenSecret: &hfv1.SecretKeySelector{Namespace: secretNamespace, Name: secretName, Key: "secret"},
			},
			TLS:          &hfv1.HypervisorTLS{FingerprintSHA256: sim.fingerprint},
			Proxmox:      &hfv1.ProxmoxClusterSettings{VMIDRange: &hfv1.VMIDRange{Start: 1000, End: 1999}},
			PollInterval: &metav1.Duration{Duration: time.Second},
		},
	}
	if mutateCluster != nil {
		mutateCluster(f.cluster)
	}
	f.create(f.cluster)
	f.template = &hfv1.HypervisorMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "debian"},
		Spec: hfv1.HypervisorMachineTemplateSpec{
			HypervisorClusterRef: hfv1.ObjectName{Name: f.cluster.Name},
			Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
			Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
			Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{
				Owner:        "octo-org",
				Organization: "octo-org",
				Credentials:  hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}},
			}},
		},
	}
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "github"},
		StringData: map[string]string{"token": "ghp_longLivedPATthatMustNeverLeaveTheOperator"},
	})
	f.create(f.template)
	t.Cleanup(f.cleanup)
	// Registered after the cleanup, so run before it: a failed test's
	// events, while its objects still exist.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("events of namespace %s and of cluster %s:\n%s", f.namespace, f.cluster.Name,
				eventdump.Format(context.Background(), env.Client, func(e corev1.Event) bool {
					return e.Namespace == f.namespace || eventdump.Names(f.cluster.Name)(e)
				}, f.namespace, "default"))
		}
	})
	return f
}

func (f *fixture) create(obj client.Object) {
	f.t.Helper()
	if err := env.Client.Create(f.ctx, obj); err != nil {
		f.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// cleanup deletes the fixture's claims and cluster and waits until their
// finalizers ran, so the next test's operator starts from a clean slate.
func (f *fixture) cleanup() {
	ctx := f.ctx
	// Pools first, or they would replace the claims deleted below.
	_ = env.Client.DeleteAllOf(ctx, &hfv1.RunnerPool{}, client.InNamespace(f.namespace))
	_ = env.Client.DeleteAllOf(ctx, &hfv1.MachineClaim{}, client.InNamespace(f.namespace))
	_ = env.Client.Delete(ctx, f.cluster)
	// Generous: a benchmark fixture holds a hundred claims.
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var claims hfv1.MachineClaimList
		_ = env.Client.List(ctx, &claims, client.InNamespace(f.namespace))
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), &hfv1.HypervisorCluster{})
		if len(claims.Items) == 0 && apierrors.IsNotFound(err) {
			return
		}
		// A pool reconcile in flight when its pool went may still have
		// created a claim.
		for i := range claims.Items {
			if claims.Items[i].DeletionTimestamp.IsZero() {
				_ = env.Client.Delete(ctx, &claims.Items[i])
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Remove what is left by force so later tests are not confused.
	var claims hfv1.MachineClaimList
	_ = env.Client.List(ctx, &claims, client.InNamespace(f.namespace))
	for i := range claims.Items {
		c := &claims.Items[i]
		c.Finalizers = nil
		_ = env.Client.Update(ctx, c)
	}
	var c hfv1.HypervisorCluster
	if env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), &c) == nil {
		c.Finalizers = nil
		_ = env.Client.Update(ctx, &c)
	}
	f.t.Errorf("cleanup: claims or cluster of %s were not finalized within 5 minutes", f.namespace)
}

// newClaim creates a MachineClaim for the fixture's template.
func (f *fixture) newClaim(name string) *hfv1.MachineClaim {
	f.t.Helper()
	c := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: f.template.Name}},
	}
	f.create(c)
	return c
}

// longScenario marks a test that repeats, at scale or across minutes of
// simulated time, paths the shorter tests already drive: many claims at
// once, several pools or clusters, injected faults. `make test` runs them
// in full; `make test-race` passes -short and leaves them out, because the
// race detector makes each one several times slower while the shorter
// tests already run the same reconcilers concurrently under it.
// conflictRetry is how tests retry a read-modify-write of an object the
// operator also writes: client-go's DefaultRetry (5 tries in about 50 ms)
// lost every try to a RunnerPool's status writes under CI's load once
// (property 16's test); this keeps trying for about 10 s.
var conflictRetry = wait.Backoff{Steps: 14, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: time.Second}

func longScenario(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("long scenario: run by make test, left out of the -short race run")
	}
}

// eventually polls cond until it returns nil or timeout passes. Waiting for
// a controller to converge is not a timing assertion: the timeout only
// bounds a hang.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func getClaim(t testing.TB, c *hfv1.MachineClaim) (*hfv1.MachineClaim, error) {
	t.Helper()
	out := &hfv1.MachineClaim{}
	err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), out)
	return out, err
}

// waitPhase waits until the claim reaches phase.
func waitPhase(t testing.TB, c *hfv1.MachineClaim, phase hfv1.MachineClaimPhase, timeout time.Duration) *hfv1.MachineClaim {
	t.Helper()
	var got *hfv1.MachineClaim
	eventually(t, timeout, fmt.Sprintf("claim %s phase %s", c.Name, phase), func() error {
		var err error
		got, err = getClaim(t, c)
		if err != nil {
			return err
		}
		if got.Status.Phase != phase {
			return fmt.Errorf("phase %q, conditions %+v", got.Status.Phase, got.Status.Conditions)
		}
		return nil
	})
	return got
}

// waitDelivered waits until the claim runs and its runner credential is in
// the running VM: the phase says Bootstrapping once the VM runs, and the
// credential is issued and placed in the passes after that.
func waitDelivered(t testing.TB, c *hfv1.MachineClaim, timeout time.Duration) *hfv1.MachineClaim {
	t.Helper()
	var got *hfv1.MachineClaim
	eventually(t, timeout, fmt.Sprintf("claim %s credential delivered", c.Name), func() error {
		var err error
		if got, err = getClaim(t, c); err != nil {
			return err
		}
		if b := got.Status.Bootstrap; got.Status.Phase != hfv1.MachineClaimBootstrapping || b == nil || b.CredentialDeliveredAt == nil {
			return fmt.Errorf("phase %q, bootstrap %+v, conditions %+v", got.Status.Phase, got.Status.Bootstrap, got.Status.Conditions)
		}
		return nil
	})
	return got
}

// operatorVMs lists the simulator's VMs carrying the test install's tag.
func operatorVMs(sim *simulator) []proxmoxsim.VMState {
	var out []proxmoxsim.VMState
	for _, vm := range sim.VMs() {
		if strings.Contains(vm.Tags, testSigner.OperatorTag()) {
			out = append(out, vm)
		}
	}
	return out
}
