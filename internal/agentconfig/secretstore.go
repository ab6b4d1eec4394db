package agentconfig

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// SecretStore is where a VM with a SPIFFE identity reads its runner
// credential instead of asking the operator's broker: a Vault or OpenBao
// server. The agent logs in with a JWT-SVID (Vault's JWT auth method), reads
// the KV version 2 secret at path once and deletes it. Nothing here is
// secret: the VM's identity is its SVID, not a token in this file.
type SecretStore struct {
	// address is the https:// URL of the Vault or OpenBao server, such as
	// https://vault.example.com:8200.
	Address string `json:"address"`

	// caBundle is the PEM-encoded CA bundle the server's certificate chains
	// to. Optional: empty means the system's roots.
	CABundle string `json:"caBundle,omitempty"`

	// authMount is where the JWT auth method is mounted, such as jwt (the
	// login path is auth/<authMount>/login).
	AuthMount string `json:"authMount"`

	// role is the JWT auth role the VM logs in with; it is bound to the VM's
	// SPIFFE ID.
	Role string `json:"role"`

	// audience is the audience of the JWT-SVID the agent presents; the
	// role's bound_audiences must contain it.
	Audience string `json:"audience"`

	// kvMount is where the KV version 2 secrets engine is mounted, such as
	// secret.
	KVMount string `json:"kvMount"`

	// path is the secret's path inside kvMount, such as
	// hyperfleet/hyperfleet.io/vm/ci/runner-abc/<uid>.
	Path string `json:"path"`
}

var (
	// storePathRE is a relative path of plain segments: Vault's mount
	// points and KV paths are case-sensitive names joined by "/".
	storePathRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$`)
	// roleNameRE is Vault's role name pattern (framework.GenericNameRegex).
	roleNameRE = regexp.MustCompile(`^\w([\w.-]*\w)?$`)
)

// CheckStorePath reports why p is not a relative path of plain segments
// (letters, digits, '_', '.', '-', never "." or ".."); empty when it is.
func CheckStorePath(p string) string {
	if !storePathRE.MatchString(p) {
		return "must be a relative path of letters, digits, '_', '.' and '-' joined by '/'"
	}
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return "must not contain a '.' or '..' segment"
		}
	}
	return ""
}

func (s *SecretStore) validate(bad func(field, format string, args ...any)) {
	if u, err := url.Parse(s.Address); err != nil || u.Scheme != "https" || u.Host == "" || u.Path != "" && u.Path != "/" {
		bad("spiffe.secretStore.address", "%q must be the https:// URL of the Vault or OpenBao server, such as https://vault.example.com:8200", shownURL(s.Address, u, err))
	}
	if s.CABundle != "" {
		if err := CheckPEMBundle(s.CABundle, "the CA bundle the Vault server's certificate chains to"); err != nil {
			bad("spiffe.secretStore.caBundle", "%v; leave it empty to trust the system's roots", err)
		}
	}
	for _, f := range []struct{ name, value, example string }{
		{"authMount", s.AuthMount, "jwt"},
		{"kvMount", s.KVMount, "secret"},
		{"path", s.Path, "hyperfleet/hyperfleet.io/vm/ci/runner-abc/<uid>"},
	} {
		if why := CheckStorePath(f.value); why != "" {
			bad("spiffe.secretStore."+f.name, "%q %s, such as %s", f.value, why, f.example)
		}
	}
	if !roleNameRE.MatchString(s.Role) {
		bad("spiffe.secretStore.role", "%q is not a Vault role name: letters, digits, '_', '.' and '-', starting and ending with a letter, digit or '_'", s.Role)
	}
	if s.Audience == "" || strings.ContainsAny(s.Audience, " \t\r\n") {
		bad("spiffe.secretStore.audience", "%q must be the audience the JWT auth role is bound to, such as hyperfleet-secret-store (no white space)", s.Audience)
	}
}

// StoredCredential is the document the operator writes to the secret store
// for one VM and the agent reads from it: the KV secret's data. Its String
// and GoString never show the secret.
type StoredCredential struct {
	// method is jit-config, runner-token, agent-token or
	// runner-auth-token.
	Method BootstrapMethod `json:"method"`
	// jitConfig is GitHub's encoded JIT runner configuration (jit-config).
	JITConfig string `json:"jitConfig,omitempty"`
	// registrationToken is a runner registration token (runner-token),
	// a Buildkite agent token (agent-token) or a GitLab runner
	// authentication token (runner-auth-token).
	RegistrationToken string `json:"registrationToken,omitempty"`
	// registrationURL is the URL the runner registers to (runner-token).
	RegistrationURL string `json:"registrationURL,omitempty"`
	// job is the Buildkite job (UUID) a job acquisition token is for
	// (job-token); empty for every other method.
	Job string `json:"job,omitempty"`
}

// Validate reports what makes c unusable for its method, naming the JSON
// field.
func (c StoredCredential) Validate() error {
	var errs []error
	spec, ok := LookupMethod(c.Method)
	switch {
	case !ok:
		errs = append(errs, fmt.Errorf("method: is %q; must be one of %q", c.Method, registeredMethods()))
	case spec.JITConfig:
		if c.JITConfig == "" {
			errs = append(errs, fmt.Errorf("jitConfig: is empty; method %s needs %s", c.Method, spec.Secret))
		}
		if c.RegistrationToken != "" {
			errs = append(errs, fmt.Errorf("registrationToken: is set but method is %s; remove it", c.Method))
		}
	default:
		if c.RegistrationToken == "" {
			errs = append(errs, fmt.Errorf("registrationToken: is empty; method %s needs %s", c.Method, spec.Secret))
		}
		if c.JITConfig != "" {
			errs = append(errs, fmt.Errorf("jitConfig: is set but method is %s; remove it", c.Method))
		}
	}
	if spec.CarriesURL {
		if err := checkHTTPSURL(c.RegistrationURL); err != nil {
			errs = append(errs, fmt.Errorf("registrationURL: %w", err))
		}
	}
	return errors.Join(errs...)
}

// String describes c without its secret.
func (c StoredCredential) String() string {
	return fmt.Sprintf("%s credential (registrationURL %q, secret redacted)", c.Method, c.RegistrationURL)
}

// GoString is String, so %#v does not print the secret either.
func (c StoredCredential) GoString() string { return c.String() }
