package main

import (
	"flag"
	"io"
	"testing"

	"github.com/go-logr/logr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testci"
)

// TestWebhookFlagsOfEveryReceiver: the manager binds the webhook flags of
// every registered back-end that receives webhooks, the shipped ones
// under the names their docs and the chart use and a platform registered
// only by a test (internal/testworld/testci) as well, with no edit here;
// and a platform's flags reach its receiver.
func TestWebhookFlagsOfEveryReceiver(t *testing.T) {
	testci.Register()
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	flags, err := bindWebhookFlags(fs)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"github", "gitlab", "buildkite", "testci"} {
		for _, suffix := range []string{"-webhook-secret", "-webhook-allow-fallback-secret", "-webhook-api-host"} {
			if fs.Lookup(name+suffix) == nil {
				t.Errorf("no flag --%s%s", name, suffix)
			}
		}
	}
	if f := fs.Lookup("github-webhook-secret"); f == nil || f.DefValue != "hyperfleet-github-webhook" {
		t.Errorf("--github-webhook-secret's default is not GitHub's Secret: %+v", f)
	}
	if err := fs.Parse([]string{"--testci-webhook-secret=tci-hooks", "--testci-webhook-api-host=testci.example.com", "--testci-webhook-allow-fallback-secret", "--github-webhook-secret="}); err != nil {
		t.Fatal(err)
	}
	var receivers []webhookReceiver
	for _, w := range flags {
		receivers = append(receivers, w.receiver())
	}
	platforms, err := webhookPlatforms(logr.Discard(), "ci", receivers)
	if err != nil {
		t.Fatal(err)
	}
	if len(platforms) != 1 || platforms[0].Platform != testci.Type || platforms[0].SecretRef.Name != "tci-hooks" ||
		platforms[0].APIHost != "testci.example.com" || !platforms[0].AllowSharedSecret {
		t.Fatalf("receivers %+v, want TestCI's alone with its flags' Secret, host and fallback", platforms)
	}
	for _, r := range receivers {
		if r.platform == hfv1.WorkloadGeneric {
			t.Error("generic, which receives no webhooks, has webhook flags")
		}
	}
}
