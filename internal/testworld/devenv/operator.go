package devenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
)

// What the world's operator runs with, in-process or not: a quick resync,
// a sweep that shows leftovers (and the sweeper's metrics) within seconds,
// and retries that do not sit out a five-minute backoff after a run of
// injected faults.
const (
	resyncInterval = 5 * time.Second
	sweepInterval  = 10 * time.Second
	maxRetryDelay  = 10 * time.Second
)

// agentPlatform is the platform of the agent the guests run: the host's,
// since guests are processes on it (the template's runner is linux/x64).
const agentPlatform = "linux-amd64"

// agentTLSFiles are the agent server's serving certificate, key and CA,
// as a kubernetes.io/tls Secret holds them.
type agentTLSFiles struct {
	certFile, keyFile, caFile string
}

// writeAgentServerCert creates the agent server's certificate for
// 127.0.0.1, where the guests reach it.
func (w *World) writeAgentServerCert() error {
	c, err := selfsigned.New("127.0.0.1", "localhost", w.guestHost())
	if err != nil {
		return fmt.Errorf("devenv: agent server certificate: %w", err)
	}
	dir := filepath.Join(w.opts.Dir, "agent-tls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	f := &w.agentTLS
	if f.certFile, f.keyFile, f.caFile, err = c.WriteDir(dir); err != nil {
		return fmt.Errorf("devenv: agent server certificate: %w", err)
	}
	return nil
}

// runAgent is what systemd would start from the unit the operator's
// cloud-init wrote, with the paths of a simulated guest (the files
// cloud-init wrote are under $HF_SIM_ROOT) and the simulator's power
// button instead of systemctl poweroff. The runner runs as the agent's
// user (there is no "runner" account in a simulated guest).
const runAgent = `exec "$agent" --config "$HF_SIM_ROOT` + cloudinit.AgentConfigPath + `" --root "$HF_SIM_ROOT" --run-as "" --poweroff-command "curl -fsS -X POST $HF_SIM_POWEROFF_URL"`

// fetchAgent is what the seed's runcmd does first with agentSource
// Operator: the operator's own download script fetches the agent from the
// operator's agent server and installs it only if its SHA-256 is the one
// in the download URL the operator wrote (the URL carries it as ?sha256=).
// A failed download exits, which powers the simulated VM off.
const fetchAgent = `url=$(grep -o 'https://[^[:space:]"]*` + agentserver.PathPrefix + agentserver.FilePrefix + agentPlatform + `?sha256=[0-9a-f]*' "$HF_SIM_SEED_DIR/user-data" | head -n 1)
[ -n "$url" ] || { echo "devenv guest: the seed's user-data downloads no agent" >&2; exit 1; }
agent="$HF_SIM_ROOT` + cloudinit.AgentBinary + `"
sh "$HF_SIM_ROOT` + cloudinit.FetchAgentPath + `" "$url" "${url##*sha256=}" "$agent" "$HF_SIM_ROOT` + cloudinit.AgentCAPath + `" || exit 1
`

// guestScript is the guest program: the agent the world was given, or
// with AgentFromOperator the one the guest downloaded.
func (w *World) guestScript() string {
	run := runAgent
	if w.opts.SPIFFE {
		// The agent starts the cached spire-agent with the VM's join token.
		run += ` --spire-agent "$HF_SPIRE_AGENT"`
	}
	if w.opts.AgentFromOperator {
		return fetchAgent + run
	}
	return `agent="$HF_AGENT_BINARY"; ` + run
}

// inProcessAgentServer is the in-process operator's agent server: it
// serves AgentBinary on a free loopback port (to guests with
// AgentFromOperator) and takes every guest's power-off notice
// (docs/architecture.md, "Power-off hints").
func (w *World) inProcessAgentServer() (*manager.AgentServerOptions, error) {
	// The agent server serves the agent (AgentFromOperator), the
	// credential broker (SPIFFE) and the guests' power-off notices.
	if w.opts.AgentBinary == "" || w.opts.NoPowerOffNotices && !w.opts.AgentFromOperator && !w.opts.SPIFFE {
		return nil, nil
	}
	dir := filepath.Join(w.opts.Dir, "agent-binaries")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("devenv: %w", err)
	}
	link := filepath.Join(dir, agentserver.FilePrefix+agentPlatform)
	if _, err := os.Lstat(link); os.IsNotExist(err) {
		if err := os.Symlink(w.opts.AgentBinary, link); err != nil {
			return nil, fmt.Errorf("devenv: %w", err)
		}
	}
	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	o := &manager.AgentServerOptions{Addr: addr, URL: w.guestURL("https://" + addr), Dir: dir,
		CertFile: w.agentTLS.certFile, KeyFile: w.agentTLS.keyFile, CAFile: w.agentTLS.caFile}
	// Every guest comes from 127.0.0.1, as VMs behind one NAT address:
	// no per-address cap (docs/security.md, "The agent server's bounds").
	o.Limits.MaxConnsPerAddress = -1
	return o, nil
}

// freeLoopbackAddr is a loopback address with a port nothing listens on
// now.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("devenv: find a free port: %w", err)
	}
	addr := ln.Addr().String()
	return addr, ln.Close()
}

// OperatorInputs is what an operator running outside the process
// (Options.ExternalOperator) needs from the world, beyond the objects it
// finds in the API server.
type OperatorInputs struct {
	// Namespace is the operator's own namespace (its Secrets, its lease).
	Namespace string
	// WebhookSecretData are the keys of the operator's webhook Secret
	// (--github-webhook-secret): the world's webhook secret under
	// owner.<login> of its organization, the owner's own key (no shared
	// fallback: docs/security.md, "Webhook intake").
	WebhookSecretData map[string][]byte
	// WebhookCertFile and WebhookKeyFile are the webhook receiver's
	// serving certificate and key, for 127.0.0.1; the GitHub simulator
	// trusts that certificate.
	WebhookCertFile, WebhookKeyFile string
	// GitHubCAFile is the GitHub simulator's CA, which the operator must
	// trust.
	GitHubCAFile string
	// GitHubAPIHost is the GitHub simulator's API host, whose deliveries
	// the webhook Secret's secrets verify (--github-webhook-api-host).
	GitHubAPIHost string
	// AgentServerCertFile, AgentServerKeyFile and AgentServerCAFile are
	// the agent server's certificate for 127.0.0.1, its key and the CA the
	// guests must trust (AgentFromOperator; empty otherwise).
	AgentServerCertFile, AgentServerKeyFile, AgentServerCAFile string
	// ResyncInterval, SweepInterval and MaxRetryDelay are the intervals
	// the world's operator runs with (manager flags
	// --runnerpool-resync-interval, --orphan-sweep-interval and
	// --claim-max-retry-delay).
	ResyncInterval, SweepInterval, MaxRetryDelay time.Duration
}

// OperatorInputs returns what an external operator needs.
func (w *World) OperatorInputs() OperatorInputs {
	return OperatorInputs{
		Namespace:         SystemNamespace,
		WebhookSecretData: map[string][]byte{manager.WebhookOwnerKeyPrefix + Organization: []byte(webhookSecret)},
		WebhookCertFile:   w.webhook.certFile, WebhookKeyFile: w.webhook.keyFile,
		GitHubCAFile: w.githubCAFile(), GitHubAPIHost: w.GitHubAPIHost(),
		AgentServerCertFile: w.agentTLS.certFile, AgentServerKeyFile: w.agentTLS.keyFile, AgentServerCAFile: w.agentTLS.caFile,
		ResyncInterval: resyncInterval, SweepInterval: sweepInterval, MaxRetryDelay: maxRetryDelay,
	}
}

// ConnectOperator points the repository's webhook at an external
// operator's receiver (an https:// URL ending in /webhooks/github) and
// waits until that operator verified the pool's GitHub scope, as Start
// does for the in-process one.
func (w *World) ConnectOperator(ctx context.Context, webhookURL string) error {
	if !w.opts.ExternalOperator {
		return fmt.Errorf("devenv: ConnectOperator needs Options.ExternalOperator")
	}
	if !strings.HasPrefix(webhookURL, "https://") {
		return fmt.Errorf("devenv: webhook URL %q is not https://", webhookURL)
	}
	if err := w.pointWebhook(webhookURL); err != nil {
		return err
	}
	return w.waitPoolVerified(ctx)
}
