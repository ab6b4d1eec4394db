// Package manager wires every controller, the poller, the orphan sweeper,
// the webhook receiver, the agent server and the credential broker, and
// their shared state, into one controller-runtime manager, and loads or
// creates the ownership key ring (ownership.go). The operator binary, the
// local world (internal/testworld/devenv) and the end-to-end tests all use it, so they
// run exactly the same wiring.
package manager

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/broker"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/controller"
	"github.com/hyperfleet/hyperfleet/internal/controller/fieldindex"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/feeds"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/internal/hypervisors"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/ipam"
	"github.com/hyperfleet/hyperfleet/internal/isolation"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/poweroff"
	"github.com/hyperfleet/hyperfleet/internal/scaling"
	"github.com/hyperfleet/hyperfleet/internal/sweeper"
	"github.com/hyperfleet/hyperfleet/internal/tpmenroll"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/internal/workloads"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// Options configure the operator.
type Options struct {
	// Signer marks and verifies VM ownership. Required.
	Signer *ownership.Signer
	// DNSProviders build the DNS back-ends VMs are registered with, by
	// spec.dns.dnsProvider.type; nil means the ones registered with
	// dnsreg.Register, which the binary's main does. A type none serves
	// is reported in the cluster's DNSReady condition
	// (DNSProviderUnsupported).
	DNSProviders map[hfv1.DNSProviderType]dnsreg.Factory
	// Namespace is the operator's own namespace (--namespace): the DNS
	// back-ends that write Kubernetes objects (the DNSEndpoints of the
	// external-dns types) put them there when the cluster names no other
	// namespace. Empty means DefaultNamespace.
	Namespace string
	// Factories build Providers per hypervisor kind; nil means those of the
	// kinds registered with provider.Register, which the binary's main
	// does. Setup fails when neither names one. The kinds' sections of the
	// API are read by the registered kinds either way.
	Factories map[hfv1.HypervisorProvider]provider.Factory
	// Clock is the time source; nil means the real clock.
	Clock clock.Clock
	// Workloads build the CI platform back-ends by workload type
	// (spec.workload.type); nil means the ones registered with
	// workload.Register, which the binary's main does. Setup fails
	// without any: an operator that serves no CI platform serves nothing.
	Workloads map[hfv1.WorkloadType]workload.Factory
	// WorkloadTransport is the base HTTP transport to the CI platforms
	// (TLS settings, such as a GitHub Enterprise Server CA); nil is the
	// default transport.
	WorkloadTransport http.RoundTripper
	// Bootstrap, when set, stands in for the CI platforms' accounts
	// (tests): it issues the VMs' credentials and verifies the pools'
	// scopes, and nothing else asks a platform anything: no resync, no
	// runner sweep, no job cancellation, no runner release lookups and no
	// confirmation of webhook events. The back-ends still read the
	// objects' platform sections.
	Bootstrap WorkloadStandIn
	// SweepInterval, OrphanGracePeriod and SweepDryRun tune the orphan
	// sweeper (zero values take its defaults).
	SweepInterval     time.Duration
	OrphanGracePeriod time.Duration
	SweepDryRun       bool
	// Webhook, when set, serves the CI platforms' job webhooks (on every
	// replica, leader or not).
	Webhook *WebhookOptions
	// ResyncInterval is the time between RunnerPool resyncs against the
	// CI platform (runner states, queued jobs); zero means 30s.
	ResyncInterval time.Duration
	// MaxRetryDelay caps the exponential backoff of a MachineClaim's
	// transient hypervisor errors; zero means 5 minutes.
	MaxRetryDelay time.Duration
	// MinRetryDelay is that backoff's first wait; zero means 2 seconds.
	MinRetryDelay time.Duration
	// ReplacementBackoff is the backoff of RunnerPools whose claims keep
	// failing; nil means scaling.DefaultBackoff.
	ReplacementBackoff *scaling.Backoff
	// StuckBounds are how long a MachineClaim may stay in each phase
	// before it is reported Stuck; nil means stuck.DefaultBounds.
	StuckBounds *stuck.Bounds
	// AgentServer, when set, serves the in-VM agent binary over HTTPS (on
	// every replica) to VMs of templates with agentSource Operator, and
	// the credential broker VMs that attest with SPIRE fetch their runner
	// credential from (docs/identity.md).
	AgentServer *AgentServerOptions
	// SPIREAgentUID is the uid the HyperFleet agent runs as inside VMs,
	// the selector of their SPIRE registration entries: 0 (root, from its
	// systemd unit). Only the local test world, whose simulated VMs are
	// the developer's processes, sets another.
	SPIREAgentUID int
	// GenericScriptUser is the user generic VMs' agents run their script
	// as, which those VMs' SPIRE entries select by name; empty:
	// agentconfig.DefaultRunnerUser, the user the agent runs CI runners
	// as. The operator's --generic-script-user sets it; the local test
	// world sets the developer's own user, since its simulated VMs are
	// the developer's processes.
	GenericScriptUser string
	// SPIREDial connects to SPIRE servers; nil: the real Server API client
	// (internal/spire). Tests put an in-memory server here.
	SPIREDial identity.Dialer
	// SPIREForcedRefreshInterval is the shortest time between two reads of
	// a SPIRE server's trust bundle that the credential broker may force
	// (identity.Registry.ForcedRefreshInterval); zero: its default.
	SPIREForcedRefreshInterval time.Duration
}

// WorkloadStandIn stands in for the CI platforms' accounts (see
// Options.Bootstrap): it fills in the runner part of VMs' cloud-init,
// releases claims' runners and verifies pools' scopes, as
// internal/workloads.Platforms does with the accounts.
type WorkloadStandIn interface {
	BootstrapVars(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, vars *cloudinit.Vars) error
	Release(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate) error
	controller.ScopeVerifier
}

// standInCI are the claims' CI platforms when a test stands in for their
// accounts: the back-ends still read the objects' platform sections.
type standInCI struct {
	WorkloadStandIn
	backends *workload.Backends
}

func (c standInCI) Workloads() *workload.Backends { return c.backends }

// AgentServerOptions configure the agent server (internal/agentserver).
type AgentServerOptions struct {
	// Addr is the HTTPS listen address, such as ":9443".
	Addr string
	// CertFile and KeyFile are the serving certificate and key (reloaded
	// when they change).
	CertFile, KeyFile string
	// CAFile is the PEM CA VMs trust to reach URL; empty: their system
	// roots.
	CAFile string
	// Dir holds the binaries, named hyperfleet-agent-<os>-<arch>.
	Dir string
	// URL is the https:// base URL VMs reach the server at, such as
	// https://hyperfleet-agent.ci.example.com:9443 (VMs live outside the
	// cluster: a .svc name works only if they resolve cluster DNS).
	URL string
	// Limits cap its connections (0: agentserver.DefaultLimits' cap,
	// negative: none); see docs/security.md, "The agent server's bounds".
	Limits httpsserver.Limits
	// DownloadTimeout bounds a whole download (0: derived from the
	// binaries' size, agentserver.DefaultDownloadTimeout).
	DownloadTimeout time.Duration
}

// WebhookOptions configure the webhook server: one HTTPS listener with a
// receiver per CI platform, each at its back-end's path
// (workload.WebhookFormat) with its own secrets.
type WebhookOptions struct {
	// Platforms are the platforms whose webhooks are received (at least
	// one; one entry each), with their secrets.
	Platforms []WebhookPlatform
	// Addr is the HTTPS listen address, such as ":9292".
	Addr string
	// CertFile and KeyFile are the serving certificate and key (reloaded
	// when they change).
	CertFile, KeyFile string
	// MaxBodyBytes bounds a delivery (0: the receiver's default, 256 KiB).
	MaxBodyBytes int64
	// MaxInFlight bounds the deliveries read and verified at once per
	// platform (0: the receiver's default, 64); see docs/security.md,
	// "Webhook intake".
	MaxInFlight int
	// MaxEventAge is how old an event may be before it is confirmed with
	// the CI platform (0: demand.DefaultMaxEventAge, 10 minutes).
	MaxEventAge time.Duration
	// Limits cap the receiver's connections (0: webhook.DefaultLimits'
	// cap, negative: none); see docs/security.md, "Webhook intake".
	Limits httpsserver.Limits
}

// WebhookPlatform is one CI platform's webhook receiver: which platform,
// and the secrets its deliveries are verified with.
type WebhookPlatform struct {
	// Platform is the workload type whose webhooks are received; empty
	// (in a one-entry list) means the only back-end that receives
	// webhooks.
	Platform hfv1.WorkloadType
	// APIHost is the API host whose deliveries these secrets verify, as
	// a template's URL names it (host or host:port, such as
	// ghes.example.com): a GitHub Enterprise Server, a self-managed
	// GitLab; empty for the platform's public service. Jobs of its
	// deliveries route to the pools of that host only. A platform may have
	// an entry per host; its receiver chooses the entry by the host the
	// delivery names (workload.WebhookFormat.HostHeader), and takes a
	// delivery that names none as the public service's, or as its only
	// entry's.
	APIHost string
	// SecretRef, when set, is the Secret holding the webhook secrets
	// (keys WebhookSecretKey and WebhookOwnerKeyPrefix<owner>): it is
	// watched, so that a rotated secret takes effect without a restart,
	// and Secret and OwnerSecrets are ignored. Until it exists deliveries
	// get 503.
	SecretRef *types.NamespacedName
	// Secret is the webhook secret configured on the platform: the
	// fallback for owners without their own in OwnerSecrets. It needs
	// AllowSharedSecret.
	Secret []byte
	// OwnerSecrets are secrets per owner (organization, group or user, lower
	// case): deliveries about that owner's repositories verify with it
	// only (docs/security.md, "Webhook intake").
	OwnerSecrets map[string][]byte
	// AllowSharedSecret accepts a fallback secret (Secret, or the
	// Secret's key WebhookSecretKey), which every owner whose webhook uses
	// it can sign deliveries about every owner without its own key with.
	// Without it Setup refuses one (ErrSharedSecretNotAllowed), and an
	// edit of the Secret that adds one is invalid; with it the pools it
	// serves report WebhookSecretShared (docs/security.md, "Webhook
	// intake").
	AllowSharedSecret bool
}

// The manager's readiness checks (/readyz) of its HTTPS servers: each
// fails while its server does not serve, such as while it waits for a TLS
// certificate it can load (internal/httpsserver). Liveness (/healthz) never
// depends on them: a server without a certificate must not get the
// manager restarted, whose controllers keep running meanwhile.
const (
	ReadyzWebhookServer = "webhook-server"
	ReadyzAgentServer   = "agent-server"
)

// Components are the pieces Setup created, for tests and the dev
// environment.
type Components struct {
	Registry *hypervisors.Registry
	IPAM     *ipam.Manager
	Sweeper  *sweeper.Sweeper
	// DNS holds the clusters' DNS registrars.
	DNS *dnsreg.Clusters
	// Webhook is the webhook server, when Options.Webhook was set.
	Webhook *webhook.Server
	// AgentServer serves the agent binary, when Options.AgentServer was set.
	AgentServer *agentserver.Server
	// Resync compares pools with the CI platforms; nil when
	// Options.Bootstrap stands in for them.
	Resync *controller.PoolResync
	// Transitions are the VMs a hint put in transition, and
	// PowerOffNotices takes the VMs' notices (also served by AgentServer).
	Transitions     *hypervisors.Transitions
	PowerOffNotices *poweroff.Notices
}

// stuckBounds is b, or the defaults when unset.
func stuckBounds(b *stuck.Bounds) stuck.Bounds {
	if b == nil {
		return stuck.DefaultBounds()
	}
	return *b
}

// DefaultNamespace is the operator's namespace when Options.Namespace is
// empty, as the manager's --namespace flag defaults to it.
const DefaultNamespace = "hyperfleet-system"

// RegisteredFactories are the factories of the hypervisor kinds the
// binary's main registered (provider.Register), or an error saying none
// is: an operator without a hypervisor kind would refuse every cluster.
func RegisteredFactories() (map[hfv1.HypervisorProvider]provider.Factory, error) {
	kinds := provider.Registered()
	if len(kinds) == 0 {
		return nil, fmt.Errorf("no hypervisor kind is registered: the binary's main registers each one it ships (provider.Register)")
	}
	return provider.Factories(kinds), nil
}

// Setup registers indexes, controllers and the sweeper on mgr.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) (*Components, error) {
	if opts.Signer == nil {
		return nil, fmt.Errorf("an ownership signer is required")
	}
	if opts.Factories == nil {
		factories, err := RegisteredFactories()
		if err != nil {
			return nil, err
		}
		opts.Factories = factories
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	backends, err := newBackends(opts, mgr.GetLogger())
	if err != nil {
		return nil, err
	}
	ci := platformSeams(mgr, opts, backends)
	if err := fieldindex.Setup(ctx, mgr, backends); err != nil {
		return nil, fmt.Errorf("set up field indexes: %w", err)
	}
	// Before the controllers: the pools report which secret verifies
	// their owner's deliveries.
	var hooks webhookParsers
	if opts.Webhook != nil {
		if hooks, err = newWebhookParsers(ctx, mgr, opts.Webhook, backends); err != nil {
			return nil, err
		}
	}
	registry := hypervisors.NewRegistry()
	addresses := ipam.NewManager()
	// Each cluster's DNS registrar (spec.dns.dnsProvider): the cluster
	// controller builds and checks it, the claims and the sweep use it.
	dnsClusters := dnsreg.NewClusters()
	if opts.DNSProviders == nil {
		opts.DNSProviders = dnsreg.Registered()
	}
	// The back-ends that write DNSEndpoints do so directly through the API
	// server: a cache would watch a kind whose CRD may not be installed.
	dnsClient, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("create the DNS back-ends' client: %w", err)
	}
	dnsKube := &dnsreg.Kubernetes{Client: dnsClient, Namespace: cmp.Or(opts.Namespace, DefaultNamespace)}
	// Buffered so a poll that wakes many claims does not wait for the
	// claim controller's queue one event at a time.
	claimEvents := make(chan event.GenericEvent, 1024)
	// VMs a hint says are about to stop (docs/architecture.md, "Power-off
	// hints"); the agent server takes the VMs' own notices into it.
	transitions := hypervisors.NewTransitions(hypervisors.TransitionOptions{Observe: func(n int) { metrics.VMsInTransition.Set(float64(n)) }})
	notices := &poweroff.Notices{
		Reader: mgr.GetClient(), Signer: opts.Signer, Transitions: transitions, ClaimEvents: claimEvents,
		Clock: opts.Clock, Elected: mgr.Elected(), Log: mgr.GetLogger().WithName("poweroff-notices"),
		Jobs: poweroff.NewJobReports(), TokenRefusals: poweroff.NewTokenRefusals(), AttestationErrors: poweroff.NewAttestationErrors(),
		GuestRefusals: poweroff.NewGuestRefusals(), ReadyHints: poweroff.NewReadyHints(),
	}
	// VMs that attest with SPIRE get join tokens derived from the
	// ownership key (internal/identity) and fetch their credential from
	// the broker on the agent server.
	identities := identity.NewRegistry()
	identities.Dial, identities.ForcedRefreshInterval = opts.SPIREDial, opts.SPIREForcedRefreshInterval
	// Each claim's secrets are derived with the ownership key its status
	// records, so that a key rotation leaves VMs in flight as they are.
	issuer := &identity.Issuer{Keys: opts.Signer, Install: opts.Signer.OperatorID(), AgentUID: opts.SPIREAgentUID}
	var credBroker *broker.Broker
	if ci.credentials != nil && opts.AgentServer != nil {
		credBroker = &broker.Broker{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Clusters: mgr.GetClient(),
			Identity: identities, Issuer: ci.credentials, Proofs: issuer, Recorder: mgr.GetEventRecorderFor("credential-broker"), Clock: opts.Clock,
		}
	}
	// Before the controllers: they hand VMs the URLs and checksums it serves.
	var agentSrv *agentserver.Server
	var agent vmspec.AgentLocator // stays a nil interface without a server
	var brokerEndpoint machineclaim.BrokerEndpoint
	// What every isolation policy lets VMs reach of the operator: the
	// agent server's port (its broker and hints are on it too).
	var isolationOperator isolation.Operator
	if opts.AgentServer != nil {
		if isolationOperator, err = isolation.OperatorFromURL(opts.AgentServer.URL); err != nil {
			return nil, err
		}
		// VMs that attest with their TPM enroll it at the agent server
		// (internal/tpmenroll), every replica answering.
		enroll := &tpmenroll.Handler{
			Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Clusters: mgr.GetClient(), Secrets: mgr.GetClient(),
			Issuer: issuer, Recorder: mgr.GetEventRecorderFor("tpm-enrollment"), Clock: opts.Clock,
		}
		srv, err := newAgentServer(ctx, mgr, opts.AgentServer, credBroker, enroll, notices)
		if err != nil {
			return nil, err
		}
		agentSrv, agent = srv, srv
		notices.URL, notices.ReadyURL, notices.CA = srv.PowerOffURL(), srv.ReadyURL(), srv.CA
		if credBroker != nil {
			brokerEndpoint = endpoint{url: srv.BrokerURL(), ca: srv.CA}
		}
	}

	sw := &sweeper.Sweeper{
		Client:      mgr.GetClient(),
		APIReader:   mgr.GetAPIReader(),
		Registry:    registry,
		Recorder:    mgr.GetEventRecorderFor("orphan-sweeper"),
		Clock:       opts.Clock,
		Interval:    opts.SweepInterval,
		GracePeriod: opts.OrphanGracePeriod,
		DryRun:      opts.SweepDryRun,
		DNS:         dnsClusters,
		Identity:    identities,
	}
	if err := (&controller.HypervisorClusterReconciler{
		Client:        mgr.GetClient(),
		Registry:      registry,
		Factories:     opts.Factories,
		Signer:        opts.Signer,
		Recorder:      mgr.GetEventRecorderFor("hypervisorcluster-controller"),
		Clock:         opts.Clock,
		ClaimEvents:   claimEvents,
		Unverified:    sw,
		Identity:      identities,
		DNS:           dnsClusters,
		DNSFactories:  opts.DNSProviders,
		DNSKubernetes: dnsKube,
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up HypervisorCluster controller: %w", err)
	}
	if err := (&controller.HypervisorMachineTemplateReconciler{
		Client:    mgr.GetClient(),
		Registry:  registry,
		Recorder:  mgr.GetEventRecorderFor("hypervisormachinetemplate-controller"),
		Agent:     agent,
		Runners:   ci.releases,
		Workloads: backends,
		Identity:  controller.IdentitySupport{Issuer: issuer, Broker: brokerEndpoint},
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up HypervisorMachineTemplate controller: %w", err)
	}
	if err := (&controller.IPPoolReconciler{
		Client:   mgr.GetClient(),
		IPAM:     addresses,
		Recorder: mgr.GetEventRecorderFor("ippool-controller"),
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up IPPool controller: %w", err)
	}
	runners := machineclaim.NewRunnerObservations()
	if err := (&machineclaim.Reconciler{
		Client:      mgr.GetClient(),
		Registry:    registry,
		IPAM:        addresses,
		Signer:      opts.Signer,
		Recorder:    mgr.GetEventRecorderFor("machineclaim-controller"),
		Clock:       opts.Clock,
		CI:          ci.claims,
		ClaimEvents: claimEvents,
		Runners:     runners,
		Retry:       machineclaim.RetryDelays{First: opts.MinRetryDelay, Max: opts.MaxRetryDelay},
		Stuck:       stuck.Detector{Bounds: stuckBounds(opts.StuckBounds)},
		Agent:       agent,
		// The system's resolver finds the templates' proxies.
		IsolationOperator: isolationOperator,
		PowerOff:          machineclaim.PowerOff{Transitions: transitions, Notices: notices, GuestRefusals: notices.GuestRefusals},
		Vanished:          machineclaim.VanishedClaims{VMs: sw},
		DNS:               machineclaim.DNSRegistration{Clusters: dnsClusters},
		Identity: machineclaim.IdentityService{
			Servers: identities, Issuer: issuer, ScriptUser: opts.GenericScriptUser, Broker: brokerEndpoint,
			// Clusters with spec.spire.secretStore get their VMs' credentials
			// minted as the broker mints them, and written to the store.
			Credentials:   ci.credentials,
			TokenRefusals: notices.TokenRefusals, AttestationErrors: notices.AttestationErrors,
		},
	}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up MachineClaim controller: %w", err)
	}
	poolEvents := make(chan event.GenericEvent, 256)
	var backoff scaling.Backoff // zero: the controller's default
	if opts.ReplacementBackoff != nil {
		backoff = *opts.ReplacementBackoff
	}
	// One demand recorder for the webhook receiver, the resync and the
	// scale-set listeners: it remembers what it wrote (demand's written.go),
	// so a job the webhook recorded is not created again by the resync
	// (a refused create and a read, in the end-to-end request count).
	recorder := demand.NewRecorder(mgr.GetClient(), mgr.GetAPIReader(), opts.Clock)
	pools := &controller.RunnerPoolReconciler{
		Client:     mgr.GetClient(),
		Backoff:    backoff,
		Recorder:   mgr.GetEventRecorderFor("runnerpool-controller"),
		Clock:      opts.Clock,
		Jobs:       ci.jobs,
		Scopes:     ci.scopes,
		Workloads:  backends,
		PoolEvents: poolEvents,
		JobReports: notices.Jobs,
		// A burst's claims share their pool's status writes
		// (runnerpool_statusbatch.go).
		CountsInterval: poolCountsInterval,
	}
	if hooks != nil {
		pools.WebhookSecrets = hooks
	}
	if ci.providers != nil {
		// The runner scale-set listeners (internal/feeds), leader only,
		// beside the pool controller that starts and stops them.
		listeners := &feeds.Listeners{
			Recorder: recorder,
			Owner:    "hyperfleet-" + opts.Signer.OperatorID(),
			Wake: func(pool types.NamespacedName) {
				select {
				case poolEvents <- event.GenericEvent{Object: &hfv1.RunnerPool{ObjectMeta: metav1.ObjectMeta{Namespace: pool.Namespace, Name: pool.Name}}}:
				default:
					// A full channel wakes the pool soon enough.
				}
			},
			Log: mgr.GetLogger().WithName("scaleset-listeners"),
		}
		if err := mgr.Add(withManagerLogger(mgr, listeners)); err != nil {
			return nil, fmt.Errorf("add runner scale-set listeners: %w", err)
		}
		pools.Feeds, pools.Providers = listeners, ci.providers
	}
	if err := pools.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up RunnerPool controller: %w", err)
	}
	var resync *controller.PoolResync
	if ci.providers != nil {
		resync = &controller.PoolResync{
			Client:      mgr.GetClient(),
			Providers:   ci.providers,
			Backends:    backends,
			Router:      demand.NewRouter(mgr.GetClient(), backends),
			Recorder:    recorder,
			Runners:     runners,
			Events:      mgr.GetEventRecorderFor("runnerpool-resync"),
			Clock:       opts.Clock,
			ClaimEvents: claimEvents,
			PoolEvents:  poolEvents,
			Interval:    opts.ResyncInterval,
		}
		if err := mgr.Add(withManagerLogger(mgr, resync)); err != nil {
			return nil, fmt.Errorf("add RunnerPool resync: %w", err)
		}
	}
	sw.Signer = opts.Signer
	sw.Runners = ci.runners
	if err := mgr.Add(withManagerLogger(mgr, sw)); err != nil {
		return nil, fmt.Errorf("add orphan sweeper: %w", err)
	}
	if err := mgr.Add(withManagerLogger(mgr, controller.NewClaimPhaseCollector(mgr.GetClient()))); err != nil {
		return nil, fmt.Errorf("add claim phase metrics: %w", err)
	}
	comps := &Components{Registry: registry, IPAM: addresses, Sweeper: sw, DNS: dnsClusters, Resync: resync, AgentServer: agentSrv, Transitions: transitions, PowerOffNotices: notices}
	if opts.Webhook != nil {
		srv, err := newWebhookServer(mgr, opts, backends, ci.providers, hooks, recorder)
		if err != nil {
			return nil, err
		}
		comps.Webhook = srv
	}
	return comps, nil
}

// newBackends builds the CI platform back-ends: Options.Workloads, else
// the registered ones. Their own metrics go to the manager's registry.
func newBackends(opts Options, log logr.Logger) (*workload.Backends, error) {
	factories := opts.Workloads
	if factories == nil {
		factories = workload.Registered()
	}
	if len(factories) == 0 {
		return nil, fmt.Errorf("no CI platform is registered: the binary's main registers each one it ships (workload.Register)")
	}
	backends, err := workload.NewBackends(factories, workload.Dependencies{
		Transport: opts.WorkloadTransport, Clock: opts.Clock, Metrics: crmetrics.Registry,
		Logger: slog.New(logr.ToSlogHandler(log.WithName("workload"))),
	})
	if err != nil {
		return nil, fmt.Errorf("CI platforms: %w", err)
	}
	return backends, nil
}

// ciSeams are the controllers' ways to the CI platforms' accounts; a nil
// one means the operator does without.
type ciSeams struct {
	// claims are the claim reconciler's: the back-ends and the runners'
	// registrations.
	claims machineclaim.CIPlatforms
	// credentials mint the runner credentials of VMs that attest (the
	// broker's, and those written to secrets stores).
	credentials machineclaim.CredentialIssuer
	scopes      controller.ScopeVerifier
	jobs        controller.JobCanceller
	releases    controller.RunnerReleaseSource
	providers   controller.PoolProviders
	runners     sweeper.RunnerScopes
}

// poolCountsInterval is how long a pool's moving replica and job counts
// wait for the next status write (controller.RunnerPoolReconciler.
// CountsInterval): what a person watching kubectl get runnerpools sees
// lags by at most this.
const poolCountsInterval = 10 * time.Second

// platformSeams wires every seam to the back-ends' accounts, or, when a
// test stands in for them (Options.Bootstrap), only those it covers (the
// claims' with the real back-ends, the credentials when it mints them,
// the scopes).
func platformSeams(mgr ctrl.Manager, opts Options, backends *workload.Backends) ciSeams {
	if opts.Bootstrap != nil {
		credentials, _ := opts.Bootstrap.(machineclaim.CredentialIssuer)
		return ciSeams{claims: standInCI{opts.Bootstrap, backends}, credentials: credentials, scopes: opts.Bootstrap}
	}
	w := &workloads.Platforms{Client: newCredentialReads(mgr.GetClient(), mgr.GetCache()), Backends: backends, Signer: opts.Signer}
	return ciSeams{claims: w, credentials: w, scopes: w, jobs: w, releases: w, providers: w, runners: w}
}

// webhookParsers are the receivers' parsers, one per platform whose
// webhooks are received. As controller.WebhookSecrets they tell each pool
// how its owner's deliveries are verified.
type webhookParsers []*rotatingParser

// WebhookSecretOf implements controller.WebhookSecrets.
func (ps webhookParsers) WebhookSecretOf(platform hfv1.WorkloadType, host, owner string) (controller.WebhookSecretUse, bool) {
	for _, p := range ps {
		if use, ok := p.WebhookSecretOf(platform, host, owner); ok {
			return use, true
		}
	}
	return controller.WebhookSecretUse{}, false
}

// byPlatform groups the parsers by platform, each platform's by host, in
// the order their platforms first appear.
func (ps webhookParsers) byPlatform() []*hostParsers {
	var out []*hostParsers
	seen := map[hfv1.WorkloadType]*hostParsers{}
	for _, p := range ps {
		hp := seen[p.platform]
		if hp == nil {
			hp = &hostParsers{format: p.receiver.WebhookFormat(), byHost: map[string]*rotatingParser{}}
			seen[p.platform] = hp
			out = append(out, hp)
		}
		hp.byHost[p.host] = p
	}
	return out
}

// newWebhookParsers builds the parser of each platform in w.Platforms (an
// empty list: the only back-end that receives webhooks, whose secrets
// must then come from a one-entry list). Each platform's secrets are its
// entry's, or those of the Secret it names, watched.
func newWebhookParsers(ctx context.Context, mgr ctrl.Manager, w *WebhookOptions, backends *workload.Backends) (webhookParsers, error) {
	if len(w.Platforms) == 0 {
		return nil, fmt.Errorf("webhooks: name at least one CI platform and its webhook secrets")
	}
	var parsers webhookParsers
	type platformHost struct {
		platform hfv1.WorkloadType
		host     string
	}
	seen := map[platformHost]bool{}
	for i := range w.Platforms {
		p, err := webhookParser(ctx, mgr, &w.Platforms[i], len(w.Platforms) == 1, backends)
		if err != nil {
			return nil, err
		}
		key := platformHost{p.platform, p.host}
		if seen[key] {
			return nil, fmt.Errorf("webhooks of workload type %s from %s are configured twice", p.platform, hostName(p.host))
		}
		seen[key] = true
		parsers = append(parsers, p)
	}
	return parsers, nil
}

// webhookParser is the parser of one platform whose webhooks are
// received: w.Platform's, else (only) the only back-end that receives
// any. Its secrets are w's, or those of the Secret w names, watched.
func webhookParser(ctx context.Context, mgr ctrl.Manager, w *WebhookPlatform, only bool, backends *workload.Backends) (*rotatingParser, error) {
	var receivers []hfv1.WorkloadType
	for _, t := range backends.Types() {
		be, _ := backends.For(t)
		if _, ok := be.(workload.WebhookReceiver); ok && (w.Platform == "" || w.Platform == t) {
			receivers = append(receivers, t)
		}
	}
	switch {
	case len(receivers) == 0 && w.Platform != "":
		return nil, fmt.Errorf("webhooks of workload type %s: no registered CI platform of that type receives webhooks", w.Platform)
	case len(receivers) == 0:
		return nil, fmt.Errorf("webhooks: no registered CI platform receives webhooks")
	case len(receivers) > 1 || (w.Platform == "" && !only):
		return nil, fmt.Errorf("webhooks: %d CI platforms receive webhooks (%v); name each receiver's platform", len(receivers), receivers)
	}
	be, _ := backends.For(receivers[0])
	recv := be.(workload.WebhookReceiver)
	host := ""
	if w.APIHost != "" {
		// Written as templates' URLs are compared (Scope.Host), the
		// public service's as empty.
		host = workload.NormalizeHost(w.APIHost)
		if slices.Contains(recv.WebhookFormat().PublicHosts, host) {
			host = ""
		}
	}
	parser := &rotatingParser{receiver: recv, platform: receivers[0], host: host, allowShared: w.AllowSharedSecret}
	if w.SecretRef == nil {
		if len(w.Secret) == 0 && len(w.OwnerSecrets) == 0 {
			return nil, fmt.Errorf("the %s webhook receiver needs the webhook secret configured on the CI platform (a fallback secret or one per owner)", parser.platform)
		}
		if len(w.Secret) > 0 && !w.AllowSharedSecret {
			return nil, sharedSecretRefused("the webhook options hold a fallback Secret", "it")
		}
		parser.source = "the manager's webhook options"
		owners := make(map[string][]byte, len(w.OwnerSecrets))
		for login, secret := range w.OwnerSecrets {
			owners[strings.ToLower(login)] = secret
		}
		secrets := &WebhookSecrets{Global: w.Secret, Owners: owners}
		parser.set(secrets)
		logSharedSecret(mgr.GetLogger().WithName("webhook"), secrets)
		return parser, nil
	}
	parser.source = "Secret " + w.SecretRef.String()
	if err := watchWebhookSecret(ctx, mgr, *w.SecretRef, parser); err != nil {
		return nil, fmt.Errorf("watch the webhook Secret %s: %w", w.SecretRef, err)
	}
	return parser, nil
}

// newWebhookServer builds a receiver per parser and adds their server to
// the manager. Events are confirmed with the pools' accounts (providers);
// nil providers (a test's stand-in) leave them unconfirmed.
func newWebhookServer(mgr ctrl.Manager, opts Options, backends *workload.Backends, providers controller.PoolProviders, parsers webhookParsers, recorder *demand.Recorder) (*webhook.Server, error) {
	w := opts.Webhook
	router := demand.NewRouter(mgr.GetClient(), backends)
	if providers != nil {
		readers := &controller.PoolJobReaders{Client: mgr.GetClient(), Providers: providers}
		recorder.ConfirmWebhookEvents(readers, w.MaxEventAge)
		// Events without the job's labels (GitLab's Job Hooks) are
		// routed after reading the job with a pool's account.
		router.ReadJobsWith(readers)
	} else {
		mgr.GetLogger().WithName("webhook").Info("webhook events are recorded without confirmation: a stand-in replaces the CI platforms' accounts")
	}
	platforms := parsers.byPlatform()
	receivers := make([]*webhook.Receiver, 0, len(platforms))
	for _, parser := range platforms {
		recv, err := webhook.NewReceiver(webhook.Options{
			Format:       parser.format,
			Parser:       parser,
			Router:       router,
			Recorder:     recorder,
			Events:       mgr.GetEventRecorderFor("hyperfleet-webhook"),
			MaxBodyBytes: w.MaxBodyBytes,
			MaxInFlight:  w.MaxInFlight,
			Logger:       mgr.GetLogger().WithName("webhook").WithValues("platform", parser.format.Label),
			Clock:        opts.Clock,
		})
		if err != nil {
			return nil, fmt.Errorf("webhook receiver of %s: %w", parser.format.Label, err)
		}
		receivers = append(receivers, recv)
	}
	srv, err := webhook.NewServer(webhook.ServerOptions{
		Addr: w.Addr, CertFile: w.CertFile, KeyFile: w.KeyFile, Receivers: receivers, Limits: w.Limits,
		Logger: mgr.GetLogger().WithName("webhook"),
	})
	if err != nil {
		return nil, fmt.Errorf("webhook server: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return nil, fmt.Errorf("add webhook server: %w", err)
	}
	if err := mgr.AddReadyzCheck(ReadyzWebhookServer, srv.Check); err != nil {
		return nil, fmt.Errorf("add the webhook server's readiness check: %w", err)
	}
	return srv, nil
}

// newAgentServer hashes the agent binaries and adds their server to the
// manager. The broker and the enrollment are served while some
// HypervisorCluster configures them (vmEndpoints).
func newAgentServer(ctx context.Context, mgr ctrl.Manager, o *AgentServerOptions, credBroker *broker.Broker, enroll http.Handler, notices agentserver.PowerOffReceiver) (*agentserver.Server, error) {
	var missing []string
	for _, f := range []struct{ name, value string }{
		{"Addr", o.Addr}, {"CertFile", o.CertFile}, {"KeyFile", o.KeyFile}, {"Dir", o.Dir}, {"URL", o.URL},
	} {
		if f.value == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("the agent server needs %s", strings.Join(missing, ", "))
	}
	endpoints, err := watchVMEndpoints(ctx, mgr)
	if err != nil {
		return nil, err
	}
	so := agentserver.Options{
		Dir: o.Dir, URL: o.URL, CAFile: o.CAFile, Addr: o.Addr, CertFile: o.CertFile, KeyFile: o.KeyFile,
		Logger: mgr.GetLogger().WithName("agent-server"), PowerOff: notices, Limits: o.Limits, TPMEnrollment: enroll,
		DownloadTimeout: o.DownloadTimeout, BrokerServed: endpoints.Broker, TPMServed: endpoints.TPM,
	}
	if credBroker != nil {
		so.Broker = credBroker
	}
	srv, err := agentserver.New(so)
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(srv); err != nil {
		srv.Close()
		return nil, fmt.Errorf("add agent server: %w", err)
	}
	if err := mgr.AddReadyzCheck(ReadyzAgentServer, srv.Check); err != nil {
		return nil, fmt.Errorf("add the agent server's readiness check: %w", err)
	}
	return srv, nil
}

// endpoint is the broker as VMs reach it; its CA is read when asked, as
// the agent server may read its CA file after the start.
type endpoint struct {
	url string
	ca  func() string
}

func (e endpoint) URL() string { return e.url }
func (e endpoint) CA() string  { return e.ca() }
