package manager

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab/gitlabsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var lazyEnv testenv.Lazy

func TestMain(m *testing.M) { lazyEnv.Main(m) }

func TestParseWebhookSecrets(t *testing.T) {
	withFallback := map[string][]byte{
		"webhook-secret": []byte("fallback"), "owner.Octo-Org": []byte("octo"), "owner.someone": []byte("someone's"), "other": []byte("ignored"),
	}
	got, err := ParseWebhookSecrets("ns/hook", withFallback, true)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Global) != "fallback" || len(got.Owners) != 2 || string(got.Owners["octo-org"]) != "octo" || string(got.Owners["someone"]) != "someone's" {
		t.Fatalf("parsed %+v", got)
	}
	// Without the opt-in the fallback is refused, saying why and what to do.
	_, err = ParseWebhookSecrets("ns/hook", withFallback, false)
	if !errors.Is(err, ErrSharedSecretNotAllowed) {
		t.Fatalf("the fallback without the opt-in: %v, want ErrSharedSecretNotAllowed", err)
	}
	for _, says := range []string{"ns/hook", `key webhook-secret`, "owner.<login>", "--github-webhook-allow-fallback-secret", "GitHub App"} {
		if !strings.Contains(err.Error(), says) {
			t.Errorf("the refusal %q does not say %q", err, says)
		}
	}
	for _, allow := range []bool{false, true} {
		if got, err := ParseWebhookSecrets("ns/hook", map[string][]byte{"owner.octo-org": []byte("octo")}, allow); err != nil || got.Global != nil || len(got.Owners) != 1 {
			t.Fatalf("owner secrets only (opt-in %v): %+v, %v", allow, got, err)
		}
	}
	for name, tc := range map[string]struct {
		data map[string][]byte
		says string
	}{
		"no secret at all":      {map[string][]byte{"other": []byte("x")}, `neither key "webhook-secret" nor keys owner.<owner>`},
		"empty fallback":        {map[string][]byte{"webhook-secret": nil, "owner.a": []byte("x")}, `key "webhook-secret" is empty`},
		"empty owner secret":    {map[string][]byte{"owner.a": nil}, `key "owner.a" is empty`},
		"owner key names none":  {map[string][]byte{"owner.": []byte("x")}, `key "owner." names no owner`},
		"one owner in two keys": {map[string][]byte{"owner.a": []byte("x"), "owner.A": []byte("y")}, `owner "a" has more than one key`},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseWebhookSecrets("ns/hook", tc.data, true); err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "ns/hook") {
				t.Fatalf("error %v, want one naming ns/hook and saying %q", err, tc.says)
			}
		})
	}
}

// secretEcho is a webhook receiver whose parser reports the secrets it
// was built with, in place of verifying a signature.
type secretEcho struct{}

func (secretEcho) WebhookFormat() workload.WebhookFormat {
	return workload.WebhookFormat{Platform: "Echo", Label: "echo", Path: "/webhooks/echo", EventHeader: "X-Echo-Event", SignatureHeader: "X-Echo-Token"}
}

func (secretEcho) WebhookParser(global []byte, owners map[string][]byte) workload.WebhookParser {
	return echoParser{global: string(global), owners: len(owners)}
}

type echoParser struct {
	global string
	owners int
}

func (p echoParser) Parse(http.Header, []byte) (workload.JobEvent, error) {
	return workload.JobEvent{Action: p.global}, nil
}

// TestWebhookSecretRotation: the receiver's secrets follow the Secret on
// the API server without a restart: none before it exists (503), its
// content once created, the new content after a rotation, the last valid
// content while an edit is invalid, and none again once it is deleted.
func TestWebhookSecretRotation(t *testing.T) {
	env := lazyEnv.Get(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: "default", Name: "rotation-webhook"}
	parser := &rotatingParser{receiver: secretEcho{}, allowShared: true}
	if err := watchWebhookSecret(ctx, mgr, key, parser); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	want := func(what, global string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ev, err := parser.Parse(nil, nil)
			switch {
			case global == "" && errors.Is(err, workload.ErrWebhookNotConfigured):
				return
			case global != "" && err == nil && ev.Action == global:
				return
			case time.Now().After(deadline):
				t.Fatalf("%s: parser answers %q, %v; want %q", what, ev.Action, err, global)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want("before the Secret exists", "")

	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Data: map[string][]byte{WebhookSecretKey: []byte("first")}}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	want("created", "first")
	s.Data[WebhookSecretKey] = []byte("second")
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	want("rotated", "second")
	s.Data = map[string][]byte{WebhookSecretKey: nil}
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the watch event of the invalid edit is handled
	want("an invalid edit keeps the last valid secret", "second")
	s.Data = map[string][]byte{WebhookSecretKey: []byte("third")}
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	want("fixed", "third")
	if err := env.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	want("deleted", "")
}

// TestMissingWebhookSecretIsLogged: a receiver whose Secret does not exist
// at start refuses deliveries (503) with a pod that is Ready, so the
// manager says so once, naming the platform, the Secret and the command
// that creates it; later reloads of the still missing Secret add nothing.
func TestMissingWebhookSecretIsLogged(t *testing.T) {
	key := types.NamespacedName{Namespace: "hyperfleet-system", Name: "echo-hooks"}
	var logs strings.Builder
	ctx := ctrl.LoggerInto(context.Background(), funcr.New(func(prefix, args string) { logs.WriteString(prefix + " " + args + "\n") }, funcr.Options{}))
	w := &webhookSecretWatcher{reader: fake.NewClientBuilder().Build(), key: key, parser: &rotatingParser{receiver: secretEcho{}}}
	if err := w.reload(ctx, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"The Echo webhook Secret hyperfleet-system/echo-hooks does not exist", "/webhooks/echo",
		"kubectl create secret generic echo-hooks --namespace hyperfleet-system --from-literal=owner.<owner>=<secret>"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log at start lacks %q:\n%s", want, logs.String())
		}
	}
	if _, err := w.parser.Parse(nil, nil); !errors.Is(err, workload.ErrWebhookNotConfigured) {
		t.Errorf("without its Secret the receiver parses deliveries: %v", err)
	}
	logs.Reset()
	if err := w.reload(ctx, false); err != nil {
		t.Fatal(err)
	}
	if logs.Len() > 0 {
		t.Errorf("a reload of the still missing Secret logged again:\n%s", logs.String())
	}
}

// TestSharedWebhookSecretNeedsOptIn: a webhook Secret holding the shared
// fallback secret stops the manager at start unless it was told to accept
// it, with a message that says what to do; accepted, a warning is logged
// and the owners it serves are reported as served by a shared secret. An
// edit that adds the fallback later, without the opt-in, is refused and
// the last valid secrets stay in use.
func TestSharedWebhookSecretNeedsOptIn(t *testing.T) {
	env := lazyEnv.Get(t)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: "default", Name: "shared-webhook"}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Data: map[string][]byte{WebhookSecretKey: []byte("shared"), "owner.acme": []byte("acme's own")}}
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	newMgr := func() ctrl.Manager {
		mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
			Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
		if err != nil {
			t.Fatal(err)
		}
		return mgr
	}

	refused := &rotatingParser{receiver: secretEcho{}, platform: hfv1.WorkloadGitHubActions, source: "Secret " + key.String()}
	err := watchWebhookSecret(ctx, newMgr(), key, refused)
	if !errors.Is(err, ErrSharedSecretNotAllowed) || !strings.Contains(err.Error(), key.String()) || !strings.Contains(err.Error(), AllowSharedSecretFlag) {
		t.Fatalf("start with the fallback and without %s: %v; want a refusal naming the Secret and the flag", AllowSharedSecretFlag, err)
	}

	var logs strings.Builder
	logger := funcr.New(func(prefix, args string) { logs.WriteString(prefix + " " + args + "\n") }, funcr.Options{})
	accepted := &rotatingParser{receiver: secretEcho{}, platform: hfv1.WorkloadGitHubActions, source: "Secret " + key.String(), allowShared: true}
	if err := watchWebhookSecret(ctrl.LoggerInto(ctx, logger), newMgr(), key, accepted); err != nil {
		t.Fatalf("start with the fallback and %s: %v", AllowSharedSecretFlag, err)
	}
	if !strings.Contains(logs.String(), "Warning: the shared fallback webhook secret is accepted") {
		t.Errorf("no warning logged at load:\n%s", logs.String())
	}
	for owner, want := range map[string]controller.WebhookSecretUse{
		"octo-org": {Loaded: true, Shared: true, Source: "Secret default/shared-webhook", OwnKey: "owner.octo-org", SharedKey: "webhook-secret"},
		"ACME":     {Loaded: true, Own: true, Source: "Secret default/shared-webhook", OwnKey: "owner.acme", SharedKey: "webhook-secret"},
	} {
		if got, ok := accepted.WebhookSecretOf(hfv1.WorkloadGitHubActions, "", owner); !ok || got != want {
			t.Errorf("WebhookSecretOf(%s) = %+v, %v; want %+v", owner, got, ok, want)
		}
	}
	if _, ok := accepted.WebhookSecretOf("gitlab-ci", "", "octo-org"); ok {
		t.Error("the receiver answered for another platform's webhooks")
	}

	// Without the opt-in, a valid Secret at start, then an edit adding the
	// fallback: refused, the owner keys stay in use.
	s.Data = map[string][]byte{"owner.acme": []byte("acme's own")}
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	later := &rotatingParser{receiver: secretEcho{}, platform: hfv1.WorkloadGitHubActions, source: "Secret " + key.String()}
	w := &webhookSecretWatcher{reader: env.Client, key: key, parser: later}
	if err := w.reload(ctx, true); err != nil {
		t.Fatal(err)
	}
	s.Data[WebhookSecretKey] = []byte("shared")
	if err := env.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Reconcile(ctx, ctrl.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if got, _ := later.WebhookSecretOf(hfv1.WorkloadGitHubActions, "", "octo-org"); got.Shared || !got.Loaded {
		t.Errorf("after an edit adding the fallback without the opt-in: %+v; want the last valid secrets (no fallback)", got)
	}
}

// TestSharedWebhookSecretOptionNeedsOptIn: secrets given as options (the
// local world's and the tests' operators) follow the same rule: a
// fallback Secret without AllowSharedSecret stops Setup, saying what to
// do; with it, or with owner keys only, the receiver is built and says
// which owners the fallback serves.
func TestSharedWebhookSecretOptionNeedsOptIn(t *testing.T) {
	env := lazyEnv.Get(t)
	ctx := context.Background()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	backends := githubsimtest.Backends(t, nil)
	_, err = webhookParser(ctx, mgr, &WebhookPlatform{Platform: hfv1.WorkloadGitHubActions, Secret: []byte("shared")}, true, backends)
	if !errors.Is(err, ErrSharedSecretNotAllowed) || !strings.Contains(err.Error(), "owner.<login>") {
		t.Fatalf("a fallback Secret without AllowSharedSecret: %v; want ErrSharedSecretNotAllowed saying what to do", err)
	}
	for name, tc := range map[string]struct {
		opts WebhookPlatform
		want controller.WebhookSecretUse
	}{
		"owner key": {WebhookPlatform{Platform: hfv1.WorkloadGitHubActions, OwnerSecrets: map[string][]byte{"Octo-Org": []byte("own")}},
			controller.WebhookSecretUse{Loaded: true, Own: true, Source: "the manager's webhook options", OwnKey: "owner.octo-org", SharedKey: "webhook-secret"}},
		"accepted fallback": {WebhookPlatform{Platform: hfv1.WorkloadGitHubActions, Secret: []byte("shared"), AllowSharedSecret: true},
			controller.WebhookSecretUse{Loaded: true, Shared: true, Source: "the manager's webhook options", OwnKey: "owner.octo-org", SharedKey: "webhook-secret"}},
	} {
		p, err := webhookParser(ctx, mgr, &tc.opts, true, backends)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, ok := p.WebhookSecretOf(hfv1.WorkloadGitHubActions, "", "octo-org"); !ok || got != tc.want {
			t.Errorf("%s: WebhookSecretOf = %+v, %v; want %+v", name, got, ok, tc.want)
		}
	}
}

// echoBackend is a second platform that receives webhooks (secretEcho's
// format and parser); nothing else of it is used.
type echoBackend struct {
	workload.Backend
	secretEcho
}

// TestWebhookParsersPerPlatform: each platform named in the options gets
// its own parser with its own secrets, and the pools of each learn how
// their owners' deliveries are verified from their platform's; a platform
// named twice, or left unnamed among several, is refused.
func TestWebhookParsersPerPlatform(t *testing.T) {
	env := lazyEnv.Get(t)
	ctx := context.Background()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	gh, _ := githubsimtest.Backends(t, nil).For(hfv1.WorkloadGitHubActions)
	backends, err := workload.NewBackends(map[hfv1.WorkloadType]workload.Factory{
		hfv1.WorkloadGitHubActions: func(workload.Dependencies) (workload.Backend, error) { return gh, nil },
		hfv1.WorkloadGitLabCI:      func(workload.Dependencies) (workload.Backend, error) { return echoBackend{}, nil },
	}, workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	parsers, err := newWebhookParsers(ctx, mgr, &WebhookOptions{Platforms: []WebhookPlatform{
		{Platform: hfv1.WorkloadGitHubActions, OwnerSecrets: map[string][]byte{"octo-org": []byte("gh")}},
		{Platform: hfv1.WorkloadGitLabCI, OwnerSecrets: map[string][]byte{"platform/ci": []byte("gl")}},
	}}, backends)
	if err != nil {
		t.Fatal(err)
	}
	if len(parsers) != 2 || len(parsers.byPlatform()) != 2 || parsers[0].receiver.WebhookFormat().Path == parsers[1].receiver.WebhookFormat().Path {
		t.Fatalf("parsers: %d, want 2 at distinct paths", len(parsers))
	}
	for _, tc := range []struct {
		platform hfv1.WorkloadType
		owner    string
		own      bool
	}{
		{hfv1.WorkloadGitHubActions, "octo-org", true},
		{hfv1.WorkloadGitHubActions, "platform/ci", false},
		{hfv1.WorkloadGitLabCI, "platform/ci", true},
		{hfv1.WorkloadGitLabCI, "octo-org", false},
	} {
		use, ok := parsers.WebhookSecretOf(tc.platform, "", tc.owner)
		if !ok || !use.Loaded || use.Own != tc.own {
			t.Errorf("WebhookSecretOf(%s, %s) = %+v, %v; want loaded, own %v", tc.platform, tc.owner, use, ok, tc.own)
		}
	}
	if _, ok := parsers.WebhookSecretOf(hfv1.WorkloadBuildkite, "", "octo-org"); ok {
		t.Error("a platform whose webhooks are not received reported a secret")
	}
	for name, platforms := range map[string][]WebhookPlatform{
		"twice":   {{Platform: hfv1.WorkloadGitLabCI, OwnerSecrets: map[string][]byte{"a": []byte("a")}}, {Platform: hfv1.WorkloadGitLabCI, OwnerSecrets: map[string][]byte{"b": []byte("b")}}},
		"unnamed": {{OwnerSecrets: map[string][]byte{"a": []byte("a")}}, {Platform: hfv1.WorkloadGitLabCI, OwnerSecrets: map[string][]byte{"b": []byte("b")}}},
		"none":    nil,
	} {
		if _, err := newWebhookParsers(ctx, mgr, &WebhookOptions{Platforms: platforms}, backends); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestWebhookSecretOfGitLabGroups: a GitLab pool's owner (a group path)
// is found under its Secret key (owner.<path with .. for />), and a
// subgroup's or project namespace's deliveries count as owner-signed when
// any group above has its own token, as the GitLab parser verifies them;
// the instance (no owner) only ever has the fallback.
func TestWebhookSecretOfGitLabGroups(t *testing.T) {
	backends, err := workload.NewBackends(gitlabsimtest.Workloads(), workload.Dependencies{})
	if err != nil {
		t.Fatal(err)
	}
	be, _ := backends.For(hfv1.WorkloadGitLabCI)
	p := &rotatingParser{receiver: be.(workload.WebhookReceiver), platform: hfv1.WorkloadGitLabCI, source: "Secret ci/gl"}
	secrets, err := ParseWebhookSecrets("ci/gl", map[string][]byte{
		WebhookOwnerKeyPrefix + gitlabsimtest.OwnerKey("Acme/Platform"): []byte("own"), WebhookSecretKey: []byte("shared")}, true)
	if err != nil {
		t.Fatal(err)
	}
	p.set(secrets)
	for _, tc := range []struct {
		owner, key  string
		own, shared bool
	}{
		{"acme/platform", "owner.acme..platform", true, false},
		{"acme/platform/ci/tools", "owner.acme..platform..ci..tools", true, false},
		{"acme", "owner.acme", false, true},
		{"acme/platformx", "owner.acme..platformx", false, true},
		{"", "", false, true},
	} {
		use, ok := p.WebhookSecretOf(hfv1.WorkloadGitLabCI, "", tc.owner)
		if !ok || !use.Loaded || use.OwnKey != tc.key || use.Own != tc.own || use.Shared != tc.shared {
			t.Errorf("WebhookSecretOf(%q) = %+v, %v; want key %q, own %v, shared %v", tc.owner, use, ok, tc.key, tc.own, tc.shared)
		}
	}
}

// TestWebhookHostsChooseTheSecrets: a platform's receiver takes the
// deliveries of each API host it holds secrets for, chosen by the host the
// delivery names (GitHub Enterprise Server's X-GitHub-Enterprise-Host) and
// verified with that host's secrets only; the job is stamped with the host,
// which routing compares with the pools' (internal/demand). A delivery that
// names another host is refused before any secret is tried, and one whose
// header is changed to another host no longer verifies: the header chooses,
// the secret decides.
func TestWebhookHostsChooseTheSecrets(t *testing.T) {
	backends := githubsimtest.Backends(t, nil)
	be, _ := backends.For(hfv1.WorkloadGitHubActions)
	recv := be.(workload.WebhookReceiver)
	parser := func(host, secret string) *rotatingParser {
		p := &rotatingParser{receiver: recv, platform: hfv1.WorkloadGitHubActions, host: host}
		p.set(&WebhookSecrets{Owners: map[string][]byte{"octo-org": []byte(secret)}})
		return p
	}
	hosts := webhookParsers{parser("", "dotcom"), parser("ghes.example.com", "ghes")}.byPlatform()
	if len(hosts) != 1 {
		t.Fatalf("%d receivers for one platform", len(hosts))
	}
	hp := hosts[0]
	body := []byte(`{"action":"queued","workflow_job":{"id":4242,"run_id":1,"labels":["self-hosted"],"status":"queued"},"repository":{"full_name":"octo-org/app","owner":{"login":"octo-org"}}}`)
	deliver := func(hostHeader, secret string) (workload.JobEvent, error) {
		h := http.Header{}
		h.Set("X-GitHub-Event", "workflow_job")
		h.Set("X-GitHub-Delivery", "d-1")
		h.Set("X-Hub-Signature-256", githubsim.SignPayload(secret, body))
		if hostHeader != "" {
			h.Set("X-GitHub-Enterprise-Host", hostHeader)
		}
		return hp.Parse(h, body)
	}
	for _, tc := range []struct {
		name, header, secret string
		host                 string
		err                  error
	}{
		{name: "GitHub.com", secret: "dotcom", host: ""},
		{name: "the Enterprise Server", header: "GHES.example.com", secret: "ghes", host: "ghes.example.com"},
		{name: "GitHub.com's delivery claiming the Enterprise Server", header: "ghes.example.com", secret: "dotcom", err: workload.ErrBadSignature},
		{name: "the Enterprise Server's delivery claiming GitHub.com", secret: "ghes", err: workload.ErrBadSignature},
		{name: "a host without secrets", header: "evil.example.net", secret: "dotcom", err: workload.ErrUnknownHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ev, err := deliver(tc.header, tc.secret)
			switch {
			case tc.err != nil && !errors.Is(err, tc.err):
				t.Fatalf("err = %v, want %v", err, tc.err)
			case tc.err == nil && err != nil:
				t.Fatal(err)
			case tc.err == nil && ev.Job.Host != tc.host:
				t.Fatalf("job stamped with host %q, want %q", ev.Job.Host, tc.host)
			}
		})
	}
	// One host only: a delivery naming none is that host's (a Buildkite
	// receiver, a test world's simulator); one naming another is not.
	only := webhookParsers{parser("ghes.example.com", "ghes")}.byPlatform()[0]
	hp = only
	if ev, err := deliver("", "ghes"); err != nil || ev.Job.Host != "ghes.example.com" {
		t.Fatalf("a delivery naming no host to a one-host receiver: %+v, %v", ev.Job, err)
	}
	if _, err := deliver("other.example.com", "ghes"); !errors.Is(err, workload.ErrUnknownHost) {
		t.Fatalf("a delivery naming another host to a one-host receiver: %v", err)
	}
	// Pools learn how their owner's deliveries are verified per host.
	ps := webhookParsers{parser("", "dotcom")}
	if _, ok := ps.WebhookSecretOf(hfv1.WorkloadGitHubActions, "ghes.example.com", "octo-org"); ok {
		t.Error("a host the receiver holds no secrets for reported a secret")
	}
}
