package manager

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var lazyEnv testenv.Lazy

func TestMain(m *testing.M) { lazyEnv.Main(m) }

func TestParseWebhookSecrets(t *testing.T) {
	got, err := ParseWebhookSecrets("ns/hook", map[string][]byte{
		"webhook-secret": []byte("fallback"), "owner.Octo-Org": []byte("octo"), "owner.someone": []byte("someone's"), "other": []byte("ignored"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Global) != "fallback" || len(got.Owners) != 2 || string(got.Owners["octo-org"]) != "octo" || string(got.Owners["someone"]) != "someone's" {
		t.Fatalf("parsed %+v", got)
	}
	if got, err := ParseWebhookSecrets("ns/hook", map[string][]byte{"owner.octo-org": []byte("octo")}); err != nil || got.Global != nil || len(got.Owners) != 1 {
		t.Fatalf("owner secrets only: %+v, %v", got, err)
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
			if _, err := ParseWebhookSecrets("ns/hook", tc.data); err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "ns/hook") {
				t.Fatalf("error %v, want one naming ns/hook and saying %q", err, tc.says)
			}
		})
	}
}

// secretEcho is a webhook receiver whose parser reports the secrets it
// was built with, in place of verifying a signature.
type secretEcho struct{}

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
	parser := &rotatingParser{receiver: secretEcho{}}
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
