package extdns

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBuildRefusesWhatItDoesNotLink: the test world's external-dns links
// only the rfc2136 provider and the txt and noop registries
// (hack/external-dns/_overlay); asked for another, it must fail at start,
// naming the flag, rather than run with something else. The fake source
// needs no API server, so the run reaches the provider and the registry.
// TestExternalDNSRegistration (internal/controller) runs the linked ones
// against a real BIND.
func TestBuildRefusesWhatItDoesNotLink(t *testing.T) {
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"provider", []string{"--provider=aws"}, "--provider=aws: this build of external-dns"},
		{"registry", []string{"--provider=rfc2136", "--rfc2136-host=127.0.0.1", "--rfc2136-port=53", "--rfc2136-zone=example.org", "--rfc2136-insecure", "--registry=dynamodb"}, "--registry=dynamodb: this build of external-dns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			args := append([]string{"--source=fake", "--metrics-address=127.0.0.1:0", "--once"}, tc.args...)
			out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
			if err == nil {
				t.Fatalf("external-dns %s exited 0; want a refusal naming the flag:\n%s", strings.Join(args, " "), out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("external-dns %s failed (%v) without %q:\n%s", strings.Join(args, " "), err, tc.want, out)
			}
		})
	}
}
