// Command hyperfleet is the HyperFleet operator binary: `hyperfleet manager`
// reads its flags (and the environment and settings file,
// internal/settings), loads or creates the ownership Secret and starts the
// manager that internal/manager wires; it registers the hypervisor kinds,
// CI platforms and DNS back-ends it ships (provider.Register,
// workload.Register, dnsreg.Register). It links no test world
// (deps_test.go).
//
//	hyperfleet manager [flags]   run the controllers (the container's entrypoint)
//
// The local world (simulators, an embedded API server) is a binary of its
// own, cmd/hyperfleet-dev, so that this one links no test code
// (deps_test.go keeps it so).
package main

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/demand"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/externaldns"
	"github.com/hyperfleet/hyperfleet/internal/dnsreg/rfc2136"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/metrics"
	"github.com/hyperfleet/hyperfleet/internal/settings"
	"github.com/hyperfleet/hyperfleet/internal/webhook"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/libvirt"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload/generic"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// The hypervisor kinds this binary ships, by spec.provider, its CI
// platforms, by workload type (spec.workload.type), and its DNS back-ends,
// by spec.dns.dnsProvider.type, all through one mechanism (pkg/registry).
// Supporting another is its package under pkg/provider (pkg/workload,
// internal/dnsreg) and one line here.
func init() {
	provider.Register(hfv1.ProviderProxmox, proxmox.Kind)
	provider.Register(hfv1.ProviderLibvirt, libvirt.Kind)
	workload.Register(hfv1.WorkloadGitHubActions, github.NewBackend)
	workload.Register(hfv1.WorkloadGeneric, generic.NewBackend)
	workload.Register(hfv1.WorkloadBuildkite, buildkite.NewBackend)
	workload.Register(hfv1.WorkloadGitLabCI, gitlab.NewBackend)
	dnsreg.Register(dnsreg.TypeRFC2136, rfc2136.Factory)
	for _, t := range dnsreg.ExternalDNSTypes {
		dnsreg.Register(t, externaldns.Factory(t))
	}
}

func main() {
	plugin := isKubectlPlugin(os.Args[0])
	if len(os.Args) < 2 || (plugin && !pluginCommands[os.Args[1]]) {
		usage()
		os.Exit(2)
	}
	switch os.Args[1] {
	case "why":
		if err := runWhy(context.Background(), os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "hyperfleet why:", err)
			os.Exit(1)
		}
	case "status":
		if err := runStatus(context.Background(), os.Args[2:], os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, "hyperfleet status:", err)
			os.Exit(1)
		}
	case "manager":
		if err := runManager(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "hyperfleet manager:", err)
			os.Exit(1)
		}
	case "dev":
		// Was a command of this binary; say where it went rather than
		// "unknown command" to someone following an older note.
		fmt.Fprintln(os.Stderr, "hyperfleet: the local world is its own binary now: make dev, or go run ./cmd/hyperfleet-dev [flags]")
		os.Exit(2)
	case "proxmox-kit":
		if err := printProxmoxKit(os.Stdout, os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "hyperfleet proxmox-kit:", err)
			os.Exit(2)
		}
	case "tpm-devid-ca":
		if err := printDevIDCA(os.Stdout, os.Args[2:], time.Now()); err != nil {
			fmt.Fprintln(os.Stderr, "hyperfleet tpm-devid-ca:", err)
			os.Exit(2)
		}
	case "version", "--version":
		// What hyperfleet_build_info reports, for a shell.
		b := metrics.Build()
		fmt.Printf("hyperfleet %s (revision %s, %s)\n", b[0], b[1], b[2])
	case "-h", "--help", "help":
		usage()
	default:
		fmt.Fprintf(os.Stderr, "hyperfleet: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
}

func usage() {
	if isKubectlPlugin(os.Args[0]) {
		fmt.Fprint(os.Stderr, `Usage: kubectl hyperfleet <command> [flags]

Commands:
  why      why a job (id or URL), pool/NAME or claim/NAME is not running: the
           chain from demand to VM and the reason it is blocked, with the fix
  status   RunnerPools and HypervisorClusters at a glance
  version  print the version

Run "kubectl hyperfleet <command> -h" for the command's flags.
`)
		return
	}
	fmt.Fprint(os.Stderr, `Usage: hyperfleet <command> [flags]

Commands:
  why          why a job (id or URL), pool/NAME or claim/NAME is not running: the
               chain from demand to VM and the reason it is blocked, with the fix
               (also kubectl hyperfleet why, installed as kubectl-hyperfleet)
  status       RunnerPools and HypervisorClusters at a glance
  manager      run the HyperFleet operator (controllers, poller, orphan sweeper)
  proxmox-kit  print the static cloud-config snippet templates with
               spec.cloudInit.delivery: proxmox need on a snippets storage
  tpm-devid-ca print a new DevID CA as the Secret spec.spire.tpm.devIDCASecretRef
               names (TPM attestation, docs/identity.md)
  version      print the version, VCS revision and Go version (hyperfleet_build_info's labels)

The whole loop on this machine (API server, simulators, operator, agent) is
another binary: make dev, or go run ./cmd/hyperfleet-dev.

Run "hyperfleet <command> -h" for the command's flags.
`)
}

func runManager(args []string) error {
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	metricsFlags := bindMetricsFlags(fs)
	probeAddr := fs.String("health-probe-bind-address", ":8081", "address the /healthz and /readyz endpoints bind to")
	pprofAddr := fs.String("pprof-bind-address", "0", "address Go's /debug/pprof profiles are served on (plain HTTP, no authentication: bind it to localhost); 0 disables it")
	leaderElect := fs.Bool("leader-elect", true, "elect a leader so that only one replica reconciles")
	lease := leaderElectionFlags{}
	fs.DurationVar(&lease.duration, "leader-elect-lease-duration", defaultLeaseDuration, "how long a standby waits, after the leader last renewed the lease, before it takes over (a crashed leader's controllers pause this long)")
	fs.DurationVar(&lease.renewDeadline, "leader-elect-renew-deadline", defaultRenewDeadline, "how long the leader keeps trying to renew the lease before it gives up leadership and exits; below --leader-elect-lease-duration")
	fs.DurationVar(&lease.retryPeriod, "leader-elect-retry-period", defaultRetryPeriod, "how often replicas try to acquire or renew the lease")
	namespace := fs.String("namespace", envOr("POD_NAMESPACE", "hyperfleet-system"), "namespace of the operator (ownership Secret, leader lease)")
	secretNamespaces := fs.String("secret-namespaces", "", "comma-separated namespaces whose Secrets HyperFleet objects reference (cluster credentials, template credentials): the manager watches Secrets there only, and its ServiceAccount needs the hyperfleet-secret-reader ClusterRole bound in each (docs/operations.md); --namespace is always one; * watches every namespace (bind the ClusterRole cluster-wide)")
	ownershipSecret := fs.String("ownership-secret", "hyperfleet-ownership", "Secret (in --namespace) with the HMAC key that signs VM ownership; created on first start")
	allowNewKey := fs.Bool("allow-new-ownership-key", false, "when the ownership Secret is missing, create a new key even if the HypervisorClusters hold VMs tagged by a HyperFleet install (hf-<--operator-id>, or any \"hyperfleet\" tag without --operator-id) or cannot be listed; those VMs then stay foreign and must be removed by hand")
	operatorID := fs.String("operator-id", "", "id of this install in VM tags (hf-<id>) and ownership markers; default: the one stored in the ownership Secret, or a random one on first start")
	sweepInterval := fs.Duration("orphan-sweep-interval", time.Minute, "how often the orphan sweeper runs")
	maxRetryDelay := fs.Duration("claim-max-retry-delay", 5*time.Minute, "longest wait between retries of a MachineClaim step after transient hypervisor errors (the wait doubles from 2s up to this)")
	resyncInterval := fs.Duration("runnerpool-resync-interval", 30*time.Second, "how often RunnerPools compare runner states and queued jobs with the CI platform (one call set per credential scope)")
	bounds := stuck.DefaultBounds()
	fs.DurationVar(&bounds.Pending, "claim-stuck-pending", bounds.Pending, "a MachineClaim in phase Pending longer than this is reported Stuck (condition, event, hyperfleet_claims_stuck); 0 disables")
	fs.DurationVar(&bounds.Provisioning, "claim-stuck-provisioning", bounds.Provisioning, "the same for phase Provisioning")
	fs.DurationVar(&bounds.Bootstrapping, "claim-stuck-bootstrapping", bounds.Bootstrapping, "the same for phase Bootstrapping")
	fs.DurationVar(&bounds.Draining, "claim-stuck-draining", bounds.Draining, "the same for phase Draining")
	fs.DurationVar(&bounds.Terminating, "claim-stuck-terminating", bounds.Terminating, "the same for phase Terminating")
	orphanGrace := fs.Duration("orphan-grace-period", 10*time.Minute, "how long an orphaned VM is left alone before it is destroyed")
	sweepDryRun := fs.Bool("orphan-sweep-dry-run", false, "only report orphaned VMs (events, logs, metrics); never destroy them")
	webhookAddr := fs.String("webhook-bind-address", ":9292", "HTTPS address of the CI platforms' webhook receivers (each at its platform's path, such as /webhooks/gitlab); 0 disables it")
	webhookCertDir := fs.String("webhook-cert-dir", "/etc/hyperfleet/webhook-tls", "directory with the receiver's tls.crt and tls.key (reloaded when they change)")
	webhookFlags, err := bindWebhookFlags(fs)
	if err != nil {
		return err
	}
	webhookMaxBody := fs.Int64("webhook-max-body-bytes", webhook.DefaultMaxBodyBytes, "largest webhook delivery accepted; larger ones get 413")
	webhookMaxEventAge := fs.Duration("webhook-max-event-age", demand.DefaultMaxEventAge, "webhook events older than this (by the CI platform's time) are confirmed with the platform's API before they change demand, as are completions of jobs not known to be running")
	webhookMaxInFlight := fs.Int("webhook-max-in-flight", webhook.DefaultMaxInFlight, "webhook deliveries read and verified at once (a quarter of them for bodies over 64 KiB); beyond it deliveries get 503 before their body is read")
	var webhookLimits httpsserver.Limits
	bindLimitFlags(fs, "webhook", "the webhook receiver", &webhookLimits, webhook.DefaultLimits)
	spireForcedRefresh := fs.Duration("spire-forced-refresh-interval", identity.DefaultForcedRefreshInterval, "shortest time between two reads of a SPIRE server's trust bundle that a certificate failing verification at the credential broker may force (anyone can present one); the reads about once a minute are not limited by it")
	scriptUser := fs.String("generic-script-user", agentconfig.DefaultRunnerUser, "user a generic workload's VMs run their script as (a user name of the image, such as runner): the agent runs the script as this user, and the VMs' SPIRE registration entries select it (unix:user:<name>), so that only the script gets the VM's SVID (docs/generic.md)")
	jobMetricsLabels := fs.Int("job-metrics-max-label-values", metrics.DefaultJobLabelValues, "per RunnerPool, how many repository and workflow pairs get series of their own in hyperfleet_job_queue_seconds and hyperfleet_job_run_seconds, and how many repositories in hyperfleet_vm_seconds_total; later ones are counted under __other__ (docs/operations.md, \"Job and chargeback metrics\")")
	agentFlags := bindAgentServerFlags(fs)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	sources, err := settings.Parse(fs, args, os.Environ())
	if err != nil {
		return err
	}
	if err := lease.check(); err != nil {
		return err
	}
	for _, w := range webhookFlags {
		if err := checkAPIHost("--"+w.format.Operator.Name+"-webhook-api-host", *w.apiHost); err != nil {
			return err
		}
	}
	if err := checkMaxEventAge(*webhookMaxEventAge); err != nil {
		return err
	}
	if err := checkScriptUser(*scriptUser); err != nil {
		return err
	}
	if err := metrics.SetJobLabelLimit(*jobMetricsLabels); err != nil {
		return err
	}
	if *spireForcedRefresh <= 0 {
		return fmt.Errorf("--spire-forced-refresh-interval is %s: set it above 0 (%s by default), so that certificates anyone can present do not make the operator read SPIRE's trust bundle at will", *spireForcedRefresh, identity.DefaultForcedRefreshInterval)
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")
	logSettings(log, fs, sources)
	agentServer, err := agentFlags.options()
	if err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := hfv1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("find the Kubernetes API: %w", err)
	}
	metrics.CountKubeAPIRequests(cfg)
	mgrOpts := ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsFlags.options(),
		HealthProbeBindAddress:  *probeAddr,
		PprofBindAddress:        *pprofAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "hyperfleet-manager.hyperfleet.io",
		LeaderElectionNamespace: *namespace,
		LeaseDuration:           &lease.duration,
		RenewDeadline:           &lease.renewDeadline,
		RetryPeriod:             &lease.retryPeriod,
		// A leader stopped on purpose (a rollout, a drain) gives the lease
		// up instead of letting it run out: the standby takes over within
		// a retry period rather than a lease duration. Safe because the
		// process exits as soon as the manager returns (runManager).
		LeaderElectionReleaseOnCancel: true,
	}
	manager.ConfigureSecretReads(&mgrOpts, parseSecretNamespaces(*secretNamespaces, *namespace))
	mgr, err := ctrl.NewManager(cfg, mgrOpts)
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	signer, err := manager.LoadOrCreateSigner(ctx, direct, manager.SignerOptions{
		Namespace: *namespace, Name: *ownershipSecret, OperatorID: *operatorID, AllowNewKey: *allowNewKey,
	})
	if err != nil {
		return err
	}
	log.Info("Ownership marker ready", "operatorId", signer.OperatorID(), "tag", signer.OperatorTag(),
		"signingKey", signer.SigningKeyID(), "keys", signer.KeyIDs())
	opts := manager.Options{
		Signer:            signer,
		Namespace:         *namespace,
		SweepInterval:     *sweepInterval,
		ResyncInterval:    *resyncInterval,
		MaxRetryDelay:     *maxRetryDelay,
		StuckBounds:       &bounds,
		OrphanGracePeriod: *orphanGrace,
		SweepDryRun:       *sweepDryRun,
		AgentServer:       agentServer,

		SPIREForcedRefreshInterval: *spireForcedRefresh,
		GenericScriptUser:          *scriptUser,
	}
	if *webhookAddr != "0" {
		// Each Secret is watched: creating or rotating it takes effect
		// without a restart; until it exists deliveries get 503.
		receivers := make([]webhookReceiver, 0, len(webhookFlags))
		for _, w := range webhookFlags {
			receivers = append(receivers, w.receiver())
		}
		platforms, err := webhookPlatforms(log, *namespace, receivers)
		if err != nil {
			return err
		}
		opts.Webhook = &manager.WebhookOptions{
			Addr:         *webhookAddr,
			MaxBodyBytes: *webhookMaxBody, MaxInFlight: *webhookMaxInFlight, MaxEventAge: *webhookMaxEventAge, Limits: webhookLimits,
			CertFile: filepath.Join(*webhookCertDir, "tls.crt"), KeyFile: filepath.Join(*webhookCertDir, "tls.key"),
			Platforms: platforms,
		}
		log.Info("Webhook receiver configured", "address", *webhookAddr, "platforms", len(platforms))
		if msg := missingWebhookCertificate(*webhookCertDir, *namespace); msg != "" {
			log.Info(msg)
		}
	}
	if _, err := manager.Setup(ctx, mgr, opts); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	log.Info("Starting manager")
	return mgr.Start(ctx)
}

// webhookFlag is one CI platform's webhook flags, bound for every
// registered back-end that receives webhooks (workload.WebhookReceiver),
// as its format describes them (workload.WebhookFlags).
type webhookFlag struct {
	platform      hfv1.WorkloadType
	format        workload.WebhookFormat
	secret        *string
	allowFallback *bool
	apiHost       *string
}

// bindWebhookFlags binds the webhook flags of every registered CI platform
// whose back-end receives webhooks, in workload type order. The back-ends
// are built here without dependencies only to ask them their format: a
// factory called so registers nothing and calls nothing.
func bindWebhookFlags(fs *flag.FlagSet) ([]webhookFlag, error) {
	backends, err := workload.NewBackends(workload.Registered(), workload.Dependencies{})
	if err != nil {
		return nil, fmt.Errorf("read the CI platforms' webhook formats: %w", err)
	}
	var out []webhookFlag
	for _, t := range backends.Types() {
		be, _ := backends.For(t)
		recv, ok := be.(workload.WebhookReceiver)
		if !ok {
			continue
		}
		f := recv.WebhookFormat()
		o := f.Operator
		secretFlag := o.Name + "-webhook-secret"
		out = append(out, webhookFlag{
			platform: t, format: f,
			secret: fs.String(secretFlag, o.DefaultSecret, "Secret (in --namespace) with the "+f.Platform+" webhooks' secrets: keys "+o.OwnerKeys+
				" and, with --"+o.Name+"-webhook-allow-fallback-secret, key webhook-secret (the fallback for every other "+o.Owners+
				"); empty receives no "+f.Platform+" webhooks ("+o.Docs+")"),
			allowFallback: fs.Bool(o.Name+"-webhook-allow-fallback-secret", false, "accept key webhook-secret of --"+secretFlag+
				", a fallback secret shared by every "+o.Owners+" without a key of its own: whoever holds it can sign deliveries about all of them, "+
				"so their in_progress and completed events are confirmed with "+f.Platform+" (one API call per job); without this flag such a Secret stops the manager at start"),
			apiHost: fs.String(o.Name+"-webhook-api-host", "", "API host (host or host:port) of the "+f.Platform+" instance whose deliveries the webhook Secret's secrets verify, such as "+
				o.ExampleHost+"; empty (the default) is "+o.PublicService+". Jobs of its deliveries route only to RunnerPools whose template's API is on that host "+
				"(docs/security.md, \"The API host is part of the scope\")"),
		})
	}
	return out, nil
}

// receiver is w's receiver, as its flags say.
func (w webhookFlag) receiver() webhookReceiver {
	return webhookReceiver{platform: w.platform, flag: w.format.Operator.Name + "-webhook-secret", path: w.format.Path,
		secret: *w.secret, allowFallback: *w.allowFallback, apiHost: *w.apiHost}
}

// webhookReceiver is one CI platform's webhook flags: its receiver's
// path, the Secret with its webhooks' secrets (empty: its webhooks are
// not received) and the flag naming it, whether that Secret's fallback
// key is accepted, and the API host whose deliveries it verifies.
type webhookReceiver struct {
	platform      hfv1.WorkloadType
	flag, path    string
	secret        string
	allowFallback bool
	apiHost       string
}

// webhookPlatforms are the platforms of the receivers whose Secret is
// named, in order, each logged. With none the receiver would serve no
// platform yet wait for its certificate (and hold the pod's readiness on
// it): an error that says to turn it off instead.
func webhookPlatforms(log logr.Logger, namespace string, receivers []webhookReceiver) ([]manager.WebhookPlatform, error) {
	var out []manager.WebhookPlatform
	var flags []string
	for _, r := range receivers {
		flags = append(flags, "--"+r.flag)
		if r.secret == "" {
			continue
		}
		out = append(out, manager.WebhookPlatform{
			Platform: r.platform, APIHost: r.apiHost, AllowSharedSecret: r.allowFallback,
			SecretRef: &types.NamespacedName{Namespace: namespace, Name: r.secret},
		})
		log.Info("Webhook receiver of "+string(r.platform)+" configured", "path", r.path, "secret", namespace+"/"+r.secret,
			"apiHost", r.apiHost, "fallbackSecretAccepted", r.allowFallback)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the webhook receiver is on (--webhook-bind-address) but receives no platform's webhooks: "+
			"name a Secret with %s, or turn the receiver off with --webhook-bind-address=0 (GitHub's scale-set mode needs none)", strings.Join(flags, ", "))
	}
	return out, nil
}

// missingWebhookCertificate says what the pod's readiness waits for when
// the receiver's certificate is not in dir at start (the receiver's own
// log names only the files): the Secret that the chart mounts there, how
// to create it, and how to run without a receiver. Empty when it is there.
func missingWebhookCertificate(dir, namespace string) string {
	if _, err := os.Stat(filepath.Join(dir, "tls.crt")); err == nil {
		return ""
	}
	return fmt.Sprintf("The webhook receiver's certificate is not in %s: the receiver does not serve, and the pod is not Ready, until it is there. "+
		"With the chart it is the Secret webhook.tls.secretName (default <release>-webhook-tls): "+
		"kubectl create secret tls hyperfleet-webhook-tls --namespace %s --cert=webhook.crt --key=webhook.key, or webhook.certificate.enabled with cert-manager. "+
		"Without inbound webhooks (GitHub's scale-set mode) turn the receiver off: webhook.enabled=false (--webhook-bind-address=0)", dir, namespace)
}

// completedJobRetention is how long a completed CIJob is kept
// (docs/runnerpool.md): within it, a replayed event about a finished job
// finds the record of its completion and changes nothing.
const completedJobRetention = 15 * time.Minute

// checkAPIHost refuses a webhook API host flag that is not a host with
// an optional port (a URL, a path), naming the flag and the form.
func checkAPIHost(flag, host string) error {
	if host == "" {
		return nil
	}
	if u, err := url.Parse("https://" + host); err != nil || u.Host != host || u.Hostname() == "" || strings.ContainsAny(host, "/?#@") {
		return fmt.Errorf("%s is %q: give a host name or address with an optional port, such as ghes.example.com or gitlab.example.com:8443, without a scheme or path", flag, host)
	}
	return nil
}

// checkMaxEventAge refuses an age bound beyond the completed CIJobs'
// retention: an unconfirmed replay of an event older than the record of
// its job's completion would create demand again.
func checkMaxEventAge(d time.Duration) error {
	if d <= 0 || d > completedJobRetention {
		return fmt.Errorf("--webhook-max-event-age is %s: set it above 0 and at most %s (how long completed CIJobs are kept), so that older events are confirmed with the CI platform", d, completedJobRetention)
	}
	return nil
}

// checkScriptUser refuses a --generic-script-user that is not a portable
// user name: it goes into SPIRE selectors and the VMs' agent configs, and
// the agent would refuse it in every VM.
func checkScriptUser(name string) error {
	if !agentconfig.ValidUserName(name) {
		return fmt.Errorf("--generic-script-user is %q: set a user name of the VM image (a lower-case letter or _, then up to 31 lower-case letters, digits, _ or -), %s by default", name, agentconfig.DefaultRunnerUser)
	}
	return nil
}

// parseSecretNamespaces is --secret-namespaces with --namespace added,
// sorted and without repeats; nil (every namespace) for *.
func parseSecretNamespaces(flagValue, namespace string) []string {
	out := []string{namespace}
	for ns := range strings.SplitSeq(flagValue, ",") {
		switch ns = strings.TrimSpace(ns); ns {
		case "*":
			return nil
		case "":
		default:
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// logSettings logs every setting that is not its default, with where it
// came from (flag, environment or settings file); no flag holds a secret.
func logSettings(log logr.Logger, fs *flag.FlagSet, sources map[string]settings.Source) {
	var kv []any
	fs.VisitAll(func(f *flag.Flag) {
		if src := sources[f.Name]; src != settings.SourceDefault && src != "" {
			kv = append(kv, f.Name, fmt.Sprintf("%s (%s)", f.Value, src))
		}
	})
	log.Info("Settings that are not their default", kv...)
}
