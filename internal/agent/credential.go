package agent

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Credential is the single-use runner credential: a JIT configuration, or
// a registration token with the URL it registers to. Its String, GoString
// and LogValue never show the secret.
type Credential struct {
	// Method is jit-config or runner-token.
	Method agentconfig.BootstrapMethod
	// JITConfig is GitHub's encoded JIT runner configuration (jit-config).
	JITConfig string
	// RegistrationToken is a runner registration token (runner-token), a
	// Buildkite agent token (agent-token) or the GitLab runner
	// authentication token of the runner the operator created for this VM
	// (runner-auth-token): every source (guest secrets, broker, secret
	// store) carries the three in one field, registrationToken.
	RegistrationToken string
	// RegistrationURL is the repository or organization URL the runner
	// registers to (runner-token).
	RegistrationURL string
	// Job is the Buildkite job a job acquisition token is for (job-token);
	// empty otherwise.
	Job string
}

// String describes c without its secret.
func (c Credential) String() string {
	return fmt.Sprintf("%s credential (registrationURL %q, secret redacted)", c.Method, c.RegistrationURL)
}

// GoString is String, so %#v does not print the secret either.
func (c Credential) GoString() string { return c.String() }

// LogValue logs c without its secret.
func (c Credential) LogValue() slog.Value {
	return slog.GroupValue(slog.String("method", string(c.Method)), slog.String("registrationURL", c.RegistrationURL))
}

func (c Credential) validate() error {
	spec, ok := agentconfig.LookupMethod(c.Method)
	switch {
	case !ok:
		return fmt.Errorf("the credential source returned a credential of unknown method %q", c.Method)
	case spec.JITConfig && c.JITConfig == "":
		return fmt.Errorf("the credential source returned a %s credential without a JIT configuration", c.Method)
	case spec.CarriesURL && (c.RegistrationToken == "" || c.RegistrationURL == ""):
		return fmt.Errorf("the credential source returned a %s credential without a token or registration URL", c.Method)
	case !spec.JITConfig && c.RegistrationToken == "":
		// The URL (GitLab's instance, Buildkite's agent API endpoint) and
		// a Buildkite job come from the config.
		return fmt.Errorf("the credential source returned a %s credential without a token", c.Method)
	}
	return nil
}

// CredentialSource hands the agent its runner credential, as late as
// possible.
type CredentialSource interface {
	Credential(ctx context.Context) (Credential, error)
}

// UnsupportedError is a mode this agent version does not implement; Run
// exits with ExitUnsupported.
type UnsupportedError struct {
	// What is the mode, such as "workloadMethod broker".
	What string
}

func (e *UnsupportedError) Error() string {
	return e.What + " is not supported by this agent version yet"
}

// NewCredentialSource picks the credential source for cfg: GuestSource
// for workloadMethod direct; for broker, VaultSource when spiffe.secretStore
// names a secrets store, else BrokerSource (always for platform generic,
// whose VM holds its identity rather than fetch a credential with it).
func NewCredentialSource(cfg *agentconfig.Config) (CredentialSource, error) {
	switch cfg.WorkloadMethod {
	case agentconfig.WorkloadDirect:
		return &GuestSource{Method: cfg.BootstrapMethod, File: cfg.SecretsFile, Deadline: cfg.SecretsDeadline, RegistrationURL: cfg.RegistrationURL}, nil
	case agentconfig.WorkloadBroker:
		b := &BrokerSource{Method: cfg.BootstrapMethod, SPIFFE: cfg.SPIFFE, ExpiresAt: cfg.ExpiresAt,
			SecretsFile: cfg.SecretsFile, SecretsDeadline: cfg.SecretsDeadline, Proxy: cfg.Proxy}
		if cfg.Platform == agentconfig.PlatformGeneric {
			// The identity only (IdentityHolder): no credential to read
			// from a store.
			return b, nil
		}
		if s := cfg.SPIFFE; s != nil && s.SecretStore != nil {
			return &VaultSource{Store: *s.SecretStore, SPIRE: b, Proxy: cfg.Proxy}, nil
		}
		return b, nil
	default:
		return nil, &UnsupportedError{What: fmt.Sprintf("workloadMethod %q", cfg.WorkloadMethod)}
	}
}
