package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// The GitHub side of Options.Install: what the samples that
// docs/install.md applies name (config/samples: the template's owner and
// repository, the pool's repository), and the App step 3 has the reader
// create and install on that account.
const (
	// InstallAccount owns the samples' repository (the template's
	// spec.bootstrap.github.owner, the webhook Secret's owner.example).
	InstallAccount = "example"
	// InstallRepository is the samples' repository (the pool's
	// spec.workload.github.repository).
	InstallRepository = InstallAccount + "/hyperfleet"
	// InstallAppID and InstallInstallationID are the App's id and its
	// installation's on InstallAccount, as GitHub's UI shows them.
	InstallAppID          int64 = 424242
	InstallInstallationID int64 = 4242420
)

// InstalledApp is the GitHub App of step 3, as its reader keeps it for
// step 5: the ids and the private key file GitHub's UI generated.
type InstalledApp struct {
	ID, InstallationID int64
	PrivateKeyFile     string
}

// InstallApp is the App step 3 created (Options.Install).
func (w *World) InstallApp() (InstalledApp, error) {
	if !w.opts.Install {
		return InstalledApp{}, errors.New("devenv: InstallApp needs Options.Install")
	}
	return InstalledApp{ID: InstallAppID, InstallationID: InstallInstallationID, PrivateKeyFile: w.appKeyFile()}, nil
}

func (w *World) appKeyFile() string { return filepath.Join(w.opts.Dir, "app.private-key.pem") }

// installApp adds to the GitHub simulator's configuration the samples'
// account and repository and an App installed on the account (with the
// default permissions: administration, self-hosted runners and actions
// write, metadata read; docs/install.md's table), and writes the App's
// private key where InstallApp says.
func (w *World) installApp(cfg *githubsim.Config) error {
	key, err := githubsim.NewAppKey()
	if err != nil {
		return fmt.Errorf("devenv: App key: %w", err)
	}
	if err := os.WriteFile(w.appKeyFile(), key.PrivatePEM, 0o600); err != nil {
		return fmt.Errorf("devenv: App key: %w", err)
	}
	cfg.Users = append(cfg.Users, githubsim.UserConfig{Login: InstallAccount})
	cfg.Repositories = append(cfg.Repositories, githubsim.RepoConfig{Name: InstallRepository})
	cfg.Apps = append(cfg.Apps, githubsim.AppConfig{ID: InstallAppID, PublicKey: key.PublicPEM,
		Installations: []githubsim.InstallationConfig{{ID: InstallInstallationID, Account: InstallAccount}}})
	return nil
}

// PointWebhook subscribes url (the receiver of an operator the test
// installed, an https:// URL ending in /webhooks/github) to the GitHub
// simulator's events with the world's webhook secret (OperatorInputs'
// WebhookSecretData), as step 3 subscribes the App; ConnectOperator does
// the same and then waits for the world's own pool.
func (w *World) PointWebhook(url string) error { return w.pointWebhook(url) }

// WebhookSecret is the secret of the world's webhooks (PointWebhook,
// ConnectOperator): what step 3 sets on the App and step 4 stores.
func (w *World) WebhookSecret() string { return webhookSecret }

// ProxmoxFingerprint is the SHA-256 fingerprint of the Proxmox simulator's
// certificate, as `pvenode cert info` prints it and a HypervisorCluster's
// spec.tls.fingerprintSHA256 pins it.
func (w *World) ProxmoxFingerprint() string { return w.proxmoxFingerprint }

// PointGitLabWebhook makes the receiver at base (https://host:port of an
// operator the test installed) the GitLab group's Job Hook, with the
// token GitLabWebhookToken says (Options.GitLab).
func (w *World) PointGitLabWebhook(base string) error {
	if w.GitLab == nil {
		return errors.New("devenv: PointGitLabWebhook needs Options.GitLab")
	}
	return w.pointGitLabWebhook(base)
}

// GitLabWebhookToken is the secret token of the GitLab group's Job Hook.
func (w *World) GitLabWebhookToken() string { return gitlabWebhookToken }

// PointBuildkiteWebhook makes the receiver at base (https://host:port of
// an operator the test installed) the Buildkite organization's signed
// notification service, with the token BuildkiteWebhookToken says
// (Options.Buildkite).
func (w *World) PointBuildkiteWebhook(base string) error {
	if w.Buildkite == nil {
		return errors.New("devenv: PointBuildkiteWebhook needs Options.Buildkite")
	}
	w.pointBuildkiteWebhook(base)
	return nil
}

// BuildkiteWebhookToken is the token of the Buildkite organization's
// notification service.
func (w *World) BuildkiteWebhookToken() string { return buildkiteWebhookToken }

// BuildkiteAgent is the template's spec.bootstrap.buildkite for the
// simulator (Options.Buildkite): its API and agent endpoints, and the
// agent downloaded from its release tarball.
func (w *World) BuildkiteAgent() (*hfv1.BuildkiteBootstrap, error) { return w.buildkiteBootstrap() }
