// Package devenv runs HyperFleet's embedded world on one machine: a real
// kube-apiserver and etcd, the Proxmox VE and GitHub simulators, the
// operator, and simulated VMs whose guest program is the real
// hyperfleet-agent binary running against the NoCloud ISO the operator
// attached. cmd/hyperfleet-dev (`make dev`) and the end-to-end tests both
// use it, so what a newcomer sees is what CI proves.
//
// Everything listens on loopback. The world is one organization (octo-org)
// with one repository (octo-org/app), one HypervisorCluster, one template
// and one RunnerPool whose runners carry the label JobLabel; jobs queued
// with EnqueueJobs reach the operator as workflow_job webhooks. With
// Options.Platform buildkite the template and pool are Buildkite's (a
// cluster queue named JobLabel) and QueueJobs creates builds instead; with
// gitlab-ci they are GitLab's (runners tagged JobLabel) and QueueJobs
// creates pipelines.
package devenv

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/guestnet"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload/generic"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// Names of the world's objects and accounts.
const (
	// Namespace holds the template, the pool and its claims.
	Namespace = "ci"
	// PoolName is the RunnerPool.
	PoolName = "runners"
	// TemplateName is the HypervisorMachineTemplate.
	TemplateName = "debian-runner"
	// IPPoolName is the IPPool of Options.IPPool.
	IPPoolName = "guests"
	// IPv6PoolName is the IPPool of Options.IPv6Pool.
	IPv6PoolName = "guests-v6"
	// ClusterName is the HypervisorCluster (the Proxmox simulator).
	ClusterName = "local-pve"
	// Organization and Repository are the GitHub account and repository.
	Organization = "octo-org"
	Repository   = "octo-org/app"
	// JobLabel is the runs-on label of the pool's runners and of the jobs.
	JobLabel = "hyperfleet"
	// TrustDomain is the SPIRE trust domain with Options.SPIFFE.
	TrustDomain = "hyperfleet.test"
	// SystemNamespace holds the operator's own Secrets.
	SystemNamespace = "hyperfleet-system"
	// PAT is the long-lived GitHub token the operator uses. It must never
	// reach a VM; the end-to-end tests look for it everywhere.
	PAT = "ghp_devEnvironmentPATthatMustNeverLeaveTheOperator"
	// proxmoxTokenID and proxmoxTokenSecret are the simulator's API token.
	proxmoxTokenID     = "root@pam!sim"
	proxmoxTokenSecret = "00000000-0000-0000-0000-000000000000"
	webhookSecret      = "dev-webhook-secret"
)

// Options configure a World.
type Options struct {
	// Dir keeps the world's files: kubeconfig, operator log, the guests'
	// directories (console logs). Required.
	Dir string
	// AgentBinary is the hyperfleet-agent binary the guests run. Required
	// unless the guests download the agent from an external operator
	// (ExternalOperator and AgentFromOperator).
	AgentBinary string
	// MinReplicas and MaxReplicas size the RunnerPool (0 and 5 by default).
	MinReplicas, MaxReplicas int32
	// Timings names the Proxmox simulator's timing preset
	// (proxmoxsim.Preset): "fast" (the default: clone 1 s, boot 2 s,
	// /cluster/resources refreshed every second) or "realistic" (what a
	// Proxmox VE host does: refresh every 10 s, clone 5 s, boot 20 s).
	Timings string
	// Latency, when set, replaces the preset's task latencies.
	Latency proxmoxsim.Latency
	// NoPowerOffNotices gives the guests no power-off notice URL, so that
	// only the listing detects their power-off (for comparisons;
	// docs/architecture.md, "Power-off hints").
	NoPowerOffNotices bool
	// Progress receives progress messages (nil: discarded).
	Progress io.Writer
	// LogLevel is the operator's log verbosity (0 info, 1 debug).
	LogLevel int
	// SimulatorAdmin enables the simulators' /_sim/ admin APIs (state
	// dumps, faults, clock) at ProxmoxURL's and GitHubURL's hosts. Off by
	// default; both simulators listen on loopback and answer the admin API
	// to loopback clients only.
	SimulatorAdmin bool
	// ExternalOperator: Start brings up everything but the operator, which
	// runs elsewhere (test/deploy runs the container image in a pod).
	// OperatorInputs says what that operator needs from the world; call
	// ConnectOperator once it runs.
	ExternalOperator bool
	// AgentFromOperator sets the template's agentSource to Operator: each
	// guest runs the download script the operator wrote into its seed
	// against the operator's agent server, then the agent it installed,
	// instead of AgentBinary. The in-process operator serves AgentBinary
	// as hyperfleet-agent-linux-amd64.
	AgentFromOperator bool
	// SPIFFE gives the VMs SPIFFE identities: the world runs a real
	// spire-server (internal/testworld/spireworld), the cluster names it in
	// spec.spire, the template attests with join tokens, and every guest's
	// agent starts a real spire-agent with its token, then fetches its
	// runner credential from the operator's credential broker with its
	// X509-SVID (docs/identity.md).
	SPIFFE bool
	// GuestImage, when set, makes the template a real guest: every VM
	// boots this image in QEMU (hack/guest-image builds it) instead of
	// running the agent as a host process. The guests reach the
	// simulators through QEMU's user-mode network at the Proxmox
	// simulator's GuestHostAddress, so the GitHub simulator's URL names
	// that address (host-side clients dial it on loopback) and its
	// certificate lists it; the template's cloud-init makes the guests
	// trust the simulator's CA. With AgentFromOperator the agent server's
	// URL names it too.
	GuestImage *proxmoxsim.GuestImage
	// ProxmoxDelivery (with GuestImage) sets the template's
	// spec.cloudInit.delivery to proxmox: no ISO, Proxmox's own
	// cloud-init drive, and as vendor-data the snippet KitSnippet, which
	// the world places on the simulator's local storage as an admin
	// would: kit.VendorData (pkg/provider/proxmox/kit) plus the GitHub simulator's CA (what
	// the template's userData carries otherwise, which delivery proxmox
	// refuses).
	ProxmoxDelivery bool
	// ProxmoxUser and ProxmoxSSHKeys (with ProxmoxDelivery) are the
	// template's spec.cloudInit.proxmox.user and sshAuthorizedKeys: the
	// user Proxmox's drive creates in the guest (ciuser) and the keys it
	// accepts (sshkeys).
	ProxmoxUser    string
	ProxmoxSSHKeys []string
	// TPM (with SPIFFE) has the template attest with the VMs' TPMs
	// instead of join tokens (docs/identity.md, "TPM"), with the samples'
	// settings (config/samples: the TPM template, the SPIRE cluster's
	// spec.spire.tpm): the world makes a DevID CA and takes the Proxmox
	// simulator's swtpm local CA as the EK CA (TPMEndorsementCA), puts both
	// into Secrets of SystemNamespace (TPMEKCASecret, TPMDevIDCASecret),
	// and configures spire-server's tpm_devid node attestor with the same
	// two. Every VM gets a fresh virtual TPM (addVirtualTPM), which the
	// simulator serves to a simulated guest at <root>/dev/tpmrm0.
	TPM bool
	// SecretStore (with SPIFFE) has the VMs read their runner credential
	// from a secrets store instead of the broker: the world runs the fake
	// Vault (internal/testworld/simulator/vault) on loopback HTTPS, its JWT auth
	// trusting the spire-server's JWT keys, and sets the cluster's
	// spec.spire.secretStore (docs/secrets-store.md).
	SecretStore bool
	// IPPool, when set, gives the template network mode static with
	// addresses from an IPPool of this spec (named IPPoolName) instead of
	// the simulator's DHCP leases. Real guests' QEMU user network is the
	// simulator's address range (10.99.0.0/24 by default, the host at .2,
	// DNS at .3): a pool inside it, with that gateway, works there.
	IPPool *hfv1.IPPoolSpec
	// IPv6Pool, when set with an IPv4 IPPool, makes the template
	// dual-stack: a second IPPool of this spec (named IPv6PoolName) joins
	// IPPool's in spec.network.ipPoolRefs. QEMU's user network gives the
	// guests no IPv6 network such a pool can use: put them on a
	// GuestNetwork with an IPv6 prefix (guestnet.Network.AddIPv6).
	IPv6Pool *hfv1.IPPoolSpec
	// GuestNetwork, when set (with GuestImage), puts the real guests on
	// this network instead of QEMU's user-mode one: a bridge in a network
	// namespace whose DHCP server the caller runs. The guests reach the
	// world's servers at the bridge's address (the simulator's
	// GuestHostAddress), where the network forwards each server's port
	// to its loopback listener.
	GuestNetwork *guestnet.Network
	// ClusterDNS and ClusterNetwork, when set, are the cluster's spec.dns
	// and spec.network (DNS registration, DNS and network validation);
	// Secrets (a DNS provider's TSIG key) are created in SystemNamespace
	// before the cluster.
	ClusterDNS     *hfv1.ClusterDNSSettings
	ClusterNetwork *hfv1.ClusterNetworkSettings
	Secrets        []*corev1.Secret
	// DHCP, when set, is the template's spec.network.dhcp (network mode
	// dhcp).
	DHCP *hfv1.DHCPOptions
	// KeepGuestDisks, when set, is where destroyed real guests' disk
	// overlays are moved (proxmoxsim.GuestConfig.KeepDisks), for tests
	// that read what a guest left on its disk.
	KeepGuestDisks string
	// MetricsAddr, when set, is the address the operator's /metrics
	// endpoint binds to (plain HTTP, as --metrics-bind-address). A port of
	// 0 takes a free port once, kept across operator restarts; MetricsURL
	// reports it. Empty: no metrics endpoint.
	MetricsAddr string
	// OnProxmoxRequest and OnGitHubRequest, when set, see every request
	// the simulators receive before they answer it (the benchmarks count
	// and time them). One that reads the body puts it back (r.Body) for
	// the simulator.
	OnProxmoxRequest, OnGitHubRequest func(*http.Request)
	// SPIREDial, when set, is how the in-process operator connects to the
	// spire-server (manager.Options.SPIREDial): tests wrap the real client
	// to count its calls.
	SPIREDial identity.Dialer
	// ScaleSetSessionIdle is how long the GitHub simulator keeps a runner
	// scale set's message session that no listener polls (as GitHub does
	// for a dead listener's); zero: the simulator's default, 2 minutes.
	ScaleSetSessionIdle time.Duration
	// ResyncInterval replaces the operator's RunnerPool resync interval
	// (5 s): a scenario that must show another source of demand at work
	// (a runner scale set's listener) sets it long enough that the resync
	// never runs meanwhile.
	ResyncInterval time.Duration
	// GitHubRateLimit is the PAT's hourly request budget on the GitHub
	// simulator; 0 is GitHub's 5,000. A churn of hundreds of claims a
	// minute needs more, as an organization at that rate would (a GitHub
	// App's installation budget grows to 12,500, or several credentials).
	GitHubRateLimit int
	// Buildkite runs the Buildkite simulator too (buildkite.go): one
	// organization (BuildkiteOrganization) with one cluster and pipeline,
	// served with the GitHub simulator's certificate, which the guests
	// trust; AddBuildkitePool adds pools of it. BuildkiteAgentBinary is
	// the buildkite-agent the simulator serves as its release tarball,
	// which the guests download (hack/buildkite-agent).
	Buildkite            bool
	BuildkiteAgentBinary string
	// GitLab runs the GitLab simulator too (gitlab.go): one group
	// (GitLabGroup) with one project, served with the GitHub simulator's
	// certificate, which the guests trust; AddGitLabPool adds pools of
	// it. The guests download the simulator's gitlab-runner stand-in
	// (the real runner cannot be built here, docs/gitlab.md).
	GitLab bool
	// Platform is the CI platform of the world's own template and pool
	// (TemplateName, PoolName) and of the jobs QueueJobs queues:
	// hfv1.WorkloadGitHubActions (the default, when empty) or
	// hfv1.WorkloadBuildkite, which implies Buildkite: the template
	// bootstraps a Buildkite agent of the simulator's organization and
	// the pool serves its cluster queue JobLabel. The GitHub simulator
	// runs either way (its certificate serves Buildkite's simulator too).
	// hfv1.WorkloadGitLabCI implies GitLab the same way: the template
	// bootstraps a runner of the simulator's group and the pool's runners
	// carry the tag JobLabel. More pools of either are added beside the
	// world's own with AddBuildkitePool and AddGitLabPool.
	Platform hfv1.WorkloadType
	// Install is the world docs/install.md starts from, for the test that
	// runs the page's commands as written (test/deploy, docs_test.go;
	// install.go): nothing of HyperFleet's exists yet. The API server has
	// no CRDs (the chart installs them), no object is applied (step 5
	// applies the samples), the Proxmox simulator has only its root user
	// (step 2 makes the operator's user, role and token with pveum, which
	// reaches the simulator through its admin API), and the GitHub
	// simulator holds the samples' account and repository with a GitHub
	// App installed on them (step 3, done in GitHub's web UI: InstallApp).
	// The guests run AgentBinary, the agent the samples' template has in
	// its image (agentSource Image, the default). Needs ExternalOperator
	// and SimulatorAdmin.
	Install bool
	// Libvirt, when set (with GuestImage), makes the world's cluster this
	// libvirt host instead of the Proxmox simulator (libvirt.go): the
	// world defines two dir pools on it, places GuestImage's disk as the
	// template's volume and defines the template domain, whose guests
	// boot under TCG on QEMU's user-mode network, reaching the world's
	// servers at the Proxmox simulator's GuestHostAddress as its guests
	// do (the simulator runs on, unused, as that address's authority).
	Libvirt *LibvirtHost
}

// World is a running embedded world.
type World struct {
	opts Options
	// API is the kube-apiserver and etcd.
	API *testenv.Environment
	// Proxmox and GitHub are the simulators.
	Proxmox *proxmoxsim.Simulator
	GitHub  *githubsim.Simulator
	// KubeconfigPath is a kubeconfig file for kubectl.
	KubeconfigPath string
	// ProxmoxURL and GitHubURL are the simulators' base URLs.
	ProxmoxURL, GitHubURL string
	// MetricsURL is the operator's /metrics endpoint (empty without
	// Options.MetricsAddr).
	MetricsURL string

	proxmoxFingerprint string
	githubCA           []byte
	simCert            tls.Certificate
	githubTransport    *http.Transport
	servers            []*http.Server
	webhook            webhookFiles
	agentTLS           agentTLSFiles
	logFile            *os.File
	// forwardErr is the first port GuestNetwork could not forward.
	forwardErr error

	// Buildkite is the Buildkite simulator with Options.Buildkite.
	Buildkite *buildkiteWorld
	// GitLab is the GitLab simulator with Options.GitLab.
	GitLab *gitlabWorld
	// SPIRE is the spire-server with Options.SPIFFE.
	SPIRE *spireworld.Server
	// Vault is the fake secrets store with Options.SecretStore, VaultURL
	// its address; its admin view (SecretPaths, Requests) shows what the
	// operator wrote and the VMs read.
	Vault    *vaultsim.Server
	VaultURL string
	vaultCA  []byte
	// TPMDevIDCA is the CA the operator signs the VMs' DevID certificates
	// with (Options.TPM), kept in the Secret TPMDevIDCASecret.
	TPMDevIDCA *tpmdevid.CA
	// tpmSecrets are the EK CA and DevID CA Secrets (Options.TPM).
	tpmSecrets []*corev1.Secret

	mu       sync.Mutex
	operator *operatorRun
	jobs     []int64
	// githubHooksOff: the repository has no webhook to the operator
	// (SetGitHubWebhook).
	githubHooksOff bool
	// buildkiteJobs are the Buildkite jobs QueueJobs queued, oldest first.
	buildkiteJobs []string
	// gitlabJobs are the GitLab jobs QueueJobs queued, oldest first.
	gitlabJobs []int64
	// clusters are the simulators AddCluster started.
	clusters []*proxmoxsim.Simulator
}

// webhookFiles are the operator's webhook serving certificate files and a
// client that trusts them (for the GitHub simulator's deliveries).
type webhookFiles struct {
	certFile, keyFile string
	client            *http.Client
}

// operatorRun is one running operator (manager) instance.
type operatorRun struct {
	cancel context.CancelFunc
	done   chan error
	comps  *manager.Components
}

// Start brings the world up: API server, simulators, operator and sample
// objects. Stop it with Stop, whatever happens.
func Start(ctx context.Context, opts Options) (*World, error) {
	agentServed := opts.ExternalOperator && opts.AgentFromOperator
	if opts.TPM && !opts.SPIFFE {
		return nil, errors.New("devenv: Options.TPM needs Options.SPIFFE: the TPM attests the VMs' spire-agents")
	}
	if opts.SecretStore && !opts.SPIFFE {
		return nil, errors.New("devenv: Options.SecretStore needs Options.SPIFFE: the VMs log in to the store with their JWT-SVIDs")
	}
	if opts.Install && (!opts.ExternalOperator || !opts.SimulatorAdmin) {
		return nil, errors.New("devenv: Options.Install needs ExternalOperator and SimulatorAdmin: the page installs the operator, and its pveum reaches the simulator through the admin API")
	}
	if err := opts.checkLibvirt(); err != nil {
		return nil, err
	}
	if opts.Dir == "" || (opts.AgentBinary == "" && !agentServed) {
		return nil, errors.New("devenv: Options.Dir and Options.AgentBinary are required (AgentBinary is not when an external operator serves the agent)")
	}
	switch opts.Platform {
	case "":
		opts.Platform = hfv1.WorkloadGitHubActions
	case hfv1.WorkloadGitHubActions:
	case hfv1.WorkloadBuildkite:
		opts.Buildkite = true
	case hfv1.WorkloadGitLabCI:
		opts.GitLab = true
	default:
		return nil, fmt.Errorf("devenv: Options.Platform %q: the world runs %s, %s or %s pools",
			opts.Platform, hfv1.WorkloadGitHubActions, hfv1.WorkloadBuildkite, hfv1.WorkloadGitLabCI)
	}
	if opts.MaxReplicas == 0 {
		opts.MaxReplicas = 5
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	w := &World{opts: opts}
	if err := w.pickMetricsAddr(); err != nil {
		return nil, err
	}
	err := w.start(ctx)
	if err == nil {
		err = w.forwardErr
	}
	if err != nil {
		_ = w.Stop()
		return nil, err
	}
	return w, nil
}

func (w *World) start(ctx context.Context) (err error) {
	opts := w.opts
	if w.logFile, err = os.Create(filepath.Join(opts.Dir, "operator.log")); err != nil {
		return fmt.Errorf("devenv: operator log: %w", err)
	}
	w.progress("Starting kube-apiserver and etcd (the first run builds them from source: about 10 minutes on 2 cores, then cached)")
	stopTicker := w.tick("still starting the API server")
	if opts.Install {
		w.API, err = testenv.StartWithoutCRDs()
	} else {
		w.API, err = testenv.StartWithProgress(opts.Progress)
	}
	stopTicker()
	if err != nil {
		return err
	}
	kubeconfig := filepath.Join(opts.Dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, w.API.KubeConfig(), 0o600); err != nil {
		return fmt.Errorf("devenv: write kubeconfig: %w", err)
	}
	w.KubeconfigPath = kubeconfig
	// The Proxmox simulator first: it says where real guests find the
	// host, and with Options.TPM its local CA is spire-server's EK CA.
	w.progress("Starting the Proxmox VE simulator")
	if err := w.startProxmox(); err != nil {
		return err
	}
	if opts.SPIFFE {
		serverOpts := spireworld.ServerOptions{TrustDomain: TrustDomain, Dir: filepath.Join(opts.Dir, "spire")}
		if opts.TPM {
			if serverOpts.TPMDevID, err = w.makeTPMTrust(); err != nil {
				return err
			}
		}
		w.progress("Starting spire-server (the first run builds SPIRE from source: about 4 minutes on 2 cores, then cached)")
		stop := w.tick("still starting spire-server")
		w.SPIRE, err = spireworld.StartServer(ctx, serverOpts)
		stop()
		if err != nil {
			return fmt.Errorf("devenv: %w", err)
		}
	}
	if opts.SecretStore {
		w.progress("Starting the secrets store (a fake Vault trusting spire-server's JWT keys)")
		if err := w.startVault(ctx); err != nil {
			return err
		}
	}
	w.progress("Starting the GitHub simulator")
	if err := w.startGitHub(); err != nil {
		return err
	}
	if opts.Buildkite {
		w.progress("Starting the Buildkite simulator")
		if err := w.startBuildkite(); err != nil {
			return err
		}
	}
	if opts.GitLab {
		w.progress("Starting the GitLab simulator")
		if err := w.startGitLab(); err != nil {
			return err
		}
	}
	if opts.Install {
		// What the page's steps create is the test's to create.
		return nil
	}
	// The objects first: the operator keeps its ownership key in a Secret
	// of SystemNamespace.
	if err := w.putKit(); err != nil {
		return err
	}
	if opts.Libvirt != nil {
		w.progress("Defining the template domain on libvirtd (%s)", opts.Libvirt.SocketPath)
		if err := w.setUpLibvirt(); err != nil {
			return err
		}
	}
	if err := w.applyObjects(ctx); err != nil {
		return err
	}
	if opts.ExternalOperator {
		return nil
	}
	w.progress("Starting the operator (log: %s)", w.logFile.Name())
	if err := w.StartOperator(ctx); err != nil {
		return err
	}
	return w.waitPoolVerified(ctx)
}

// waitPoolVerified waits until the operator verified the pool's CI
// platform scope: jobs are routed only to verified pools (docs/security.md), and
// an organization pool would not find jobs queued before that.
func (w *World) waitPoolVerified(ctx context.Context) error {
	// Three minutes: the cluster, the template and then the pool become
	// Ready in turn, each after its own checks, and on a loaded 2-core
	// machine (two real-guest worlds side by side) one minute was seen to
	// be too short.
	const within = 3 * time.Minute
	deadline := time.Now().Add(within)
	var pool hfv1.RunnerPool
	for {
		err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: PoolName}, &pool)
		if err == nil && hfv1.IsConditionTrue(pool.Status.Conditions, hfv1.RunnerPoolScopeVerifiedCondition) {
			return nil
		}
		if time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("devenv: RunnerPool %s/%s was not verified within %s: %w", Namespace, PoolName, within, err)
			}
			return fmt.Errorf("devenv: RunnerPool %s/%s was not verified within %s (conditions %+v)", Namespace, PoolName, within, pool.Status.Conditions)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (w *World) progress(format string, args ...any) {
	fmt.Fprintf(w.opts.Progress, "==> "+format+"\n", args...)
}

// tick reports every 30 s that a long step is still running; the returned
// function stops it.
func (w *World) tick(what string) func() {
	done, exited := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				select {
				case <-done:
					return
				default:
				}
				w.progress("%s (%s elapsed)", what, time.Since(start).Round(time.Second))
			}
		}
	}()
	// Waits for the goroutine: nothing is written after the step ended.
	return func() { close(done); <-exited }
}

// serveTLS serves h over TLS with cert on a loopback port and returns the
// https:// base URL.
func (w *World) serveTLS(h http.Handler, cert tls.Certificate) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("devenv: listen: %w", err)
	}
	return w.serveTLSOn(ln, h, cert), nil
}

// serveTLSOn serves h over HTTPS on ln until Stop, and returns its
// https:// base URL.
func (w *World) serveTLSOn(ln net.Listener, h http.Handler, cert tls.Certificate) string {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		// The simulators' own loggers report what matters.
		ErrorLog: slogDiscard()}
	w.servers = append(w.servers, srv)
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return "https://" + ln.Addr().String()
}

// guestHost is the address at which guests reach the host's loopback:
// 127.0.0.1 for guests that are host processes, the Proxmox simulator's
// GuestHostAddress for real ones.
func (w *World) guestHost() string {
	if w.opts.GuestImage != nil {
		return w.Proxmox.GuestHostAddress()
	}
	return "127.0.0.1"
}

// guestURL is an https:// base URL of a server on host loopback port,
// as the guests reach it.
func (w *World) guestURL(base string) string {
	return "https://" + w.guestHostPort(strings.TrimPrefix(base, "https://"))
}

// guestHostPort is the host:port of a server on a host loopback port, as
// the guests reach it.
func (w *World) guestHostPort(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	if n := w.opts.GuestNetwork; n != nil {
		if err := n.Forward(port); err != nil && w.forwardErr == nil {
			w.forwardErr = fmt.Errorf("devenv: forward the guests' port %s: %w", port, err)
		}
	}
	return net.JoinHostPort(w.guestHost(), port)
}

// dialLoopback dials the address of a guest URL on the host: the guest
// host address is the host's loopback seen from a guest.
func (w *World) dialLoopback(ctx context.Context, network, addr string) (net.Conn, error) {
	if host, port, err := net.SplitHostPort(addr); err == nil && host == w.guestHost() {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// observe calls hook with every request h receives (h itself without a
// hook).
func observe(h http.Handler, hook func(*http.Request)) http.Handler {
	if hook == nil {
		return h
	}
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		hook(r)
		h.ServeHTTP(rw, r)
	})
}

func (w *World) startGitHub() error {
	cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1", "localhost", w.guestHost())
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	if err := w.writeWebhookCert(); err != nil {
		return err
	}
	if err := w.writeAgentServerCert(); err != nil {
		return err
	}
	cfg := githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: Organization}},
		Repositories:  []githubsim.RepoConfig{{Name: Repository}},
		PATs:          []githubsim.PATConfig{{Token: PAT, Login: "octocat", RateLimit: w.opts.GitHubRateLimit}},
		// A loaded laptop may stall a runner's poll for seconds; GitHub
		// would not call that runner lost either.
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	}
	if w.opts.Install {
		if err := w.installApp(&cfg); err != nil {
			return err
		}
	}
	sim, err := githubsim.New(cfg, githubsim.WithCACertificate(caPEM), githubsim.WithWebhookClient(w.webhook.client), githubsim.WithLogger(w.simLogger("github-sim")),
		githubsim.WithAdmin(w.opts.SimulatorAdmin), githubsim.WithScaleSetSessionIdleTimeout(w.opts.ScaleSetSessionIdle))
	if err != nil {
		return fmt.Errorf("devenv: GitHub simulator: %w", err)
	}
	w.GitHub, w.githubCA, w.simCert = sim, caPEM, cert
	base, err := w.serveTLS(observe(sim, w.opts.OnGitHubRequest), cert)
	if err != nil {
		return err
	}
	// Runners in the guests connect to this URL (it is in their JIT
	// configuration and the runner package's URL).
	w.GitHubURL = w.guestURL(base)
	sim.SetServerURL(w.GitHubURL)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	w.githubTransport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64,
		DialContext: w.dialLoopback}
	return os.WriteFile(w.githubCAFile(), caPEM, 0o644)
}

func (w *World) githubCAFile() string { return filepath.Join(w.opts.Dir, "github-ca.pem") }

// writeWebhookCert creates the operator's webhook serving certificate.
func (w *World) writeWebhookCert() error {
	c, err := selfsigned.New("127.0.0.1", "localhost")
	if err != nil {
		return fmt.Errorf("devenv: webhook certificate: %w", err)
	}
	w.webhook.certFile, w.webhook.keyFile = filepath.Join(w.opts.Dir, "webhook.crt"), filepath.Join(w.opts.Dir, "webhook.key")
	if err := c.WriteFiles(w.webhook.certFile, w.webhook.keyFile); err != nil {
		return fmt.Errorf("devenv: webhook certificate: %w", err)
	}
	roots := c.Pool()
	w.webhook.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}}
	return nil
}

func (w *World) startProxmox() error {
	cfg, err := w.simConfig()
	if err != nil {
		return err
	}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(w.opts.SimulatorAdmin), proxmoxsim.WithLogger(w.simLogger("proxmox-sim")))
	if err != nil {
		return fmt.Errorf("devenv: Proxmox simulator: %w", err)
	}
	w.Proxmox = sim
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("devenv: listen: %w", err)
	}
	w.ProxmoxURL, w.proxmoxFingerprint, err = w.serveProxmox(sim, ln)
	return err
}

// serveProxmox serves sim over HTTPS on ln with a fresh self-signed
// certificate, and returns its API URL and the certificate's SHA-256
// fingerprint (as HypervisorCluster spec.tls pins it).
func (w *World) serveProxmox(sim *proxmoxsim.Simulator, ln net.Listener) (apiURL, fingerprint string, err error) {
	host, _, _ := net.SplitHostPort(ln.Addr().String())
	cert, _, err := githubsim.SelfSignedCertificate(host, "localhost")
	if err != nil {
		return "", "", fmt.Errorf("devenv: %w", err)
	}
	base := w.serveTLSOn(ln, observe(sim, w.opts.OnProxmoxRequest), cert)
	return base + "/api2/json", proxmoxsim.FormatFingerprint(sha256.Sum256(cert.Certificate[0])), nil
}

// simConfig is the Proxmox simulator's configuration: the timings asked
// for, one big node, the guest that runs the real agent.
func (w *World) simConfig() (proxmoxsim.Config, error) {
	cfg := proxmoxsim.DefaultConfig()
	timings, err := proxmoxsim.Preset(cmp.Or(w.opts.Timings, proxmoxsim.PresetFast))
	if err != nil {
		return cfg, fmt.Errorf("devenv: %w", err)
	}
	cfg.ApplyTimings(timings)
	if w.opts.Latency != (proxmoxsim.Latency{}) {
		cfg.Latency = w.opts.Latency
	}
	cfg.Templates[0].GuestImage = w.opts.GuestImage
	if w.opts.Install {
		// The samples' site has a second template (the GitLab and
		// Buildkite samples', which the sample cluster's tenancy allows
		// without a VLAN).
		t := cfg.Templates[0]
		t.VMID, t.Name = 9001, "debian-12-runner"
		cfg.Templates = append(cfg.Templates, t)
	}
	cfg.Nodes[0].Memory, cfg.Nodes[0].CPUs = 1<<40, 1024
	cfg.Guest = proxmoxsim.GuestConfig{
		Command:    []string{"sh", "-c", w.guestScript()},
		WriteFiles: true,
		WorkDir:    filepath.Join(w.opts.Dir, "guests"),
		KeepDisks:  w.opts.KeepGuestDisks,
		Env: map[string]string{
			"HF_AGENT_BINARY": w.opts.AgentBinary,
			// The agent downloads the runner from the GitHub simulator.
			"SSL_CERT_FILE": w.githubCAFile(),
			// The simulator's runner long-polls for 1 s instead of 20 s,
			// so that a scale-down finds it between polls.
			"HF_SIM_POLL_WAIT": "1",
		},
	}
	if n := w.opts.GuestNetwork; n != nil {
		cfg.Guest.QEMU.Network = &proxmoxsim.TapNetwork{Netns: n.Netns, Bridge: guestnet.Bridge, HostAddress: n.Host.String()}
	}
	if w.opts.SPIFFE {
		dir, err := spireworld.Dir()
		if err != nil {
			return cfg, fmt.Errorf("devenv: %w", err)
		}
		cfg.Guest.Env["HF_SPIRE_AGENT"] = filepath.Join(dir, "spire-agent")
	}
	return cfg, nil
}

// Dir is the world's directory (Options.Dir): kubeconfig, logs, guests.
func (w *World) Dir() string { return w.opts.Dir }

// simLogger writes a simulator's log to <Dir>/<name>.log.
func (w *World) simLogger(name string) *slog.Logger {
	f, err := os.Create(filepath.Join(w.opts.Dir, name+".log"))
	if err != nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func slogDiscard() *log.Logger { return slog.NewLogLogger(slog.DiscardHandler, slog.LevelError) }

// pickMetricsAddr fixes Options.MetricsAddr's port, when it is 0, to a
// free one, so that every operator start serves metrics at MetricsURL.
func (w *World) pickMetricsAddr() error {
	addr := w.opts.MetricsAddr
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("devenv: Options.MetricsAddr %q: %w", addr, err)
	}
	if port == "0" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("devenv: find a free port for the metrics endpoint: %w", err)
		}
		_, port, _ = net.SplitHostPort(ln.Addr().String())
		_ = ln.Close()
		w.opts.MetricsAddr = net.JoinHostPort(host, port)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	w.MetricsURL = "http://" + net.JoinHostPort(host, port) + "/metrics"
	return nil
}

// StartOperator starts an operator (the manager with every controller, the
// webhook receiver and the resync) against the world. Start does it once;
// call it again after StopOperator to simulate a restart.
func (w *World) StartOperator(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.operator != nil {
		return errors.New("devenv: the operator is already running")
	}
	if w.opts.ExternalOperator {
		return errors.New("devenv: the operator runs outside the process (Options.ExternalOperator)")
	}
	logger := zap.New(zap.WriteTo(w.logFile), zap.Level(zapcore.Level(-w.opts.LogLevel)),
		zap.JSONEncoder(func(c *zapcore.EncoderConfig) { c.EncodeTime = zapcore.RFC3339NanoTimeEncoder }))
	cfg := rest.CopyConfig(w.API.Config)
	cfg.QPS = -1
	mgrOpts := ctrl.Options{
		Scheme:                 w.API.Scheme,
		Logger:                 logger,
		Metrics:                metricsserver.Options{BindAddress: cmp.Or(w.opts.MetricsAddr, "0")},
		HealthProbeBindAddress: "0",
		// A restart builds the controllers again in this process.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	}
	manager.ConfigureSecretReads(&mgrOpts, nil)
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("devenv: new manager: %w", err)
	}
	signer, err := manager.LoadOrCreateSigner(ctx, w.API.Client, manager.SignerOptions{Namespace: SystemNamespace, Name: "hyperfleet-ownership"})
	if err != nil {
		return fmt.Errorf("devenv: ownership signer: %w", err)
	}
	agentServer, err := w.inProcessAgentServer()
	if err != nil {
		return err
	}
	me, err := user.Current()
	if err != nil {
		return fmt.Errorf("devenv: the user the simulated VMs' generic scripts run as: %w", err)
	}
	runCtx, cancel := context.WithCancel(ctrl.LoggerInto(context.WithoutCancel(ctx), logger))
	comps, err := manager.Setup(runCtx, mgr, manager.Options{
		AgentServer: agentServer,
		Signer:      signer,
		// The simulated VMs' agents are this user's processes.
		SPIREAgentUID: os.Getuid(),
		// Their generic scripts too: this user, by name.
		GenericScriptUser: me.Username,
		// The local world's CI platform is the GitHub simulator.
		Workloads:         map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitHubActions: github.NewBackend, hfv1.WorkloadGeneric: generic.NewBackend, hfv1.WorkloadBuildkite: buildkite.NewBackend, hfv1.WorkloadGitLabCI: gitlab.NewBackend},
		WorkloadTransport: w.githubTransport,
		Webhook:           &manager.WebhookOptions{Addr: "127.0.0.1:0", CertFile: w.webhook.certFile, KeyFile: w.webhook.keyFile, Platforms: w.webhookPlatforms()},
		ResyncInterval:    cmp.Or(w.opts.ResyncInterval, resyncInterval),
		// Leftovers show within seconds, as do the sweeper's metrics.
		SweepInterval: sweepInterval,
		MaxRetryDelay: maxRetryDelay,
		SPIREDial:     w.opts.SPIREDial,
	})
	if err != nil {
		cancel()
		return fmt.Errorf("devenv: operator setup: %w", err)
	}
	run := &operatorRun{cancel: cancel, done: make(chan error, 1), comps: comps}
	go func() { run.done <- mgr.Start(runCtx) }()
	select {
	case <-comps.Webhook.Ready():
	case err := <-run.done:
		cancel()
		return fmt.Errorf("devenv: operator stopped at once: %w", err)
	case <-time.After(time.Minute):
		cancel()
		return errors.New("devenv: the operator's webhook receiver did not start within a minute")
	}
	// The receiver listens on a new port after every start: point the
	// repository's webhook at it.
	// (w.mu is held: StartOperator takes it for the whole start.)
	if !w.githubHooksOff {
		if err := w.pointWebhook("https://" + comps.Webhook.Addr().String() + "/webhooks/github"); err != nil {
			cancel()
			return err
		}
	}
	w.pointBuildkiteWebhook("https://" + comps.Webhook.Addr().String())
	if err := w.pointGitLabWebhook("https://" + comps.Webhook.Addr().String()); err != nil {
		cancel()
		return err
	}
	w.operator = run
	return nil
}

// Broker is the running in-process operator's credential broker as the
// VMs reach it: its URL and the PEM CA its certificate verifies against.
func (w *World) Broker() (url, ca string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.operator == nil || w.operator.comps.AgentServer == nil || w.operator.comps.AgentServer.BrokerURL() == "" {
		return "", "", errors.New("devenv: no operator with a credential broker runs in this process")
	}
	srv := w.operator.comps.AgentServer
	return srv.BrokerURL(), srv.CA(), nil
}

// SetGitHubWebhook turns the repository's webhook to the operator off (it
// is removed, as if nobody had configured one, also across operator
// restarts) or on again: a scenario of webhook-free demand (a runner scale
// set's listener) runs with it off.
func (w *World) SetGitHubWebhook(on bool) error {
	w.mu.Lock()
	w.githubHooksOff = !on
	run := w.operator
	w.mu.Unlock()
	if !on {
		for _, h := range w.GitHub.Webhooks() {
			w.GitHub.RemoveWebhook(h.ID)
		}
		return nil
	}
	if run == nil || run.comps.Webhook == nil {
		return errors.New("devenv: no operator with a webhook receiver runs in this process")
	}
	return w.pointWebhook("https://" + run.comps.Webhook.Addr().String() + "/webhooks/github")
}

// pointWebhook makes url the repository's only webhook.
func (w *World) pointWebhook(url string) error {
	for _, h := range w.GitHub.Webhooks() {
		w.GitHub.RemoveWebhook(h.ID)
	}
	if _, err := w.GitHub.AddWebhook(githubsim.Webhook{URL: url, Secret: webhookSecret}); err != nil {
		return fmt.Errorf("devenv: register webhook: %w", err)
	}
	return nil
}

// StopOperator stops the running operator, as a crash or a rollout would.
func (w *World) StopOperator() error {
	w.mu.Lock()
	run := w.operator
	w.operator = nil
	w.mu.Unlock()
	if run == nil {
		return nil
	}
	run.cancel()
	return <-run.done
}

// Stop stops everything the world started and removes nothing from Dir.
func (w *World) Stop() error {
	var errs []error
	if err := w.StopOperator(); err != nil {
		errs = append(errs, fmt.Errorf("operator: %w", err))
	}
	for _, srv := range w.servers {
		_ = srv.Close()
	}
	if w.githubTransport != nil {
		w.githubTransport.CloseIdleConnections()
	}
	if w.GitHub != nil {
		_ = w.GitHub.Close()
	}
	if w.Buildkite != nil {
		w.Buildkite.Sim.Close()
	}
	if w.GitLab != nil {
		w.GitLab.Sim.Close()
	}
	if w.Proxmox != nil {
		_ = w.Proxmox.Close()
	}
	for _, sim := range w.clusters {
		_ = sim.Close()
	}
	if w.SPIRE != nil {
		w.SPIRE.Stop()
	}
	if w.API != nil {
		if err := w.API.Stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if w.logFile != nil {
		_ = w.logFile.Close()
	}
	return errors.Join(errs...)
}
