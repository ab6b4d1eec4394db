// Command github-sim serves a simulated GitHub: the self-hosted runner,
// workflow run/job and App installation token REST endpoints (at the root
// and under /api/v3/), signed workflow_job webhooks, and a runner package
// whose scripts run jobs against it.
//
// It speaks HTTPS with a freshly generated certificate signed by a
// throw-away CA, whose PEM is printed at start-up (and written to --ca-out)
// unless --insecure-http is given. The admin API under /_sim/ is off unless
// --admin is given, and answers loopback clients only.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simcmd"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func main() { simcmd.Main("github-sim", run) }

func run() error {
	var f simcmd.Flags
	f.Define("127.0.0.1:8443", "YAML or JSON description of organizations, repositories, PATs, Apps, runner groups and rate limits (default: organization octo-org, repository octo-org/hello-world, PAT "+githubsim.DefaultPAT+")", "state, jobs, faults, redelivery, clock")
	f.DefineCAOut()
	f.DefineFakeClock()
	var hookURLs, hookSecrets multiFlag
	flag.Var(&hookURLs, "webhook-url", "deliver workflow_job webhooks to this URL (repeatable)")
	flag.Var(&hookSecrets, "webhook-secret-file", "file holding the webhook secret: one for all --webhook-url, or one per --webhook-url in order")
	flag.Parse()

	cfg, err := simcmd.World(&f, githubsim.DefaultConfig, githubsim.LoadConfig)
	if err != nil {
		return err
	}
	if len(hookSecrets) > 1 && len(hookSecrets) != len(hookURLs) {
		return fmt.Errorf("give one --webhook-secret-file for all --webhook-url or one per URL (%d URLs, %d secret files)", len(hookURLs), len(hookSecrets))
	}
	for i, u := range hookURLs {
		w := githubsim.WebhookConfig{URL: u}
		switch {
		case len(hookSecrets) == 1:
			w.SecretFile = hookSecrets[0]
		case len(hookSecrets) > 1:
			w.SecretFile = hookSecrets[i]
		}
		cfg.Webhooks = append(cfg.Webhooks, w)
	}

	ln, err := simcmd.Listen(f.Listen, f.Insecure, f.CAOut, selfsigned.Options{CommonName: "github-sim", Organization: []string{"HyperFleet GitHub simulator"}})
	if err != nil {
		return err
	}
	var caPEM []byte
	if ln.Certificate != nil {
		caPEM = ln.Certificate.CAPEM
	}
	if cfg.ServerURL == "" {
		cfg.ServerURL = ln.URL
	}
	opts := append([]githubsim.Option{githubsim.WithAdmin(f.Admin), githubsim.WithLogger(simcmd.Logger()), githubsim.WithCACertificate(caPEM)},
		simcmd.ClockOption(&f, githubsim.WithClock)...)
	sim, err := githubsim.New(cfg, opts...)
	if err != nil {
		return err
	}
	defer sim.Close()

	srv := &http.Server{Handler: sim, ReadHeaderTimeout: 10 * time.Second, TLSConfig: ln.TLS}
	if ln.Certificate != nil {
		fmt.Printf("CA certificate (trust it, e.g. curl --cacert; written to %s):\n%s", orNone(f.CAOut), caPEM)
	}
	fmt.Printf("GitHub simulator listening on %s (REST at / and /api/v3/, runner package at /_sim/runner/actions-runner-linux-x64.tar.gz, admin API %s)\n",
		cfg.ServerURL, f.AdminAPI())

	return simcmd.Serve(srv, ln)
}

func orNone(p string) string {
	if p == "" {
		return "no file; use --ca-out"
	}
	return p
}
