package agentconfig

import (
	"strings"
	"testing"
)

// canary stands for a credential; tests check that no error shows it.
const canary = "CANARY-cred-5d1e9a"

// TestValidateNeverEchoesCredential: a config that fails validation in
// fields whose values messages quote never shows the credential, wherever
// it was put, nor a URL's user information or query.
func TestValidateNeverEchoesCredential(t *testing.T) {
	cases := map[string]func(*Config){
		"jit-config in the runner name": func(c *Config) {
			c.JITConfig = canary
			c.Runner.Name = "bad name " + canary
		},
		"registration token as a label": func(c *Config) {
			c.BootstrapMethod, c.JITConfig, c.RegistrationToken = BootstrapRunnerToken, "", canary
			c.RegistrationURL = "https://github.com/octo-org"
			c.Runner.Labels = []string{"x," + canary[:12]}
		},
		"credential in a download URL's user information": func(c *Config) {
			c.Runner.Software.DownloadURL = "http://runner:" + canary + "@downloads.example.com/runner.tgz"
			c.Runner.Software.DownloadSHA256 = strings.Repeat("ab", 32)
		},
		"credential in a registration URL's query": func(c *Config) {
			c.RegistrationURL = "http://github.com/octo-org?token=" + canary
		},
		"unparsable URL holding it": func(c *Config) {
			c.RegistrationURL = "https://[" + canary
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := directJIT()
			mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted the config; the test needs a failing one")
			}
			if strings.Contains(err.Error(), canary) || strings.Contains(err.Error(), canary[:12]) {
				t.Errorf("the error shows the credential: %v", err)
			}
		})
	}
}

func TestRedactSecrets(t *testing.T) {
	secret := "0123456789abcdefghij"
	for _, c := range []struct{ in, want string }{
		{"no secret here", "no secret here"},
		{"whole " + secret + " end", "whole [redacted] end"},
		{`starts with "` + secret[:10] + `..."`, `starts with "[redacted]..."`},
		{"tail " + secret[9:], "tail [redacted]"},
		{"short 0123456 stays", "short 0123456 stays"},
	} {
		if got := RedactSecrets(c.in, secret); got != c.want {
			t.Errorf("RedactSecrets(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	if got := RedactSecrets("pin 1234 and 1234", "1234"); got != "pin [redacted] and [redacted]" {
		t.Errorf("a short secret: %q", got)
	}
}
