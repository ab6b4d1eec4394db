package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

func TestCheckMaxEventAge(t *testing.T) {
	for d, ok := range map[time.Duration]bool{time.Minute: true, 15 * time.Minute: true, 16 * time.Minute: false, 0: false, -time.Second: false} {
		if err := checkMaxEventAge(d); (err == nil) != ok {
			t.Errorf("checkMaxEventAge(%s) = %v", d, err)
		} else if err != nil && !strings.Contains(err.Error(), "--webhook-max-event-age") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}

func TestCheckScriptUser(t *testing.T) {
	for name, ok := range map[string]bool{"runner": true, "_ci": true, "ci-user_2": true, "": false, "Runner": false, "root:x": false, "1ci": false, strings.Repeat("a", 33): false} {
		if err := checkScriptUser(name); (err == nil) != ok {
			t.Errorf("checkScriptUser(%q) = %v", name, err)
		} else if err != nil && !strings.Contains(err.Error(), "--generic-script-user") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}

// TestWebhookPlatforms: a platform's receiver runs only when its Secret is
// named, so a GitLab- or Buildkite-only receiver (--github-webhook-secret
// empty) does not wait for a GitHub Secret; a receiver left with no
// platform is refused with a message that says how to turn it off.
func TestWebhookPlatforms(t *testing.T) {
	receivers := func(github, gitlab string) []webhookReceiver {
		return []webhookReceiver{
			{platform: hfv1.WorkloadGitHubActions, secret: github},
			{platform: hfv1.WorkloadGitLabCI, secret: gitlab, allowFallback: true, apiHost: "gitlab.example.com"},
		}
	}
	for _, c := range []struct {
		name, github, gitlab string
		want                 []hfv1.WorkloadType
	}{
		{"GitHub", "hyperfleet-github-webhook", "", []hfv1.WorkloadType{hfv1.WorkloadGitHubActions}},
		{"GitHub and GitLab", "hyperfleet-github-webhook", "gitlab-hooks", []hfv1.WorkloadType{hfv1.WorkloadGitHubActions, hfv1.WorkloadGitLabCI}},
		{"GitLab only", "", "gitlab-hooks", []hfv1.WorkloadType{hfv1.WorkloadGitLabCI}},
		{"none", "", "", nil},
	} {
		got, err := webhookPlatforms(logr.Discard(), "ci", receivers(c.github, c.gitlab))
		var types []hfv1.WorkloadType
		for _, p := range got {
			types = append(types, p.Platform)
			if p.SecretRef == nil || p.SecretRef.Namespace != "ci" || p.SecretRef.Name == "" {
				t.Errorf("%s: platform %s reads Secret %v, want a Secret in namespace ci", c.name, p.Platform, p.SecretRef)
			}
			if p.Platform == hfv1.WorkloadGitLabCI && (!p.AllowSharedSecret || p.APIHost != "gitlab.example.com") {
				t.Errorf("%s: GitLab's flags are lost: %+v", c.name, p)
			}
		}
		if !slices.Equal(types, c.want) {
			t.Errorf("%s: platforms %v, want %v", c.name, types, c.want)
		}
		if (err != nil) != (c.want == nil) {
			t.Errorf("%s: error %v", c.name, err)
		} else if err != nil && !strings.Contains(err.Error(), "--webhook-bind-address=0") {
			t.Errorf("%s: the error does not say how to turn the receiver off: %v", c.name, err)
		}
	}
}

// TestMissingWebhookCertificate: a receiver started without its
// certificate (the pod not Ready meanwhile) names the Secret to create and
// how to run without a receiver; with the certificate there it says
// nothing.
func TestMissingWebhookCertificate(t *testing.T) {
	dir := t.TempDir()
	msg := missingWebhookCertificate(dir, "ci-infra")
	for _, want := range []string{dir, "not Ready", "kubectl create secret tls hyperfleet-webhook-tls --namespace ci-infra", "webhook.enabled=false"} {
		if !strings.Contains(msg, want) {
			t.Errorf("without a certificate the message lacks %q: %s", want, msg)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), []byte("PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	if msg := missingWebhookCertificate(dir, "ci-infra"); msg != "" {
		t.Errorf("with a certificate: %s", msg)
	}
}
