// Package vault is the secretstore back-end for HashiCorp Vault and OpenBao
// (one API; the client is OpenBao's, which speaks to both): for each VM it
// writes the runner credential to the KV version 2 engine and creates the
// JWT auth role the VM logs in with, bound to the VM's SPIFFE ID.
//
//	<kvMount>/data/<pathPrefix>/<trust domain>/vm/<namespace>/<claim>/<uid>
//	auth/<authMount>/role/<uid>
//
// Why a role per VM: a Vault policy can confine a token to one path only
// through an identity template, and the JWT auth method's entity alias is
// named after the whole sub claim (spiffe://...), which no path holds. The
// alias metadata holds the role name, though, so one templated policy
// (docs/secrets-store.md) lets the token of role <uid> read and delete only
// the secret whose last segment is <uid>, and the role's bound_subject lets
// only the VM with that SPIFFE ID log in with it.
package vault

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	bao "github.com/openbao/openbao/api/v2"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/pkg/errclass"
)

// Config says where the store is and how the operator authenticates.
type Config struct {
	// Address is the server's URL, such as https://vault.example.com:8200.
	Address string
	// CABundle is the PEM CA bundle the server's certificate chains to;
	// empty means the system's roots.
	CABundle []byte
	// KVMount is the KV version 2 mount, such as secret.
	KVMount string
	// PathPrefix is the path under KVMount all credentials live under, such
	// as hyperfleet.
	PathPrefix string
	// AuthMount is the JWT auth mount the VMs log in at, such as jwt.
	AuthMount string
	// Audience is the JWT-SVID audience every VM role is bound to.
	Audience string
	// VMPolicy is the policy each VM role's tokens get: the templated policy
	// that grants read and delete of the VM's own secret.
	VMPolicy string
	// VMTokenTTL is the lease of a VM's login token; zero means 5 minutes,
	// enough to read and delete one secret.
	VMTokenTTL time.Duration
	// Token is the operator's own Vault token. Token or TokenFunc is
	// required.
	Token string
	// TokenFunc, when set, is asked for the token before each call (a token
	// read from a Secret that is rotated); it wins over Token.
	TokenFunc func(ctx context.Context) (string, error)
	// HTTPClient replaces the client's transport (tests); CABundle is then
	// ignored.
	HTTPClient *http.Client
}

// Store is a secretstore.Store on Vault or OpenBao.
type Store struct {
	cfg    Config
	client *bao.Client
}

var _ secretstore.Store = (*Store)(nil)

// New checks cfg and builds the client. It does not contact the server.
func New(cfg Config) (*Store, error) {
	if err := cfg.validate(); err != nil {
		return nil, errclass.Errorf(errclass.ClassConfiguration, "SecretStoreConfig", "secret store: %w", err)
	}
	bc := bao.DefaultConfig()
	if bc.Error != nil {
		return nil, fmt.Errorf("secret store client defaults: %w", bc.Error)
	}
	bc.Address = cfg.Address
	// The client's own retries would hide a conflict's status behind
	// repeated writes; the caller's requeue is the retry.
	bc.MaxRetries = 0
	bc.Timeout = 30 * time.Second
	if cfg.HTTPClient != nil {
		bc.HttpClient = cfg.HTTPClient
	} else if len(cfg.CABundle) > 0 {
		if err := bc.ConfigureTLS(&bao.TLSConfig{CACertBytes: cfg.CABundle}); err != nil {
			return nil, errclass.Errorf(errclass.ClassConfiguration, "SecretStoreConfig", "secret store CA bundle: %w", err)
		}
	}
	client, err := bao.NewClient(bc)
	if err != nil {
		return nil, fmt.Errorf("secret store client: %w", err)
	}
	// NewClient takes a token from the environment (BAO_TOKEN,
	// VAULT_TOKEN); the operator's token comes from cfg only.
	client.ClearToken()
	if cfg.VMTokenTTL == 0 {
		cfg.VMTokenTTL = 5 * time.Minute
	}
	return &Store{cfg: cfg, client: client}, nil
}

func (c *Config) validate() error {
	var errs []error
	if c.Address == "" {
		errs = append(errs, errors.New("address is empty; set the Vault or OpenBao URL, such as https://vault.example.com:8200"))
	}
	for _, f := range []struct{ name, value string }{
		{"KV mount", c.KVMount}, {"path prefix", c.PathPrefix}, {"auth mount", c.AuthMount}, {"VM policy", c.VMPolicy},
	} {
		if why := agentconfig.CheckStorePath(f.value); why != "" {
			errs = append(errs, fmt.Errorf("%s %q %s", f.name, f.value, why))
		}
	}
	if c.Audience == "" {
		errs = append(errs, errors.New("audience is empty; set the JWT-SVID audience the VM roles are bound to"))
	}
	if c.Token == "" && c.TokenFunc == nil {
		errs = append(errs, errors.New("no operator token; give the operator's Vault token"))
	}
	return errors.Join(errs...)
}

// RoleName is the JWT auth role of the VM whose SPIFFE ID is id: its UID.
func RoleName(id spiffeid.ID) (string, error) {
	vm, err := secretstore.ParseVMID(id)
	if err != nil {
		return "", err
	}
	return vm.UID, nil
}

// paths returns where the VM whose SPIFFE ID is id has its credential (in
// the KV mount) and its login role, once the store's own token is valid:
// what Put writes and Delete removes.
func (s *Store) paths(ctx context.Context, id spiffeid.ID) (credPath, rolePath string, err error) {
	credPath, err = secretstore.Path(s.cfg.PathPrefix, id)
	if err != nil {
		return "", "", err
	}
	role, err := RoleName(id)
	if err != nil {
		return "", "", err
	}
	if err := s.useToken(ctx); err != nil {
		return "", "", err
	}
	return credPath, "auth/" + s.cfg.AuthMount + "/role/" + role, nil
}

// Put writes cred with check-and-set 0 (create only), then the VM's login
// role. A credential already stored for id is secretstore.ErrExists.
func (s *Store) Put(ctx context.Context, id spiffeid.ID, cred secretstore.Credential) error {
	if err := cred.Validate(); err != nil {
		return errclass.Errorf(errclass.ClassPermanent, "InvalidCredential", "credential for %s: %w", id, err)
	}
	p, rolePath, err := s.paths(ctx, id)
	if err != nil {
		return err
	}
	data := map[string]any{"method": string(cred.Method)}
	for k, v := range map[string]string{"jitConfig": cred.JITConfig, "registrationToken": cred.RegistrationToken, "registrationURL": cred.RegistrationURL} {
		if v != "" {
			data[k] = v
		}
	}
	if _, err := s.client.KVv2(s.cfg.KVMount).Put(ctx, p, data, bao.WithCheckAndSet(0)); err != nil {
		return classify(err, fmt.Sprintf("writing the credential for %s to %s/data/%s", id, s.cfg.KVMount, p))
	}
	// Every parameter is a string (lists comma-separated), so that the
	// operator's policy can pin each value with allowed_parameters, which
	// compares strings only (docs/secrets-store.md).
	_, err = s.client.Logical().WriteWithContext(ctx, rolePath, map[string]any{
		"role_type":       "jwt",
		"user_claim":      "sub",
		"bound_subject":   id.String(),
		"bound_audiences": s.cfg.Audience,
		"token_policies":  s.cfg.VMPolicy,
		// The token does exactly what the VM needs: one read and one
		// delete, and nothing the default policy would allow.
		"token_no_default_policy": "true",
		"token_num_uses":          "2",
		"token_ttl":               strconv.Itoa(int(s.cfg.VMTokenTTL / time.Second)),
	})
	if err != nil {
		return classify(err, fmt.Sprintf("creating the login role %s for %s", rolePath, id))
	}
	return nil
}

// Delete removes the credential (all versions and metadata) and the VM's
// login role; either already gone is success.
func (s *Store) Delete(ctx context.Context, id spiffeid.ID) error {
	p, rolePath, err := s.paths(ctx, id)
	if err != nil {
		return err
	}
	if err := s.client.KVv2(s.cfg.KVMount).DeleteMetadata(ctx, p); err != nil && !isNotFound(err) {
		return classify(err, fmt.Sprintf("deleting the credential for %s at %s/metadata/%s", id, s.cfg.KVMount, p))
	}
	if _, err := s.client.Logical().DeleteWithContext(ctx, rolePath); err != nil && !isNotFound(err) {
		return classify(err, fmt.Sprintf("deleting the login role %s for %s", rolePath, id))
	}
	return nil
}

func (s *Store) useToken(ctx context.Context) error {
	tok := s.cfg.Token
	if s.cfg.TokenFunc != nil {
		var err error
		if tok, err = s.cfg.TokenFunc(ctx); err != nil {
			return fmt.Errorf("getting the operator's secret store token: %w", err)
		}
	}
	if tok == "" {
		return fmt.Errorf("the operator's secret store token is empty: %w", secretstore.ErrDenied)
	}
	s.client.SetToken(tok)
	return nil
}

// casMismatch is the KV engine's refusal of a check-and-set write.
const casMismatch = "check-and-set parameter did not match the current version"

// classify wraps err, saying what was being done, with the class its
// status calls for.
func classify(err error, doing string) error {
	var re *bao.ResponseError
	if !errors.As(err, &re) {
		return fmt.Errorf("%s: %w", doing, err)
	}
	switch {
	case re.StatusCode == http.StatusBadRequest && containsError(re, casMismatch):
		return fmt.Errorf("%s: %w (%w)", doing, secretstore.ErrExists, err)
	case re.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%s: %w: check the operator's token and that its policy allows this path (%w)", doing, secretstore.ErrDenied, err)
	case re.StatusCode >= 500 || re.StatusCode == http.StatusTooManyRequests:
		return errclass.Errorf(errclass.ClassTransient, "SecretStoreUnavailable", "%s: %w", doing, err)
	default:
		return errclass.Errorf(errclass.ClassConfiguration, "SecretStoreRejected", "%s: %w", doing, err)
	}
}

func containsError(re *bao.ResponseError, msg string) bool {
	for _, e := range re.Errors {
		if e == msg {
			return true
		}
	}
	return false
}

func isNotFound(err error) bool {
	var re *bao.ResponseError
	return errors.As(err, &re) && re.StatusCode == http.StatusNotFound
}
