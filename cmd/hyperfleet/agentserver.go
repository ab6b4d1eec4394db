package main

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/httpsserver"
	"github.com/hyperfleet/hyperfleet/internal/manager"
)

// agentServerFlags are the manager's flags for the agent server, which
// serves the in-VM agent to templates with spec.bootstrap.agentSource
// Operator.
type agentServerFlags struct {
	addr, cert, key, ca, dir, url *string
	limits                        httpsserver.Limits
	downloadTimeout               *time.Duration
}

func bindAgentServerFlags(fs *flag.FlagSet) *agentServerFlags {
	f := &agentServerFlags{
		addr: fs.String("agent-server-addr", "", "HTTPS address of the agent server, which serves the in-VM agent to templates with agentSource Operator (path "+agentserver.PathPrefix+", on every replica), such as :9443; empty disables it"),
		cert: fs.String("agent-server-cert", "", "PEM certificate (chain) of the agent server (reloaded when it changes)"),
		key:  fs.String("agent-server-key", "", "PEM private key of the agent server (reloaded when it changes)"),
		ca:   fs.String("agent-server-ca", "", "PEM CA certificate(s) VMs trust to reach the agent server, written into each VM; empty: the VMs' system roots"),
		dir:  fs.String("agent-binaries-dir", "", "directory with the agent binaries, named "+agentserver.FilePrefix+"<os>-<arch> ("+strings.Join(agentserver.Platforms, ", ")+"); hashed once at start, so they must not change in place while served"),
		url:  fs.String("agent-server-url", "", "https:// base URL VMs reach the agent server at, such as https://hyperfleet-agent.hyperfleet-system.svc:9443 (a Service in front of every replica)"),
	}
	bindLimitFlags(fs, "agent-server", "the agent server", &f.limits, agentserver.DefaultLimits)
	d := agentserver.DefaultLimits
	fs.IntVar(&f.limits.Reserved, "agent-server-reserved-conns", d.Reserved, "connections of --agent-server-max-conns kept for the credential broker, the TPM enrollment and the VMs' hints: once the others are held (downloads), new connections may only carry one of those requests; -1: none (docs/security.md, \"The agent server's bounds\")")
	fs.IntVar(&f.limits.ReservedPerAddress, "agent-server-reserved-conns-per-address", d.ReservedPerAddress, "of --agent-server-reserved-conns, how many one source IP address may hold")
	f.downloadTimeout = fs.Duration("agent-server-download-timeout", 0, "longest time a download of the agent may take, however steadily its client reads; 0: 30 s plus the largest binary's size at 128 KiB/s (such as 3m under a 20 MiB binary)")
	return f
}

// bindLimitFlags binds a server's connection caps as
// --<prefix>-max-conns and --<prefix>-max-conns-per-address.
func bindLimitFlags(fs *flag.FlagSet, prefix, server string, l *httpsserver.Limits, defaults httpsserver.Limits) {
	fs.IntVar(&l.MaxConns, prefix+"-max-conns", defaults.MaxConns, "connections "+server+" holds open from all clients together; more are closed at once (hyperfleet_https_connections_refused_total); -1: no cap")
	fs.IntVar(&l.MaxConnsPerAddress, prefix+"-max-conns-per-address", defaults.MaxConnsPerAddress, "connections "+server+" holds open from one source IP address; behind a load balancer or ingress, where every connection comes from its addresses, set it to the --"+prefix+"-max-conns value or -1 (no cap)")
}

// options checks the flags: nil when the server is off.
func (f *agentServerFlags) options() (*manager.AgentServerOptions, error) {
	others := map[string]string{
		"--agent-server-cert": *f.cert, "--agent-server-key": *f.key, "--agent-binaries-dir": *f.dir,
		"--agent-server-url": *f.url, "--agent-server-ca": *f.ca,
	}
	var set, missing []string
	for _, name := range []string{"--agent-server-url", "--agent-server-cert", "--agent-server-key", "--agent-binaries-dir", "--agent-server-ca"} {
		switch {
		case others[name] != "":
			set = append(set, name)
		case name != "--agent-server-ca":
			missing = append(missing, name)
		}
	}
	if *f.addr == "" {
		if len(set) > 0 {
			return nil, fmt.Errorf("%s set but --agent-server-addr is empty: set it (such as :9443) to serve the agent to VMs, or remove them", strings.Join(set, ", "))
		}
		return nil, nil
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("--agent-server-addr is set, so the agent server also needs %s (see docs/operations.md)", strings.Join(missing, ", "))
	}
	if *f.downloadTimeout < 0 {
		return nil, fmt.Errorf("--agent-server-download-timeout is %s: give a duration above 0, or 0 for the default derived from the binaries' size", *f.downloadTimeout)
	}
	if err := f.limits.Or(agentserver.DefaultLimits).Check("agent-server"); err != nil {
		return nil, err
	}
	return &manager.AgentServerOptions{
		Addr: *f.addr, CertFile: *f.cert, KeyFile: *f.key, CAFile: *f.ca, Dir: *f.dir, URL: *f.url, Limits: f.limits,
		DownloadTimeout: *f.downloadTimeout,
	}, nil
}
