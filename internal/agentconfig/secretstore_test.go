package agentconfig

import (
	"errors"
	"strings"
	"testing"
)

func withSecretStore() Config {
	c := broker()
	c.SPIFFE.BrokerURL = ""
	c.SPIFFE.SecretStore = &SecretStore{
		Address:   "https://vault.example.com:8200",
		CABundle:  testCA,
		AuthMount: "jwt",
		Role:      "0b7f3c2e-1d2a-4f5b-9c8d-7e6f5a4b3c2d",
		Audience:  "hyperfleet-secret-store",
		KVMount:   "secret",
		Path:      "hyperfleet/hyperfleet.io/vm/ci/runner-1/0b7f3c2e-1d2a-4f5b-9c8d-7e6f5a4b3c2d",
	}
	return c
}

func TestSecretStoreRoundTrip(t *testing.T) {
	c := withSecretStore()
	b, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, b)
	}
	if *got.SPIFFE.SecretStore != *c.SPIFFE.SecretStore || strings.Contains(string(b), "brokerURL") {
		t.Fatalf("round trip: %+v\n%s", got.SPIFFE.SecretStore, b)
	}
}

func TestSecretStoreErrors(t *testing.T) {
	c := withSecretStore()
	c.SPIFFE.BrokerURL = "https://broker.example.com"
	s := c.SPIFFE.SecretStore
	s.Address = "http://vault.example.com/v1"
	s.CABundle = "not PEM"
	s.AuthMount = "/jwt"
	s.Role = "-role"
	s.Audience = ""
	s.KVMount = "secret/../sys"
	s.Path = ""
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		"spiffe.brokerURL: is set but so is spiffe.secretStore",
		`spiffe.secretStore.address: "http://vault.example.com/v1" must be the https:// URL`,
		"spiffe.secretStore.caBundle: holds no PEM CERTIFICATE block; it must be the CA bundle the Vault server's certificate chains to in PEM; leave it empty",
		`spiffe.secretStore.authMount: "/jwt" must be a relative path`,
		`spiffe.secretStore.kvMount: "secret/../sys" must not contain a '.' or '..' segment`,
		`spiffe.secretStore.path: "" must be a relative path`,
		`spiffe.secretStore.role: "-role" is not a Vault role name`,
		`spiffe.secretStore.audience: "" must be the audience`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}

	// Without a secret store, the broker URL is required and the message
	// says there is another way.
	c = broker()
	c.SPIFFE.BrokerURL = ""
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "or set spiffe.secretStore") {
		t.Fatalf("no broker, no store: %v", err)
	}
}

func TestStoredCredentialValidate(t *testing.T) {
	for _, tc := range []struct {
		c    StoredCredential
		want string
	}{
		{StoredCredential{Method: BootstrapJITConfig, JITConfig: "x"}, ""},
		{StoredCredential{Method: BootstrapRunnerToken, RegistrationToken: "t", RegistrationURL: "https://github.com/o"}, ""},
		{StoredCredential{Method: BootstrapJITConfig}, "jitConfig: is empty"},
		{StoredCredential{Method: BootstrapJITConfig, JITConfig: "x", RegistrationToken: "t"}, "registrationToken: is set"},
		{StoredCredential{Method: BootstrapRunnerToken, RegistrationToken: "t"}, "registrationURL: "},
		{StoredCredential{Method: "password"}, `method: is "password"`},
	} {
		err := tc.c.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%v) = %v, want %q", tc.c, err, tc.want)
		}
	}
	secret := StoredCredential{Method: BootstrapJITConfig, JITConfig: "very-secret-jit"}
	for _, s := range []string{secret.String(), secret.GoString(), errors.New(secret.String()).Error()} {
		if strings.Contains(s, "very-secret") {
			t.Fatalf("%q shows the secret", s)
		}
	}
}
