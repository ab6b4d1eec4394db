package controller

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	fakeprovider "github.com/hyperfleet/hyperfleet/pkg/provider/fake"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// The cheap world of the identity and credential properties (14 and 23):
// controller-runtime's fake API server, the reconcilers built directly as
// the phase tests build them (skeleton_unit_test.go), the in-process
// GitHub simulator and the in-memory hypervisor. The scenarios against
// the real API server stay in properties_attestation_test.go and
// properties_externalsecret_test.go.

const (
	identityNS      = "team"
	identityCluster = "pve"
	identityOrg     = "octo-org"
)

// githubCallLog records which credential each request to GitHub carried:
// the PAT, the App JWT's issuer (app:<id>) or the installation token's
// App (app:<id>, learnt from the access token exchange's answer).
type githubCallLog struct {
	next http.RoundTripper
	// installApp maps an installation id to its App id.
	installApp map[string]string

	mu sync.Mutex
	// tokenApp maps an installation token to its App (app:<id>).
	tokenApp map[string]string
	used     []string
}

var accessTokensPath = regexp.MustCompile(`/app/installations/([0-9]+)/access_tokens$`)

func (l *githubCallLog) RoundTrip(r *http.Request) (*http.Response, error) {
	cred := l.credentialOf(r.Header.Get("Authorization"))
	resp, err := l.next.RoundTrip(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.used = append(l.used, cred)
	if m := accessTokensPath.FindStringSubmatch(r.URL.Path); m != nil && err == nil && resp.StatusCode/100 == 2 {
		body, rerr := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		var tok struct {
			Token string `json:"token"`
		}
		if rerr == nil && json.Unmarshal(body, &tok) == nil && tok.Token != "" {
			l.tokenApp[tok.Token] = "app:" + l.installApp[m[1]]
		}
	}
	return resp, err
}

// credentialOf names the credential of an Authorization header.
func (l *githubCallLog) credentialOf(h string) string {
	_, v, _ := strings.Cut(h, " ")
	if parts := strings.Split(v, "."); len(parts) == 3 {
		// An App's JWT: its issuer is the App id.
		raw, err := base64.RawURLEncoding.DecodeString(parts[1])
		var claims struct {
			Iss json.RawMessage `json:"iss"`
		}
		if err == nil && json.Unmarshal(raw, &claims) == nil {
			return "app:" + strings.Trim(string(claims.Iss), `"`)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if app, ok := l.tokenApp[v]; ok {
		return app
	}
	return v
}

// since returns the credentials used from index i on.
func (l *githubCallLog) since(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.used[i:])
}

func (l *githubCallLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.used)
}

// secretWorld is property 23's cheap world: the template reconciler and
// the CI platforms the claim controller issues VM credentials with
// (workloads.Platforms, as internal/manager builds it), over a fake API
// server, a connected in-memory cluster, and the GitHub simulator that
// knows every PAT and GitHub App the external secrets system may write.
type secretWorld struct {
	kube      client.Client
	templates *HypervisorMachineTemplateReconciler
	events    *record.FakeRecorder
	platforms *workloads.Platforms
	calls     *githubCallLog
	gh        *githubsimtest.Server
	pats      []string
	apps      []secretWorldApp
	logs      *identityLog
}

// secretWorldApp is a GitHub App installed on the organization.
type secretWorldApp struct {
	id, installation string
	key              []byte
}

// identityLog is the operator's log, as text.
type identityLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *identityLog) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(prefix + " " + args + "\n")
}

func (l *identityLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newSecretWorld(t *testing.T) *secretWorld {
	t.Helper()
	w := &secretWorld{logs: &identityLog{}}
	cfg := githubsim.Config{Organizations: []githubsim.OrgConfig{{Login: identityOrg}}, RateLimit: 1 << 30}
	for i := range 24 {
		pat := fmt.Sprintf("ghp_p23rotated%04dx%s", i, strings.Repeat("k", 20))
		w.pats = append(w.pats, pat)
		cfg.PATs = append(cfg.PATs, githubsim.PATConfig{Token: pat, Login: "octocat"})
	}
	for i := range 3 {
		k, err := githubsim.NewAppKey()
		if err != nil {
			t.Fatal(err)
		}
		id, inst := int64(2300+i), int64(9100+i)
		w.apps = append(w.apps, secretWorldApp{id: strconv.FormatInt(id, 10), installation: strconv.FormatInt(inst, 10), key: k.PrivatePEM})
		cfg.Apps = append(cfg.Apps, githubsim.AppConfig{ID: id, PublicKey: k.PublicPEM,
			Installations: []githubsim.InstallationConfig{{ID: inst, Account: identityOrg}}})
	}
	w.gh = githubsimtest.Start(t, cfg)
	w.calls = &githubCallLog{next: w.gh.Transport, installApp: map[string]string{}, tokenApp: map[string]string{}}
	for _, a := range w.apps {
		w.calls.installApp[a.installation] = a.id
	}
	backends, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{Transport: w.calls})
	if err != nil {
		t.Fatal(err)
	}
	hv, err := fakeprovider.NewCluster(clocktesting.NewFakeClock(unitEpoch), fakeprovider.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	reg := hypervisors.NewRegistry()
	pcfg := provider.ClusterConfig{Name: identityCluster, VMIDStart: 100, VMIDEnd: 999}
	if _, err := reg.Connect(identityCluster, pcfg, func() (provider.Provider, error) {
		return hv.NewProvider(pcfg, provider.Deps{Signer: testobjects.Signer(t)})
	}); err != nil {
		t.Fatal(err)
	}
	reg.SetHealth(identityCluster, hypervisors.Health{Ready: true}, unitEpoch)
	w.kube = unitWorld(t, interceptor.Funcs{},
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: identityNS}},
		&hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: identityCluster}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox}})
	w.events = record.NewFakeRecorder(1 << 14)
	w.templates = &HypervisorMachineTemplateReconciler{Client: w.kube, Registry: reg, Recorder: w.events, Workloads: backends}
	w.platforms = &workloads.Platforms{Client: w.kube, Backends: backends, Signer: testobjects.Signer(t)}
	return w
}

// ctx carries a logger writing into the world's log.
func (w *secretWorld) ctx() context.Context {
	return ctrl.LoggerInto(context.Background(), funcr.New(w.logs.add, funcr.Options{Verbosity: 10}))
}

// reconcileTemplate runs one pass of the template reconciler and returns
// the template as it left it.
func (w *secretWorld) reconcileTemplate(key client.ObjectKey) (*hfv1.HypervisorMachineTemplate, error) {
	if _, err := w.templates.Reconcile(w.ctx(), ctrl.Request{NamespacedName: key}); err != nil {
		return nil, fmt.Errorf("reconcile template %s: %w", key, err)
	}
	got := &hfv1.HypervisorMachineTemplate{}
	if err := w.kube.Get(context.Background(), key, got); err != nil {
		return nil, fmt.Errorf("read template %s: %w", key, err)
	}
	return got, nil
}

// drainEvents returns the events recorded so far.
func (w *secretWorld) drainEvents() []string {
	var out []string
	for {
		select {
		case e := <-w.events.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// externalSecretMetaUnit is what the external-secrets controller puts on a
// Secret it writes for an ExternalSecret (as externalSecretMeta in
// properties_externalsecret_test.go).
func externalSecretMetaUnit(s *corev1.Secret, owner, hash string) {
	s.Labels = map[string]string{"reconcile.external-secrets.io/created-by": owner, "reconcile.external-secrets.io/managed": "true"}
	s.Annotations = map[string]string{"reconcile.external-secrets.io/data-hash": hash}
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "external-secrets.io/v1beta1", Kind: "ExternalSecret", Name: owner,
		UID: k8stypes.UID("00000000-0000-4000-8000-0000000000" + fmt.Sprintf("%02d", len(owner)%100)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
}

// Feature: hyperfleet-operator, Property 23: External Secret Integration
//
// TestExternalSecretRotationProperty: for a template whose GitHub
// credentials (a PAT, or a GitHub App's id, installation id and private
// key, under generated key names) come from a Secret an external-secrets
// controller writes (its labels, data-hash annotation and ExternalSecret
// owner), over generated sequences of up to six syncs (the Secret not yet
// written, written with every key, with keys missing, rotated to another
// PAT or App the platform knows, deleted), the operator integrates and uses
// what the external system manages: after each sync the template is Valid
// exactly when the Secret holds every key, else not Valid with reason
// SecretNotFound and a message naming the Secret, every missing key and the
// fix; and after each sync that leaves every key, the next VM's runner
// credential (workloads.Platforms.RunnerCredential, which the claim
// controller calls) is issued with the credential the Secret holds now:
// every GitHub call made for it carries that PAT, or that App's JWT or an
// installation token minted with it, never a credential the Secret held
// before. No value the Secret ever held is in the template's status, an
// event or the operator's log.
//
// It runs in the cheap world (fake API server, reconcilers built
// directly, in-process GitHub simulator): 100 cases in a few seconds.
// TestExternalSecretScenario (properties_externalsecret_test.go) keeps one
// sequence against the real API server.
//
// Mutation: pkg/workload/github's Backend.Provider reusing the provider
// cached for a template whatever its fingerprint (`if c, ok :=
// b.providers[key]; ok {`), so that a rotated PAT or App key kept being
// used until the operator restarted, fails this test (GitHub calls made
// with the credential the Secret held before); the old
// TestExternalSecretProperty, which only read the template's Valid
// condition, passed it.
func TestExternalSecretRotationProperty(t *testing.T) {
	w := newSecretWorld(t)
	n := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		ctx := w.ctx()
		app := rapid.Bool().Draw(rt, "GitHub App")
		keyName := rapid.StringMatching(`[a-z][a-z0-9_.-]{0,10}`)
		var keys []string
		if app {
			keys = rapid.SliceOfNDistinct(keyName, 3, 3, func(s string) string { return s }).Draw(rt, "App keys")
		} else {
			keys = []string{keyName.Draw(rt, "PAT key")}
		}
		secretKey := client.ObjectKey{Namespace: identityNS, Name: fmt.Sprintf("p23-gh-%d", n)}
		ref := func(i int) hfv1.LocalSecretKeySelector {
			return hfv1.LocalSecretKeySelector{Name: secretKey.Name, Key: keys[i]}
		}
		tmpl := &hfv1.HypervisorMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: fmt.Sprintf("p23-%d", n), Generation: 1, Finalizers: []string{hfv1.HypervisorMachineTemplateFinalizer}},
			Spec: hfv1.HypervisorMachineTemplateSpec{
				HypervisorClusterRef: hfv1.ObjectName{Name: identityCluster},
				Source:               hfv1.MachineSource{Proxmox: hfv1.ProxmoxSource{TemplateID: ptr.To[int32](9000)}},
				Resources:            hfv1.MachineResources{CPU: 2, Memory: resource.MustParse("2Gi")},
				Bootstrap:            hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{APIBaseURL: w.gh.URL + "/api/v3", Owner: identityOrg, Organization: identityOrg}},
			},
		}
		if app {
			tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{AppID: ref(0), InstallationID: ref(1), PrivateKey: ref(2)}}
		} else {
			tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{PAT: ptr.To(ref(0))}
		}
		if err := w.kube.Create(ctx, tmpl); err != nil {
			rt.Fatal(err)
		}
		defer func() {
			_ = w.kube.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: secretKey.Name}})
			// The finalizer goes with the template's deletion pass.
			_ = w.kube.Delete(context.Background(), tmpl)
			_, _ = w.templates.Reconcile(context.Background(), ctrl.Request{NamespacedName: client.ObjectKeyFromObject(tmpl)})
		}()

		var values []string // every value the Secret held
		var held []string   // every credential the Secret held (a PAT or app:<id>)
		current := -1       // the PAT or App the Secret holds now
		currentCred := ""   // and its name in githubCallLog's terms
		for step := range rapid.IntRange(1, 6).Draw(rt, "syncs") {
			deleted := rapid.IntRange(0, 4).Draw(rt, "deleted") == 0
			var missing []string
			if deleted {
				if err := w.kube.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: secretKey.Name}}); err != nil && !apierrors.IsNotFound(err) {
					rt.Fatal(err)
				}
			} else {
				// A sync: rotated to another credential, or the same.
				choices := len(w.pats)
				if app {
					choices = len(w.apps)
				}
				if current < 0 || rapid.Bool().Draw(rt, "rotate") {
					next := rapid.IntRange(0, choices-2).Draw(rt, "rotated to")
					if next >= current && current >= 0 {
						next++
					}
					current = next
				}
				var vals []string
				cred := ""
				if app {
					a := w.apps[current]
					vals, cred = []string{a.id, a.installation, string(a.key)}, "app:"+a.id
				} else {
					vals, cred = []string{w.pats[current]}, w.pats[current]
				}
				data := map[string][]byte{}
				for i, k := range keys {
					if rapid.IntRange(0, 3).Draw(rt, "key missing") == 0 {
						missing = append(missing, k)
						continue
					}
					data[k] = []byte(vals[i])
				}
				currentCred = cred
				if !slices.Contains(held, cred) {
					held = append(held, cred)
				}
				if !app {
					values = append(values, vals...)
				} else {
					// An App's id and installation id are no secrets (and
					// short numbers appear anywhere); its key is.
					values = append(values, string(w.apps[current].key[40:80]))
				}
				s := &corev1.Secret{}
				err := w.kube.Get(ctx, secretKey, s)
				if apierrors.IsNotFound(err) {
					s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: secretKey.Name}}
				} else if err != nil {
					rt.Fatal(err)
				}
				externalSecretMetaUnit(s, "gh-"+secretKey.Name, fmt.Sprintf("h%d-%d", n, step))
				s.Data = data
				if s.ResourceVersion == "" {
					err = w.kube.Create(ctx, s)
				} else {
					err = w.kube.Update(ctx, s)
				}
				if err != nil {
					rt.Fatalf("sync %d: %v", step, err)
				}
			}
			valid := !deleted && len(missing) == 0
			got, err := w.reconcileTemplate(client.ObjectKeyFromObject(tmpl))
			if err != nil {
				rt.Fatal(err)
			}
			checkExternalSecretValidity(rt, got, secretKey, valid, deleted, keys, missing)
			if !valid {
				continue
			}
			// The next VM: its runner credential is issued with what the
			// Secret holds now.
			claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: fmt.Sprintf("p23-%d-%d", n, step),
				UID: k8stypes.UID(fmt.Sprintf("%08d-0000-4000-8000-%012d", n, step))}}
			claim.Spec.TemplateRef.Name = tmpl.Name
			from := w.calls.count()
			if _, err := w.platforms.RunnerCredential(ctx, claim); err != nil {
				rt.Fatalf("sync %d: the next VM's runner credential: %v", step, err)
			}
			now := currentCred
			used := w.calls.since(from)
			if len(used) == 0 {
				rt.Fatalf("sync %d: no GitHub call made for the next VM's credential", step)
			}
			for _, u := range used {
				if u != now {
					rt.Fatalf("sync %d: a GitHub call for the next VM carried %s, not the credential the Secret holds now (%s); the Secret held %s",
						step, w.nameOf(u), w.nameOf(now), strings.Join(identityMap(held, w.nameOf), ", "))
				}
			}
			if err := w.platforms.Release(ctx, claim, tmpl); err != nil {
				rt.Fatalf("release the runner: %v", err)
			}
		}
		got := &hfv1.HypervisorMachineTemplate{}
		if err := w.kube.Get(ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
			rt.Fatal(err)
		}
		status, _ := json.Marshal(got.Status)
		places := map[string]string{"the template's status": string(status), "events": strings.Join(w.drainEvents(), "\n"), "the operator's log": w.logs.String()}
		for where, text := range places {
			for _, v := range values {
				if strings.Contains(text, v) {
					rt.Fatalf("the Secret's value %s is in %s", w.nameOf(v), where)
				}
			}
		}
	})
}

// nameOf names a credential without showing it: the world's PAT by
// index, an App by its id.
func (w *secretWorld) nameOf(cred string) string {
	if i := slices.Index(w.pats, cred); i >= 0 {
		return fmt.Sprintf("PAT #%d", i)
	}
	if strings.HasPrefix(cred, "app:") {
		return "App " + strings.TrimPrefix(cred, "app:")
	}
	for _, a := range w.apps {
		if strings.Contains(string(a.key), cred) {
			return "App " + a.id + "'s private key"
		}
	}
	return "an unknown credential"
}

func identityMap[T, U any](in []T, f func(T) U) []U {
	out := make([]U, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// checkExternalSecretValidity checks the template's Valid condition after
// a sync.
func checkExternalSecretValidity(rt *rapid.T, got *hfv1.HypervisorMachineTemplate, secret client.ObjectKey, valid, deleted bool, keys, missing []string) {
	c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
	switch {
	case c == nil:
		rt.Fatalf("no Valid condition: %+v", got.Status.Conditions)
	case valid && c.Status != metav1.ConditionTrue:
		rt.Fatalf("Valid %s %s, want True: %s", c.Status, c.Reason, c.Message)
	case valid:
		return
	case c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.SecretNotFoundReason):
		rt.Fatalf("Valid %s %s, want False SecretNotFound (deleted %v, missing %v): %s", c.Status, c.Reason, deleted, missing, c.Message)
	case deleted && !strings.Contains(c.Message, "Secret "+secret.String()+" does not exist; create it"):
		rt.Fatalf("the message does not name the missing Secret and the fix: %s", c.Message)
	}
	if deleted {
		return
	}
	for _, k := range missing {
		if !strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) || !strings.Contains(c.Message, "add it or fix the key") {
			rt.Fatalf("the message does not name the missing key %q and the fix: %s", k, c.Message)
		}
	}
	for _, k := range keys {
		if !slices.Contains(missing, k) && strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) {
			rt.Fatalf("the message names key %q, which the Secret has: %s", k, c.Message)
		}
	}
}

// brokerWorld is property 14's cheap world: the credential broker
// (internal/broker) over a fake API server, its identity registry dialing
// the in-memory SPIRE server of example.org that the cluster names, the
// CI platforms issuing real runners on the GitHub simulator, and two SPIRE
// servers no cluster trusts (another CA of example.org, a forger, and one
// of other.org). A request is served as the agent server hands it over
// after the TLS handshake (the peer's certificates in the request).
type brokerWorld struct {
	kube   client.Client
	broker *broker.Broker
	gh     *githubsimtest.Server
	spire  *identitytest.Server
	forger *identitytest.Server
	other  *identitytest.Server
	proofs *identity.Issuer
	tmpl   string
}

func newBrokerWorld(t *testing.T) *brokerWorld {
	t.Helper()
	const pat = "ghp_p14cheapWorldBrokerIssuer00000000"
	w := &brokerWorld{spire: identitytest.NewServer(t, "example.org"), forger: identitytest.NewServer(t, "example.org"),
		other: identitytest.NewServer(t, "other.org"), tmpl: "attesting"}
	w.gh = githubsimtest.Start(t, githubsim.Config{Organizations: []githubsim.OrgConfig{{Login: identityOrg}},
		PATs: []githubsim.PATConfig{{Token: pat, Login: "octocat"}}, RateLimit: 1 << 30})
	backends, err := workload.NewBackends(githubsimtest.Workloads(), workload.Dependencies{Transport: w.gh.Transport})
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: w.tmpl}, Spec: hfv1.HypervisorMachineTemplateSpec{
		HypervisorClusterRef: hfv1.ObjectName{Name: identityCluster},
		Bootstrap: hfv1.Bootstrap{GitHub: &hfv1.GitHubBootstrap{APIBaseURL: w.gh.URL + "/api/v3", Owner: identityOrg, Organization: identityOrg,
			Credentials: hfv1.GitHubCredentials{PAT: &hfv1.LocalSecretKeySelector{Name: "github", Key: "token"}}}},
	}}
	cluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: identityCluster}, Spec: hfv1.HypervisorClusterSpec{Provider: hfv1.ProviderProxmox,
		SPIRE: &hfv1.SPIREConfig{TrustDomain: "example.org", ServerAddress: "spire.example.org:8081", ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire/server/api.sock"}}}}
	w.kube = unitWorld(t, interceptor.Funcs{}, tmpl, cluster,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: "github"}, Data: map[string][]byte{"token": []byte(pat)}})
	reg := identity.NewRegistry()
	reg.Dial = identitytest.Dialer(w.spire)
	signer := testobjects.Signer(t)
	w.proofs = &identity.Issuer{Keys: signer}
	w.broker = &broker.Broker{Client: w.kube, Reader: w.kube, Clusters: w.kube, Identity: reg, Proofs: w.proofs,
		Issuer:   &workloads.Platforms{Client: w.kube, Backends: backends, Signer: signer},
		Recorder: record.NewFakeRecorder(1 << 14), Limiter: rate.NewLimiter(rate.Inf, 1)}
	return w
}

// ask sends one credential request as the agent server hands it to the
// broker: cert's chain as the verified peer (nil: no certificate) and
// proof in the broker proof header ("": none).
func (w *brokerWorld) ask(t *rapid.T, cert *tls.Certificate, proof string) brokerAnswer {
	req := httptest.NewRequest(http.MethodPost, "https://agents.test"+broker.Path, nil)
	req.TLS = &tls.ConnectionState{}
	if cert != nil {
		for _, der := range cert.Certificate {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			req.TLS.PeerCertificates = append(req.TLS.PeerCertificates, c)
		}
	}
	if proof != "" {
		req.Header.Set(agentconfig.BrokerProofHeader, proof)
	}
	rec := httptest.NewRecorder()
	w.broker.ServeHTTP(rec, req)
	a := brokerAnswer{status: rec.Code}
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &a.resp); err != nil {
			t.Fatalf("the broker's credential: %v", err)
		}
		return a
	}
	var ref broker.Refusal
	if err := json.Unmarshal(rec.Body.Bytes(), &ref); err != nil || ref.Reason == "" || ref.Message == "" {
		t.Fatalf("a %d without a reason and a message: %s, %v", rec.Code, rec.Body, err)
	}
	a.reason = ref.Reason
	return a
}

// brokerAnswer is what the broker answered one request.
type brokerAnswer struct {
	status int
	reason string
	resp   broker.Response
}

// brokerClaimModel is what the broker must know of the case's claim, updated as
// the generated steps change it; expect is the answer to a valid SVID of
// the claim's own SPIFFE ID, in the order of the broker's checks
// (internal/broker, liveClaim and deliver).
type brokerClaimModel struct {
	requested, misuse, ending, deleted bool
}

func (m *brokerClaimModel) expect(proofOK bool) (int, string) {
	switch {
	case m.misuse:
		return http.StatusForbidden, broker.ReasonIdentityCompromised
	case !proofOK:
		return http.StatusForbidden, broker.ReasonBrokerProofInvalid
	case m.ending || m.deleted:
		return http.StatusForbidden, broker.ReasonNotBootstrapping
	case m.requested:
		return http.StatusConflict, broker.ReasonAlreadyIssued
	}
	return http.StatusOK, ""
}

// issuedClaim is a claim as the operator leaves it once its VM runs with
// its identity issued by method (join-token or tpm) and its guest secrets
// delivered: its status names its SPIFFE ID, its node alias and entry,
// and for a join token the token's times, for a TPM the enrollment.
func (w *brokerWorld) issuedClaim(rt *rapid.T, name string, tpm bool) (*hfv1.MachineClaim, spiffeid.ID, spiffeid.ID) {
	ctx := context.Background()
	uid := k8stypes.UID(fmt.Sprintf("%08x-0000-4000-8000-%012x", rapid.Uint32().Draw(rt, "uid"), len(name)))
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: identityNS, Name: name, UID: uid, Finalizers: []string{hfv1.MachineClaimFinalizer}},
		Spec: hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: w.tmpl}}}
	id, err := spire.VMID(w.spire.TD, identityNS, name, string(uid))
	if err != nil {
		rt.Fatal(err)
	}
	alias := spiffeid.RequireFromPath(w.spire.TD, "/hyperfleet/node/"+identityNS+"/"+name+"/"+string(uid))
	if err := w.kube.Create(ctx, claim); err != nil {
		rt.Fatal(err)
	}
	now := metav1.Now()
	claim.Status.VMRef = &hfv1.VMReference{HypervisorCluster: identityCluster, VMID: 1000, Node: "node-1"}
	claim.Status.Identity = &hfv1.IdentityStatus{SPIFFEID: id.String(), NodeID: alias.String(), EntryID: "hyperfleet." + string(uid)}
	if tpm {
		claim.Status.Identity.TPM = &hfv1.TPMIdentityStatus{EntriesCreatedAt: &now, SecretsDeliveredAt: &now, EnrolledAt: &now,
			EKFingerprint: "ek-" + string(uid), DevIDFingerprint: "devid-" + string(uid)}
	} else {
		expires := metav1.NewTime(now.Add(10 * time.Minute))
		claim.Status.Identity.JoinTokenCreatedAt, claim.Status.Identity.JoinTokenExpiresAt, claim.Status.Identity.JoinTokenDeliveredAt = &now, &expires, &now
	}
	if err := w.kube.Status().Update(ctx, claim); err != nil {
		rt.Fatal(err)
	}
	if err := w.spire.EnsureEntry(ctx, spire.Entry{ID: "hyperfleet." + string(uid), SPIFFEID: id, ParentID: alias}); err != nil {
		rt.Fatal(err)
	}
	return claim, id, alias
}

// runnersMinted is how many runners the GitHub simulator ever registered.
func (w *brokerWorld) runnersMinted() int {
	st := w.gh.Sim.State()
	return len(st.Runners) + len(st.RemovedRunners)
}

// Feature: hyperfleet-operator, Property 14: Generic Attestation and Credential Management
//
// TestAttestationBrokerProperty: a VM whose claim's identity the operator
// issued with either attestation method establishes its identity with
// SPIRE, obtains its X509-SVID and authenticates with it (and its broker
// proof) at the credential broker for its GitHub credential. Generated:
// the method (a join token, generated to be used in time, after it
// expired, after a thief used it or before a thief tries it again; or the
// TPM, whose DevID-attested agent gets the entry's SVID), then up to six
// steps in any order: the VM asking (again), a thief with the stolen
// token's SVID (or, for a TPM, which cannot be stolen, a self-signed
// certificate) and no proof, another VM's proof or a forged one,
// strangers (no certificate, self-signed, another CA of the trust domain,
// expired, another trust domain, an id that is no VM's or is malformed,
// the VM id of another claim), and the claim ended or deleted meanwhile.
// Only the VM with its SVID and its proof, while its claim is
// bootstrapping, gets a credential: exactly its claim's runner (the JIT
// configuration of the runner recorded in the claim, registered on the
// GitHub simulator), and once. Every other request is refused with the
// reason the broker's checks give, counted under it, and mints nothing; a
// valid SVID without the VM's proof is recorded as a misuse in the claim.
//
// The cheap world (fake API server, the broker built directly, in-memory
// SPIRE, in-process GitHub): 100 cases in seconds. The operator's issuing
// of the identity (join token, entries, guest secrets, the TPM's
// enrollment) and the template's attestation settings stay with
// TestAttestationScenario (properties_attestation_test.go) against the
// real API server; the VM's side of both methods, with a swtpm, with
// internal/agent's TestBootstrapServiceProperty.
//
// Mutation: IdentityStatus.Issued (api/v1alpha1/spire_types.go) counting
// join tokens only (`st.JoinTokenCreatedAt != nil`, without the TPM's
// EntriesCreatedAt), so that the broker refused every TPM VM its
// credential, fails this test (the TPM VM refused NoLiveClaim); the old
// TestAttestationCredentialProperty, whose VMs all attested with join
// tokens, passed it.
func TestAttestationBrokerProperty(t *testing.T) {
	w := newBrokerWorld(t)
	n := 0
	var tpmDelivered, tokenDelivered int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		tpm := rapid.Bool().Draw(rt, "TPM")
		delivered := w.claimCase(rt, n, tpm)
		switch {
		case delivered && tpm:
			tpmDelivered++
		case delivered:
			tokenDelivered++
		}
	})
	t.Logf("%d TPM VMs and %d join-token VMs got their credential", tpmDelivered, tokenDelivered)
	if tpmDelivered == 0 || tokenDelivered == 0 {
		t.Errorf("%d TPM VMs and %d join-token VMs got their credential; want some of each", tpmDelivered, tokenDelivered)
	}
}

// claimCase runs one claim's VM and the generated steps; it reports
// whether the VM got its credential.
func (w *brokerWorld) claimCase(rt *rapid.T, n int, tpm bool) bool {
	ctx := context.Background()
	name := fmt.Sprintf("p14-%d", n)
	claim, id, alias := w.issuedClaim(rt, name, tpm)
	defer func() {
		_ = w.kube.Delete(context.Background(), claim)
		if c := (&hfv1.MachineClaim{}); w.kube.Get(context.Background(), client.ObjectKeyFromObject(claim), c) == nil {
			c.Finalizers = nil
			_ = w.kube.Update(context.Background(), c)
		}
		_, _ = w.spire.DeleteEntriesBySPIFFEID(context.Background(), id)
	}()
	minted := w.runnersMinted()
	proof, err := w.proofs.BrokerProof(claim)
	if err != nil {
		rt.Fatal(err)
	}

	var vmSVID, thiefSVID *tls.Certificate
	var token string
	if tpm {
		// SPIRE's tpm_devid attestor proved the DevID the operator
		// certified for this claim's TPM (internal/tpmenroll); the alias
		// entry selecting it parents the VM's entry: the agent gets its
		// SVID.
		c, err := w.spire.SignX509SVID(id, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
		if err != nil {
			rt.Fatal(err)
		}
		vmSVID = &c
	} else {
		token = fmt.Sprintf("%08x-p14-%d", rapid.Uint32().Draw(rt, "token"), n)
		if _, err := w.spire.CreateJoinToken(ctx, token, 10*time.Minute, alias); err != nil {
			rt.Fatal(err)
		}
		svidOf := func(who string) *tls.Certificate {
			c, err := w.spire.X509SVID(token, id, time.Hour)
			if err != nil {
				rt.Fatalf("%s attested with the token of %s but gets no SVID of %s: %v", who, name, id, err)
			}
			return &c
		}
		switch mode := rapid.SampledFrom([]string{"valid", "stolen", "reused", "expired"}).Draw(rt, "attestation"); mode {
		case "valid", "reused":
			if !w.spire.Attest(token) {
				rt.Fatalf("the VM of %s could not attest with its token", name)
			}
			vmSVID = svidOf("the VM")
			if mode == "reused" && w.spire.Attest(token) {
				rt.Fatalf("a second agent attested with the used token of %s", name)
			}
		case "stolen":
			if !w.spire.Attest(token) {
				rt.Fatalf("the thief could not attest with the token of %s", name)
			}
			thiefSVID = svidOf("the thief")
			if w.spire.Attest(token) {
				rt.Fatalf("the VM of %s attested with a token already used", name)
			}
		case "expired":
			expires := claim.Status.Identity.JoinTokenExpiresAt.Time
			w.spire.SetClock(func() time.Time { return expires.Add(time.Minute) })
			ok := w.spire.Attest(token)
			w.spire.SetClock(nil)
			if ok {
				rt.Fatalf("the VM of %s attested with its token after it expired", name)
			}
			if _, err := w.spire.X509SVID(token, id, time.Hour); err == nil {
				rt.Fatalf("an SVID of %s for an agent that never attested", id)
			}
		}
	}

	m := &brokerClaimModel{}
	counts := map[string]int{}
	before := map[string]float64{}
	for _, r := range []string{broker.ReasonDelivered, broker.ReasonNoClientCertificate, broker.ReasonUnknownTrustDomain, broker.ReasonInvalidSVID,
		broker.ReasonNotAVMIdentity, broker.ReasonNoLiveClaim, broker.ReasonNotBootstrapping, broker.ReasonBrokerProofInvalid,
		broker.ReasonIdentityCompromised, broker.ReasonAlreadyIssued, broker.ReasonBusy} {
		before[r] = testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(r))
	}
	record := func(a brokerAnswer) {
		if a.status == http.StatusOK {
			counts[broker.ReasonDelivered]++
		} else {
			counts[a.reason]++
		}
	}
	var credentials []broker.Response
	asClaim := func(who string, cert *tls.Certificate, p string, proofOK bool) {
		status, reason := m.expect(proofOK)
		a := w.ask(rt, cert, p)
		record(a)
		if a.status != status || a.reason != reason {
			rt.Fatalf("%s asked for the credential of %s (%+v, TPM %v): got %d %s, want %d %s", who, name, *m, tpm, a.status, a.reason, status, reason)
		}
		switch {
		case a.status == http.StatusOK:
			m.requested = true
			credentials = append(credentials, a.resp)
		case reason == broker.ReasonBrokerProofInvalid:
			m.misuse = true
		}
	}
	otherProof := func() string {
		p, err := w.proofs.BrokerProof(&hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: k8stypes.UID(fmt.Sprintf("other-%d", n))}})
		if err != nil {
			rt.Fatal(err)
		}
		return p
	}
	selfSignedFor := func(id spiffeid.ID) *tls.Certificate {
		c, err := identitytest.SelfSigned(id)
		if err != nil {
			rt.Fatal(err)
		}
		return &c
	}
	signed := func(s *identitytest.Server, id spiffeid.ID, notAfter time.Time) *tls.Certificate {
		c, err := s.SignX509SVID(id, time.Now().Add(-2*time.Hour), notAfter)
		if err != nil {
			rt.Fatal(err)
		}
		return &c
	}
	later := time.Now().Add(time.Hour)
	for i := range rapid.IntRange(1, 6).Draw(rt, "steps") {
		switch step := rapid.IntRange(0, 6).Draw(rt, fmt.Sprintf("step %d", i)); step {
		case 0, 1, 2: // the VM asks, as its agent does once it has its SVID
			if vmSVID == nil {
				continue // no SVID: the agent exits without asking
			}
			asClaim("the VM", vmSVID, proof, true)
		case 3: // a thief, without the VM's proof
			kind := rapid.SampledFrom([]string{"none", "another VM's", "forged"}).Draw(rt, fmt.Sprintf("thief's proof %d", i))
			p := map[string]string{"none": "", "another VM's": otherProof(), "forged": strings.Repeat("A", 43)}[kind]
			if thiefSVID == nil {
				a := w.ask(rt, selfSignedFor(id), p)
				record(a)
				if a.status != http.StatusForbidden || a.reason != broker.ReasonInvalidSVID {
					rt.Fatalf("a self-signed certificate of %s: %d %s, want 403 %s", id, a.status, a.reason, broker.ReasonInvalidSVID)
				}
				continue
			}
			asClaim("a thief with "+kind+" proof", thiefSVID, p, false)
		case 4: // a stranger, with the VM's proof (which alone gets nothing)
			kind := rapid.IntRange(0, 8).Draw(rt, fmt.Sprintf("stranger %d", i))
			var cert *tls.Certificate
			var want string
			wantStatus := http.StatusForbidden
			switch kind {
			case 0:
				wantStatus, want = http.StatusUnauthorized, broker.ReasonNoClientCertificate
			case 1:
				cert, want = selfSignedFor(id), broker.ReasonInvalidSVID
			case 2:
				cert, want = signed(w.forger, id, later), broker.ReasonInvalidSVID
			case 3:
				cert, want = signed(w.spire, id, time.Now().Add(-time.Minute)), broker.ReasonInvalidSVID
			case 4:
				oid, err := spire.VMID(w.other.TD, identityNS, name, string(claim.UID))
				if err != nil {
					rt.Fatal(err)
				}
				cert, want = signed(w.other, oid, later), broker.ReasonUnknownTrustDomain
			case 5:
				agentPath := "/spire/agent/join_token/" + token
				if tpm {
					// The agent's own id of a DevID-attested agent.
					agentPath = "/spire/agent/tpm_devid/" + fmt.Sprintf("%040x", n)
				}
				path := rapid.SampledFrom([]string{
					alias.Path(), agentPath, "/ns/" + identityNS + "/sa/default",
					"/vm/" + identityNS + "/" + name, "/vm/" + identityNS + "/" + name + "/" + string(claim.UID) + "/extra",
					"/vm/Not_A_Namespace/" + name + "/" + string(claim.UID), "/vm/" + identityNS + "/" + strings.ToUpper(name) + "/" + string(claim.UID),
				}).Draw(rt, fmt.Sprintf("not a VM id %d", i))
				cert, want = signed(w.spire, spiffeid.RequireFromPath(w.spire.TD, path), later), broker.ReasonNotAVMIdentity
			case 6, 7, 8:
				ns, nm, uid := identityNS, name, fmt.Sprintf("%s-before", claim.UID)
				switch kind {
				case 7:
					ns, uid = "default", string(claim.UID)
				case 8:
					nm = name + "-gone"
				}
				oid, err := spire.VMID(w.spire.TD, ns, nm, uid)
				if err != nil {
					rt.Fatal(err)
				}
				cert, want = signed(w.spire, oid, later), broker.ReasonNoLiveClaim
			}
			a := w.ask(rt, cert, proof)
			record(a)
			if a.status != wantStatus || a.reason != want {
				rt.Fatalf("stranger %d against claim %s: %d %s, want %d %s", kind, name, a.status, a.reason, wantStatus, want)
			}
		case 5: // the claim ends (as its pool ends it)
			if m.deleted || m.ending {
				continue
			}
			patch := client.RawPatch(k8stypes.MergePatchType, fmt.Appendf(nil, `{"spec":{"end":{"reason":"scaled_down","message":"property 14","requestedAt":%q}}}`,
				time.Now().UTC().Format(time.RFC3339)))
			if err := w.kube.Patch(ctx, claim, patch); err != nil {
				rt.Fatalf("end claim %s: %v", name, err)
			}
			m.ending = true
		case 6: // the claim is deleted (its finalizer holds it)
			if m.deleted {
				continue
			}
			if err := w.kube.Delete(ctx, claim); err != nil {
				rt.Fatalf("delete claim %s: %v", name, err)
			}
			m.deleted = true
		}
	}

	if got := w.runnersMinted() - minted; got != len(credentials) || len(credentials) > 1 {
		rt.Fatalf("claim %s: %d runners registered on GitHub, %d credentials handed out; want at most one, each a runner", name, got, len(credentials))
	}
	latest := &hfv1.MachineClaim{}
	if err := w.kube.Get(ctx, client.ObjectKeyFromObject(claim), latest); err != nil {
		rt.Fatal(err)
	}
	if len(credentials) == 1 {
		cred := credentials[0]
		rc, err := githubsim.DecodeJITConfig(cred.JITConfig)
		b := latest.Status.Bootstrap
		if err != nil || cred.Method != string(hfv1.BootstrapJITConfig) || b == nil || rc.ID != b.RunnerID || rc.Name != b.RunnerName ||
			latest.Status.Identity.CredentialRequestedAt == nil {
			rt.Fatalf("claim %s: the credential (%s, runner %d %q, %v) is not the runner recorded in the claim (%+v)", name, cred.Method, rc.ID, rc.Name, err, b)
		}
		if r, ok := w.gh.Sim.RunnerByName(rc.Name); !ok || r.ID != rc.ID {
			rt.Fatalf("claim %s: runner %q of its credential is not registered as %d on GitHub", name, rc.Name, rc.ID)
		}
	}
	for reason, c := range counts {
		if d := testutil.ToFloat64(metrics.BrokerRequests.WithLabelValues(reason)) - before[reason]; int(d) != c {
			rt.Fatalf("claim %s: %d answers %s, hyperfleet_broker_requests_total counted %v", name, c, reason, d)
		}
	}
	if mis := latest.Status.Identity.Misuse; m.misuse != (mis != nil) || mis != nil && mis.Reason != hfv1.MisuseBrokerProofInvalid {
		rt.Fatalf("claim %s: misuse recorded %+v, want one: %v", name, mis, m.misuse)
	}
	return len(credentials) == 1
}
