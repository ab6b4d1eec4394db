package githubsim

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Config describes the simulated GitHub: accounts, repositories, the
// credentials that may call the API, webhook endpoints and limits. It is
// read from YAML or JSON by LoadConfig; field names are the lowerCamel JSON
// names shown in the README.
type Config struct {
	// ServerURL is the simulator's external base URL (https://host:port).
	// It goes into the runners' .runner files and, GitHub Enterprise
	// Server style (API under /api/v3), into the URLs of API objects and
	// webhook payloads. Empty: the runner files use the URL of the request
	// that created them and API objects use api.github.com URLs.
	ServerURL string `json:"serverURL,omitempty"`
	// Organizations are organization accounts.
	Organizations []OrgConfig `json:"organizations,omitempty"`
	// Users are user accounts. Owners of repositories that are neither
	// listed here nor organizations become users implicitly.
	Users []UserConfig `json:"users,omitempty"`
	// Repositories that exist.
	Repositories []RepoConfig `json:"repositories,omitempty"`
	// Enterprises are enterprise accounts over organizations of
	// Organizations.
	Enterprises []EnterpriseConfig `json:"enterprises,omitempty"`
	// PATs are personal access tokens that may call the API.
	PATs []PATConfig `json:"pats,omitempty"`
	// Apps are GitHub Apps with their public keys and installations.
	Apps []AppConfig `json:"apps,omitempty"`
	// Webhooks receive workflow_job deliveries.
	Webhooks []WebhookConfig `json:"webhooks,omitempty"`
	// RateLimit is the hourly request budget of each PAT and installation
	// (5000) unless they set their own.
	RateLimit int `json:"rateLimit,omitempty"`
	// UnauthenticatedRateLimit is the hourly budget per client address of
	// requests without valid credentials (60).
	UnauthenticatedRateLimit int `json:"unauthenticatedRateLimit,omitempty"`
	// HeartbeatTimeout: a connected runner that has not polled for this
	// long is offline, and a job it was running fails (60s).
	HeartbeatTimeout Duration `json:"heartbeatTimeout,omitempty"`
	// EphemeralOfflineRemoval: an ephemeral runner (JIT or --ephemeral)
	// that stays offline this long is removed, as GitHub does after a day
	// (24h).
	EphemeralOfflineRemoval Duration `json:"ephemeralOfflineRemoval,omitempty"`
	// OfflineRemoval: the same for other runners (14 days).
	OfflineRemoval Duration `json:"offlineRemoval,omitempty"`
	// RunnerVersion is the version reported for connected runners.
	RunnerVersion string `json:"runnerVersion,omitempty"`
	// Sender is the login of the user that triggers workflow runs (the
	// webhook sender). It becomes a user account if it is none.
	Sender string `json:"sender,omitempty"`
	// Seed makes generated ids, tokens and probabilistic faults
	// reproducible.
	Seed int64 `json:"seed,omitempty"`
}

// OrgConfig is an organization.
type OrgConfig struct {
	Login string `json:"login"`
	// ID is the account id (generated when zero).
	ID int64 `json:"id,omitempty"`
	// RunnerGroups besides Default (id 1, which always exists).
	RunnerGroups []RunnerGroupConfig `json:"runnerGroups,omitempty"`
}

// RunnerGroupConfig is an organization runner group.
type RunnerGroupConfig struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Visibility is all, selected or private (all).
	Visibility string `json:"visibility,omitempty"`
	// AllowsPublicRepositories as in the runner group settings.
	AllowsPublicRepositories bool `json:"allowsPublicRepositories,omitempty"`
}

// EnterpriseConfig is an enterprise: its slug, its organizations and its
// runner groups besides Default (id 1, which always exists and serves every
// organization of the enterprise).
type EnterpriseConfig struct {
	Slug string `json:"slug"`
	// ID is the enterprise id (generated when zero).
	ID int64 `json:"id,omitempty"`
	// Organizations are the logins of the enterprise's organizations
	// (each one of Config.Organizations).
	Organizations []string `json:"organizations,omitempty"`
	// RunnerGroups are enterprise runner groups besides Default.
	RunnerGroups []EnterpriseRunnerGroupConfig `json:"runnerGroups,omitempty"`
}

// EnterpriseRunnerGroupConfig is an enterprise runner group.
type EnterpriseRunnerGroupConfig struct {
	ID   int64  `json:"id"`
	Name string `json:"name"`
	// Visibility is all (every organization of the enterprise) or
	// selected (SelectedOrganizations only); all when empty.
	Visibility string `json:"visibility,omitempty"`
	// SelectedOrganizations are the organizations a selected group serves.
	SelectedOrganizations []string `json:"selectedOrganizations,omitempty"`
	// AllowsPublicRepositories as in the runner group settings.
	AllowsPublicRepositories bool `json:"allowsPublicRepositories,omitempty"`
}

// UserConfig is a user account.
type UserConfig struct {
	Login string `json:"login"`
	ID    int64  `json:"id,omitempty"`
}

// RepoConfig is a repository.
type RepoConfig struct {
	// Name is owner/name.
	Name string `json:"name"`
	ID   int64  `json:"id,omitempty"`
	// Private repositories are the default, as CI repositories of an
	// organization usually are.
	Private *bool `json:"private,omitempty"`
	// DefaultBranch is the branch workflow runs are on (main).
	DefaultBranch string `json:"defaultBranch,omitempty"`
	// License is an SPDX id (MIT, Apache-2.0, ...) shown in payloads;
	// empty for none (null).
	License     string `json:"license,omitempty"`
	Description string `json:"description,omitempty"`
	// Archived repositories are read-only: they run no workflows.
	Archived bool `json:"archived,omitempty"`
}

// PATConfig is a personal access token.
type PATConfig struct {
	// Token is the secret (ghp_... or github_pat_...).
	Token string `json:"token"`
	// Login is the user it belongs to (becomes a user account).
	Login string `json:"login"`
	// Owners are the organizations, users and enterprises (by slug) whose
	// runners and runs the token may manage; empty means all.
	Owners []string `json:"owners,omitempty"`
	// Scopes are the classic token's OAuth scopes. Only the enterprise
	// runner endpoints check them: they need manage_runners:enterprise (or
	// admin:enterprise), as GitHub's do.
	Scopes []string `json:"scopes,omitempty"`
	// RateLimit overrides Config.RateLimit.
	RateLimit int `json:"rateLimit,omitempty"`
}

// AppConfig is a GitHub App.
type AppConfig struct {
	// ID is the App id (JWT iss as a number or a decimal string).
	ID int64 `json:"id"`
	// ClientID is the App's client id (also accepted as JWT iss).
	ClientID string `json:"clientID,omitempty"`
	// Slug is the App's URL name.
	Slug string `json:"slug,omitempty"`
	// PublicKey is the PEM public key (PKIX or PKCS#1) or certificate that
	// verifies the App's RS256 JWTs. PublicKeyFile reads it from a file.
	PublicKey     string `json:"publicKey,omitempty"`
	PublicKeyFile string `json:"publicKeyFile,omitempty"`
	// Installations of the App.
	Installations []InstallationConfig `json:"installations,omitempty"`
}

// InstallationConfig is an App installation on one account.
type InstallationConfig struct {
	ID int64 `json:"id"`
	// Account is the organization or user the App is installed on.
	Account string `json:"account"`
	// Permissions granted, e.g. {"administration": "write",
	// "organization_self_hosted_runners": "write", "actions": "read"}.
	// Nil grants those three plus metadata: read.
	Permissions map[string]string `json:"permissions,omitempty"`
	// RepositorySelection is all (default) or selected.
	RepositorySelection string `json:"repositorySelection,omitempty"`
	// Repositories (names without owner) when the selection is selected.
	Repositories []string `json:"repositories,omitempty"`
	// RateLimit overrides Config.RateLimit for the installation's tokens.
	RateLimit int `json:"rateLimit,omitempty"`
}

// WebhookConfig is a webhook endpoint receiving workflow_job events.
type WebhookConfig struct {
	// ID is the hook id (X-GitHub-Hook-ID; generated when zero).
	ID int64 `json:"id,omitempty"`
	// URL receives the POSTs.
	URL string `json:"url"`
	// Secret signs the deliveries; SecretFile reads it from a file
	// (trailing newline removed).
	Secret     string `json:"secret,omitempty"`
	SecretFile string `json:"secretFile,omitempty"`
	// Scope limits deliveries to an owner, owner/repo or
	// enterprises/<slug> (the repositories of the enterprise's
	// organizations); empty: all.
	Scope string `json:"scope,omitempty"`
}

// Duration is a time.Duration that reads "5s"/"100ms" or a number of
// seconds from YAML/JSON.
type Duration time.Duration

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a string such as "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON accepts "5s" or seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q", s)
		}
		*d = Duration(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("invalid duration %s", b)
	}
	*d = Duration(f * float64(time.Second))
	return nil
}

// DefaultPAT is the personal access token of DefaultConfig. It is public:
// the default configuration is for local experiments only.
const DefaultPAT = "ghp_simulator0000000000000000000000000"

// DefaultConfig is a small world: organization octo-org (runner groups
// Default and hyperfleet, id 2), repository octo-org/hello-world, user
// octocat with the token DefaultPAT, no Apps, no webhooks.
func DefaultConfig() Config {
	return Config{
		Organizations: []OrgConfig{{Login: "octo-org", ID: 9919, RunnerGroups: []RunnerGroupConfig{{ID: 2, Name: "hyperfleet"}}}},
		Users:         []UserConfig{{Login: "octocat", ID: 583231}},
		Repositories:  []RepoConfig{{Name: "octo-org/hello-world", ID: 1296269, License: "MIT", Description: "My first repository on GitHub!"}},
		PATs:          []PATConfig{{Token: DefaultPAT, Login: "octocat"}},
		Sender:        "octocat",
		Seed:          1,
	}
}

// LoadConfig reads a YAML or JSON file. Top-level fields it sets replace
// those of DefaultConfig (lists are replaced, not merged).
func LoadConfig(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read simulator config %s: %w", path, err)
	}
	cfg := DefaultConfig()
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("parse simulator config %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("simulator config %s: %w", path, err)
	}
	return cfg, nil
}

// loginRE is GitHub's account name syntax (alphanumerics and single
// hyphens, at most 39 characters).
var loginRE = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9]|-[A-Za-z0-9]){0,38}$`)

// repoNameRE is GitHub's repository name syntax.
var repoNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,100}$`)

// Validate reports the first inconsistency in the configuration.
func (c *Config) Validate() error {
	if c.ServerURL != "" {
		u, err := url.Parse(c.ServerURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("serverURL %q must be an absolute http(s) URL", c.ServerURL)
		}
	}
	accounts := map[string]bool{}
	for _, o := range c.Organizations {
		if !loginRE.MatchString(o.Login) {
			return fmt.Errorf("organization login %q is invalid", o.Login)
		}
		if accounts[strings.ToLower(o.Login)] {
			return fmt.Errorf("account %q is defined twice", o.Login)
		}
		accounts[strings.ToLower(o.Login)] = true
		groups := map[int64]bool{1: true}
		for _, g := range o.RunnerGroups {
			if g.ID <= 1 || groups[g.ID] || g.Name == "" || strings.EqualFold(g.Name, "Default") {
				return fmt.Errorf("organization %s: runner group %d %q: ids must be unique and > 1 (1 is Default), names non-empty", o.Login, g.ID, g.Name)
			}
			switch g.Visibility {
			case "", "all", "selected", "private":
			default:
				return fmt.Errorf("organization %s: runner group %q: visibility must be all, selected or private", o.Login, g.Name)
			}
			groups[g.ID] = true
		}
	}
	for _, u := range c.Users {
		if !loginRE.MatchString(u.Login) {
			return fmt.Errorf("user login %q is invalid", u.Login)
		}
		if accounts[strings.ToLower(u.Login)] {
			return fmt.Errorf("account %q is defined twice", u.Login)
		}
		accounts[strings.ToLower(u.Login)] = true
	}
	repos := map[string]bool{}
	for _, r := range c.Repositories {
		owner, name, ok := strings.Cut(r.Name, "/")
		if !ok || !loginRE.MatchString(owner) || !repoNameRE.MatchString(name) {
			return fmt.Errorf("repository %q must be owner/name", r.Name)
		}
		if repos[strings.ToLower(r.Name)] {
			return fmt.Errorf("repository %q is defined twice", r.Name)
		}
		repos[strings.ToLower(r.Name)] = true
	}
	if err := c.validateEnterprises(); err != nil {
		return err
	}
	for i, p := range c.PATs {
		if p.Token == "" || p.Login == "" {
			return fmt.Errorf("pats[%d]: token and login are required", i)
		}
		if !loginRE.MatchString(p.Login) {
			return fmt.Errorf("pats[%d]: login %q is invalid", i, p.Login)
		}
	}
	apps := map[int64]bool{}
	insts := map[int64]bool{}
	for _, a := range c.Apps {
		if a.ID <= 0 || apps[a.ID] {
			return fmt.Errorf("app ids must be positive and unique (%d)", a.ID)
		}
		apps[a.ID] = true
		if a.PublicKey == "" && a.PublicKeyFile == "" {
			return fmt.Errorf("app %d: publicKey or publicKeyFile is required", a.ID)
		}
		for _, in := range a.Installations {
			if in.ID <= 0 || insts[in.ID] {
				return fmt.Errorf("app %d: installation ids must be positive and unique (%d)", a.ID, in.ID)
			}
			insts[in.ID] = true
			if !loginRE.MatchString(in.Account) {
				return fmt.Errorf("installation %d: account %q is invalid", in.ID, in.Account)
			}
			switch in.RepositorySelection {
			case "", "all", "selected":
			default:
				return fmt.Errorf("installation %d: repositorySelection must be all or selected", in.ID)
			}
			for k, v := range in.Permissions {
				if v != "read" && v != "write" && v != "admin" {
					return fmt.Errorf("installation %d: permission %s: %q is not read, write or admin", in.ID, k, v)
				}
			}
		}
	}
	for i, w := range c.Webhooks {
		u, err := url.Parse(w.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("webhooks[%d]: url %q must be an absolute http(s) URL", i, w.URL)
		}
	}
	for _, n := range []int{c.RateLimit, c.UnauthenticatedRateLimit} {
		if n < 0 {
			return fmt.Errorf("rate limits must not be negative")
		}
	}
	return nil
}
