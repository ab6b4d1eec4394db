package agentconfig

import (
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// testCA is a throw-away self-signed CA certificate (no key kept anywhere),
// shared with the cloudinit tests.
var testCA = func() string {
	raw, err := os.ReadFile("../../test/testdata/test-ca.pem")
	if err != nil {
		panic(err)
	}
	return string(raw[strings.Index(string(raw), "-----BEGIN"):])
}()

func directJIT() Config {
	return Config{
		Version:         CurrentVersion,
		Platform:        PlatformGitHubActions,
		WorkloadMethod:  WorkloadDirect,
		BootstrapMethod: BootstrapJITConfig,
		SecretsFile:     SecretsFile,
		SecretsDeadline: time.Date(2025, 6, 1, 12, 30, 0, 0, time.UTC),
		Runner: Runner{
			Name:   "runner-1",
			Labels: []string{"self-hosted", "linux"},
			Software: Software{
				InstallPath: "/opt/actions-runner", WorkDir: "/var/lib/hyperfleet/work",
				ConfigScript: "config.sh", RunScript: "run.sh", OS: "linux", Arch: "x64",
			},
		},
		ExpiresAt:        time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC),
		PowerOffOnFinish: true,
	}
}

func directToken() Config {
	c := directJIT()
	c.BootstrapMethod = BootstrapRunnerToken
	c.RegistrationURL = "https://github.com/octo-org/octo-repo"
	c.Runner.Group = "ci"
	c.Runner.Software.DownloadURL = "https://github.com/actions/runner/releases/download/v2.329.0/actions-runner-linux-x64-2.329.0.tar.gz"
	c.Runner.Software.DownloadSHA256 = strings.Repeat("ab", 32)
	return c
}

func broker() Config {
	c := directJIT()
	c.WorkloadMethod = WorkloadBroker
	c.SPIFFE = &SPIFFE{
		AttestationMethod: AttestationJoinToken,
		SPIFFEID:          "spiffe://hyperfleet.io/vm/ci/runner-1/uid",
		TrustDomain:       "hyperfleet.io",
		TrustBundle:       testCA,
		ServerAddress:     "spire-server.hyperfleet-system.svc:8081",
		BrokerURL:         "https://broker.example.com:8443",
		BrokerCA:          testCA,
	}
	return c
}

func TestValidConfigsRoundTrip(t *testing.T) {
	tpm := broker()
	tpm.SPIFFE.AttestationMethod = AttestationTPM
	tpm.SPIFFE.TPMDevicePath = "/dev/tpmrm0"
	for name, c := range map[string]Config{"direct jit": directJIT(), "direct token": directToken(), "broker join-token": broker(), "broker tpm": tpm} {
		t.Run(name, func(t *testing.T) {
			if err := c.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			b, err := c.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse(Marshal(c)): %v\n%s", err, b)
			}
			if !reflect.DeepEqual(*got, c) {
				t.Errorf("round trip changed the config:\n got %+v\nwant %+v", *got, c)
			}
		})
	}
}

func TestValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   []string
	}{
		{"version", func(c *Config) { c.Version = 2 }, []string{"version: is 2"}},
		{"platform", func(c *Config) { c.Platform = "gitlab" }, []string{"platform:"}},
		{"no secrets file", func(c *Config) { c.SecretsFile = "" }, []string{"secretsFile: is empty; workloadMethod direct needs", "secretsDeadline: is set but secretsFile is empty"}},
		{"secrets file", func(c *Config) { c.SecretsFile = "run/hyperfleet/../x"; c.SecretsDeadline = time.Time{} }, []string{`secretsFile: "run/hyperfleet/../x" must be the absolute path`, "secretsDeadline: is empty"}},
		{"workload method", func(c *Config) { c.WorkloadMethod = "vault" }, []string{`workloadMethod: is "vault"`}},
		{"bootstrap method", func(c *Config) { c.BootstrapMethod = "pat" }, []string{`bootstrapMethod: is "pat"`}},
		{"spiffe with direct", func(c *Config) { c.SPIFFE = broker().SPIFFE }, []string{"spiffe: is set but workloadMethod is direct"}},
		{"label", func(c *Config) { c.Runner.Labels = []string{"a,b"} }, []string{"runner.labels[0]"}},
		{"name", func(c *Config) { c.Runner.Name = "bad name" }, []string{"runner.name"}},
		{"paths", func(c *Config) { c.Runner.Software.InstallPath = "opt"; c.Runner.Software.WorkDir = "" }, []string{"runner.software.installPath", "runner.software.workDir"}},
		{"scripts", func(c *Config) { c.Runner.Software.ConfigScript = "../config.sh" }, []string{"runner.software.configScript"}},
		{"os arch", func(c *Config) { c.Runner.Software.OS = "plan9"; c.Runner.Software.Arch = "mips" }, []string{"runner.software.os", "runner.software.arch"}},
		{"download without sha", func(c *Config) { c.Runner.Software.DownloadURL = "https://example.com/r.tgz" }, []string{"runner.software.downloadSHA256: is empty"}},
		{"download http", func(c *Config) {
			c.Runner.Software.DownloadURL = "http://example.com/r-{os}.tgz"
			c.Runner.Software.DownloadSHA256 = strings.Repeat("A", 64)
		}, []string{"must be an https:// URL", "{os} or {arch}", "64 lower-case hex"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := directJIT()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("Validate accepted an invalid config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestValidateTokenAndBrokerErrors(t *testing.T) {
	c := directToken()
	c.RegistrationURL, c.Runner.Name = "", ""
	err := c.Validate()
	for _, w := range []string{"registrationURL: is empty", "runner.name: is empty"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("runner-token error %v does not mention %q", err, w)
		}
	}

	b := broker()
	b.SecretsFile = ""
	b.SPIFFE.TrustBundle = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
	b.SPIFFE.ServerAddress = "spire"
	b.SPIFFE.BrokerURL = "http://broker"
	b.SPIFFE.SPIFFEID = "spiffe://other.org/vm"
	err = b.Validate()
	for _, w := range []string{"secretsFile: is empty; spiffe.attestationMethod join-token needs", "only CERTIFICATE blocks", "spiffe.serverAddress", "spiffe.brokerURL", "not in trust domain"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("broker error %v does not mention %q", err, w)
		}
	}

	// A join token in the config is refused, whatever else it says: the
	// seed it would be written to can be read off the storage.
	b = broker()
	b.SPIFFE.JoinToken = "9b2f4c1e-7d3a-4f5b-8c6d-1e2f3a4b5c6d"
	err = b.Validate()
	if err == nil || !strings.Contains(err.Error(), "spiffe.joinToken: must not be in the config") || strings.Contains(err.Error(), "9b2f4c1e") {
		t.Errorf("a config with a join token: %v; want it refused, naming the field, the token redacted", err)
	}

	// So is a runner credential, in every mode: the seed is read off the
	// storage before the guest is up.
	for name, c := range map[string]Config{"direct jit": directJIT(), "direct token": directToken(), "broker": broker()} {
		c.JITConfig, c.RegistrationToken = "eyJydW5uZXIiOiJzdG9sZW4ifQ==", "AABBCCDDEEFF0011"
		err := c.Validate()
		for _, w := range []string{"jitConfig: must not be in the config", "registrationToken: must not be in the config", "places it in the running VM at secretsFile"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s with a runner credential: %v; want it refused, mentioning %q", name, err, w)
			}
		}
		if err != nil && (strings.Contains(err.Error(), "eyJydW5u") || strings.Contains(err.Error(), "AABBCCDD")) {
			t.Errorf("%s: the refusal quotes the credential: %v", name, err)
		}
	}

	b = broker()
	b.SPIFFE = nil
	if err := b.Validate(); err == nil || !strings.Contains(err.Error(), "spiffe: is missing") {
		t.Errorf("broker without spiffe: %v", err)
	}
	b = broker()
	b.SPIFFE.BrokerCA = ""
	if err := b.Validate(); err != nil {
		t.Errorf("broker without brokerCA (the system roots): %v", err)
	}
	for bundle, want := range map[string]string{
		"not pem": "spiffe.brokerCA: holds no PEM CERTIFICATE block; it must be the CA bundle of the broker's server certificate",
		"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n": `spiffe.brokerCA: holds a "PRIVATE KEY" PEM block; only CERTIFICATE blocks`,
		testCA + "trailing": "spiffe.brokerCA: has text after the last PEM block",
		"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n": "spiffe.brokerCA: certificate 1 does not parse",
	} {
		b = broker()
		b.SPIFFE.BrokerCA = bundle
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("brokerCA %.20q: %v, want %q", bundle, err, want)
		}
	}

	b = broker()
	b.SPIFFE.TrustBundle = "not pem"
	if err := b.Validate(); err == nil || !strings.Contains(err.Error(), "holds no PEM CERTIFICATE") {
		t.Errorf("bad bundle: %v", err)
	}
}

func TestParseRejectsUnknownAndTrailing(t *testing.T) {
	good, err := func() ([]byte, error) { c := directJIT(); return c.Marshal() }()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Parse(good); err != nil {
		t.Fatalf("Parse(valid): %v", err)
	}
	bad := strings.Replace(string(good), `"version": 1,`, `"version": 1, "jitconfg": "x",`, 1)
	if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Errorf("unknown field accepted: %v", err)
	}
	if _, err := Parse(append(good, []byte("{}")...)); err == nil || !strings.Contains(err.Error(), "after the JSON object") {
		t.Errorf("trailing data accepted: %v", err)
	}
	if _, err := Parse([]byte(`{"version": 1}`)); err == nil {
		t.Error("an incomplete config was accepted")
	}
}

func FuzzParse(f *testing.F) {
	for _, c := range []Config{directJIT(), directToken(), broker()} {
		b, err := c.Marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"version":1,"spiffe":{"trustBundle":"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			return
		}
		// Whatever Parse accepts is valid and survives a round trip.
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config Validate rejects: %v", err)
		}
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Parse(b)
		if err != nil {
			t.Fatalf("re-Parse: %v\n%s", err, b)
		}
		b2, err := c2.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != string(b2) {
			t.Fatalf("round trip changed the config:\n%s\n%s", b, b2)
		}
	})
}

func TestParseGuestSecretsFresh(t *testing.T) {
	doc := `{"jitConfig":"a","fresh":{"time":"2026-11-29T10:00:00.5Z","entropy":"` + strings.Repeat("A", 43) + `="}}`
	g, err := ParseGuestSecrets([]byte(doc))
	if err != nil || g.Fresh == nil || !g.Fresh.Time.Equal(time.Date(2026, 11, 29, 10, 0, 0, 5e8, time.UTC)) || len(g.Fresh.Entropy) != FreshEntropyBytes {
		t.Fatalf("ParseGuestSecrets(%s) = %+v, %v", doc, g, err)
	}
}

func TestParseGuestSecrets(t *testing.T) {
	good := `{"joinToken":"9b2f4c1e-7d3a-4f5b-8c6d-1e2f3a4b5c6d","brokerProof":"pr00f"}`
	g, err := ParseGuestSecrets([]byte(good))
	if err != nil || g.JoinToken != "9b2f4c1e-7d3a-4f5b-8c6d-1e2f3a4b5c6d" || g.BrokerProof != "pr00f" {
		t.Fatalf("ParseGuestSecrets(%s) = %+v, %v", good, g, err)
	}
	// Every prefix of the document is what a reader sees while the guest
	// channel writes it: never taken for a document.
	for i := range len(good) {
		if _, err := ParseGuestSecrets([]byte(good[:i])); err == nil {
			t.Errorf("a document cut at byte %d parsed", i)
		} else if i > 20 && strings.Contains(err.Error(), good[14:i]) {
			t.Errorf("the error quotes the document: %v", err)
		}
	}
	for doc, want := range map[string]GuestSecrets{
		`{"jitConfig":"eyJh"}`: {JITConfig: "eyJh"},
		`{"registrationToken":"AABB","registrationURL":"https://github.com/o","expiresAt":"2025-06-01T13:00:00Z"}`: {
			RegistrationToken: "AABB", RegistrationURL: "https://github.com/o", ExpiresAt: time.Date(2025, 6, 1, 13, 0, 0, 0, time.UTC)},
		`{"enrollmentProof":"e","brokerProof":"p"}`: {EnrollmentProof: "e", BrokerProof: "p"},
	} {
		if g, err := ParseGuestSecrets([]byte(doc)); err != nil || g != want {
			t.Errorf("ParseGuestSecrets(%s) = %+v, %v; want %+v", doc, g, err, want)
		}
	}
	for _, bad := range []string{`{"joinToken":"t"}`, `{"brokerProof":"p"}`, good + `{}`, `{"joinToken":"t","brokerProof":"p","x":1}`,
		`{}`, `{"jitConfig":"a","registrationToken":"b","registrationURL":"https://github.com/o"}`,
		`{"enrollmentProof":"e"}`, `{"joinToken":"t","enrollmentProof":"e","brokerProof":"p"}`,
		// A fresh part the agent could not make the guest fresh from.
		`{"jitConfig":"a","fresh":{"time":"2026-11-29T10:00:00Z","entropy":"AAAA"}}`,
		`{"jitConfig":"a","fresh":{"entropy":"` + strings.Repeat("A", 43) + `="}}`} {
		if _, err := ParseGuestSecrets([]byte(bad)); err == nil {
			t.Errorf("ParseGuestSecrets(%s) accepted it", bad)
		}
	}
}

// TestValidateTPM: attestationMethod tpm needs the TPM device, the broker
// URL (whose host serves the enrollment endpoints, also beside a secrets
// store) and secretsFile (the enrollment and broker proofs); each refusal
// names its field.
func TestValidateTPM(t *testing.T) {
	tpm := func() Config {
		c := broker()
		c.SPIFFE.AttestationMethod = AttestationTPM
		c.SPIFFE.TPMDevicePath = "/dev/tpmrm0"
		return c
	}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no device", func(c *Config) { c.SPIFFE.TPMDevicePath = "" }, "spiffe.tpmDevicePath: is empty; spiffe.attestationMethod tpm needs"},
		{"not a device", func(c *Config) { c.SPIFFE.TPMDevicePath = "/run/tpm.sock" }, `spiffe.tpmDevicePath: "/run/tpm.sock" must be a device path`},
		{"dotdot", func(c *Config) { c.SPIFFE.TPMDevicePath = "/dev/../etc/tpm" }, `spiffe.tpmDevicePath: "/dev/../etc/tpm" must be a device path`},
		{"no broker", func(c *Config) { c.SPIFFE.BrokerURL = "" }, "spiffe.brokerURL: is empty; spiffe.attestationMethod tpm enrolls"},
		{"no broker with store", func(c *Config) {
			c.SPIFFE.BrokerURL = ""
			c.SPIFFE.SecretStore = withSecretStore().SPIFFE.SecretStore
		}, "spiffe.brokerURL: is empty; spiffe.attestationMethod tpm enrolls"},
		{"http broker", func(c *Config) { c.SPIFFE.BrokerURL = "http://broker" }, `spiffe.brokerURL: "http://broker" must be an https:// URL`},
		{"no secrets file", func(c *Config) { c.SecretsFile, c.SecretsDeadline = "", time.Time{} }, "secretsFile: is empty; spiffe.attestationMethod tpm needs"},
		{"no spiffe id", func(c *Config) { c.SPIFFE.SPIFFEID = "" }, "spiffe.spiffeID: is empty; spiffe.attestationMethod tpm names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tpm()
			tc.mutate(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v; want an error with %q", err, tc.want)
			}
		})
	}
	c := tpm()
	c.SPIFFE.SecretStore = withSecretStore().SPIFFE.SecretStore
	if err := c.Validate(); err != nil {
		t.Errorf("tpm with a secrets store and brokerURL (the enrollment host): %v", err)
	}
}
