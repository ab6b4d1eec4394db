package devenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// UseInProcessGuests makes the VMs booted from now on in-process guests
// (InProcessGuest) instead of processes running the real agent; false goes
// back to the agent.
func (w *World) UseInProcessGuests(on bool) error {
	if !on {
		return w.Proxmox.SetGuestProgram(nil)
	}
	return w.Proxmox.SetGuestProgram(w.InProcessGuest())
}

// InProcessGuest is a simulated VM that does what a VM running the agent
// does towards the operator and the CI platform, and nothing else: it reads
// the agent configuration the operator's cloud-init wrote (its user-data's
// write_files), makes the secrets' directory, sends the ready hint, waits
// for the JIT runner configuration the operator places in the running VM
// through the guest agent (agentconfig's secretsFile), runs that runner
// for one job (githubsim.JITRunner: the runner protocol of the runner
// package's run.sh), sends the power-off notice with what the runner
// printed, and powers off. No process is started and the HTTPS connections are shared
// between VMs, so a VM costs the machine the protocol it speaks, not a
// process tree (a shell, the agent, the runner script's curl and sed
// calls): the churn benchmark's VMs, whose guests would otherwise share
// the operator's cores (docs/performance.md, churn). The real agent in
// every other VM keeps the guest side itself tested.
func (w *World) InProcessGuest() proxmoxsim.GuestProgram {
	clients := &guestClients{byCA: map[string]*http.Client{}}
	return func(ctx context.Context, g proxmoxsim.Guest) error {
		raw, err := os.ReadFile(filepath.Join(g.Root, agentconfig.Path))
		if err != nil {
			return fmt.Errorf("in-process guest %d: the agent configuration: %w", g.VMID, err)
		}
		cfg, err := agentconfig.Parse(raw)
		if err != nil {
			return fmt.Errorf("in-process guest %d: %w", g.VMID, err)
		}
		if cfg.WorkloadMethod != agentconfig.WorkloadDirect || cfg.BootstrapMethod != agentconfig.BootstrapJITConfig {
			return fmt.Errorf("in-process guest %d: runs JIT runners placed in the VM only, not workloadMethod %s, bootstrapMethod %s",
				g.VMID, cfg.WorkloadMethod, cfg.BootstrapMethod)
		}
		src := &agent.GuestSource{Method: cfg.BootstrapMethod, File: cfg.SecretsFile, Deadline: cfg.SecretsDeadline, Root: g.Root,
			Logger: slog.New(slog.NewTextHandler(g.Console, nil))}
		if err := src.Prepare(); err != nil {
			return fmt.Errorf("in-process guest %d: %w", g.VMID, err)
		}
		if n := cfg.PowerOffNotify; n != nil && n.ReadyURL != "" {
			go clients.ready(ctx, n, g.Console)
		}
		cred, err := src.Credential(ctx)
		if err != nil {
			return fmt.Errorf("in-process guest %d: %w", g.VMID, err)
		}
		gh, err := clients.forFile(w.githubCAFile())
		if err != nil {
			return err
		}
		seen := &runnerLines{out: g.Console}
		r := &githubsim.JITRunner{Client: gh, Out: seen, PollWait: time.Second}
		_, runErr := r.Run(ctx, cred.JITConfig)
		if n := cfg.PowerOffNotify; n != nil && ctx.Err() == nil {
			online, started := seen.state()
			if err := clients.notify(ctx, n, agentconfig.PowerOffNoticeBody{RunnerOnline: online, JobStarted: started}); err != nil {
				fmt.Fprintf(g.Console, "in-process guest: power-off notice: %v\n", err)
			}
		}
		// Returning powers the VM off, as the agent's power-off command.
		return runErr
	}
}

// runnerLines copies the runner's output to the console and notes the
// lines the agent watches for (internal/agent: "Listening for Jobs",
// "Running job:").
type runnerLines struct {
	mu              sync.Mutex
	out             interface{ Write([]byte) (int, error) }
	online, started bool
}

func (l *runnerLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	s := string(p)
	l.online = l.online || strings.Contains(s, "Listening for Jobs")
	l.started = l.started || strings.Contains(s, "Running job:")
	l.mu.Unlock()
	return l.out.Write(p)
}

func (l *runnerLines) state() (online, started bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.online, l.started
}

// guestClients are HTTPS clients shared by the in-process guests, one per
// CA: their connections are kept and reused.
type guestClients struct {
	mu   sync.Mutex
	byCA map[string]*http.Client
}

func (c *guestClients) forFile(path string) (*http.Client, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("in-process guest: %w", err)
	}
	return c.forPEM(string(pem))
}

func (c *guestClients) forPEM(pem string) (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if hc := c.byCA[pem]; hc != nil {
		return hc, nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(pem)) {
		return nil, fmt.Errorf("in-process guest: no PEM certificate in the CA")
	}
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64,
	}}
	c.byCA[pem] = hc
	return hc, nil
}

// ready sends the ready hint as the agent does (internal/agent,
// announceReady): retried while the operator asks to, for a few seconds.
func (c *guestClients) ready(ctx context.Context, n *agentconfig.PowerOffNotify, console io.Writer) {
	hc, err := c.forPEM(n.CA)
	if err != nil {
		fmt.Fprintf(console, "in-process guest: ready hint: %v\n", err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		code, err := agent.PostReadyHint(ctx, hc, n)
		if err == nil && code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests {
			if code != http.StatusAccepted {
				fmt.Fprintf(console, "in-process guest: ready hint: the operator answered HTTP %d\n", code)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// notify posts the power-off notice as the agent does (internal/agent,
// notifyPowerOff), once.
func (c *guestClients) notify(ctx context.Context, n *agentconfig.PowerOffNotify, notice agentconfig.PowerOffNoticeBody) error {
	hc, err := c.forPEM(n.CA)
	if err != nil {
		return err
	}
	body, err := json.Marshal(notice)
	if err != nil {
		return err
	}
	code, err := agent.PostNotice(ctx, hc, n, body)
	if err != nil {
		return err
	}
	if code != http.StatusAccepted {
		return fmt.Errorf("the operator answered HTTP %d", code)
	}
	return nil
}
