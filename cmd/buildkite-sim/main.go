// Command buildkite-sim serves a simulated Buildkite
// (internal/testworld/simulator/buildkite): the agent API under /v3 that
// the real buildkite-agent speaks, the REST subset under /v2 that
// go-buildkite calls, job webhooks, and a release-like tarball of an agent
// binary under /_sim/agent/.
//
// It speaks HTTPS with a freshly generated certificate signed by a
// throw-away CA, whose PEM is printed at start-up (and written to --ca-out)
// unless --insecure-http is given. The admin API under /_sim/ is off unless
// --admin is given, and answers loopback clients only; with it, a cluster
// "default" (its token printed), a pipeline "app" in it and the REST token
// of --api-token are ready at start.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simcmd"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
)

func main() { simcmd.Main("buildkite-sim", run) }

func run() error {
	var f simcmd.Flags
	f.Define("127.0.0.1:8444", "JSON simulator configuration (buildkitesim.Config: organization, apiTokens, rateLimit, intervals, agentBinary)", "clusters, tokens, pipelines, builds, jobs, faults, webhooks")
	f.DefineCAOut()
	apiToken := flag.String("api-token", "", "a REST API token with every scope the simulator knows (in addition to --config's)")
	agentBinary := flag.String("agent-binary", "", "serve this binary as /_sim/agent/buildkite-agent-linux-amd64-<version>.tar.gz (hack/buildkite-agent/build.sh prints one)")
	hookURL := flag.String("webhook-url", "", "deliver job webhooks to this URL")
	hookTokenFile := flag.String("webhook-token-file", "", "file holding the webhook token")
	hookSigned := flag.Bool("webhook-signed", true, "send X-Buildkite-Signature (else the token itself as X-Buildkite-Token)")
	flag.Parse()

	cfg, err := simcmd.World(&f, func() buildkitesim.Config { return buildkitesim.Config{} }, simcmd.Decode[buildkitesim.Config](json.Unmarshal))
	if err != nil {
		return err
	}
	if *apiToken != "" {
		cfg.APITokens = append(cfg.APITokens, buildkitesim.APIToken{Token: *apiToken, Scopes: buildkitesim.Scopes()})
	}
	if *agentBinary != "" {
		cfg.AgentBinary = *agentBinary
	}
	sim := buildkitesim.New(cfg, buildkitesim.WithAdmin(f.Admin), buildkitesim.WithLogger(simcmd.Logger()))
	defer sim.Close()
	if *hookURL != "" {
		tok := ""
		if *hookTokenFile != "" {
			raw, err := os.ReadFile(*hookTokenFile)
			if err != nil {
				return fmt.Errorf("read webhook token: %w", err)
			}
			tok = strings.TrimRight(string(raw), "\r\n")
		}
		sim.AddWebhook(buildkitesim.Webhook{URL: *hookURL, Token: tok, Signed: *hookSigned})
	}
	if f.Admin {
		c := sim.CreateCluster("default")
		tok, err := sim.CreateToken(c.ID, "buildkite-sim", time.Time{})
		if err != nil {
			return err
		}
		if err := sim.CreatePipeline("app", c.ID); err != nil {
			return err
		}
		fmt.Printf("cluster %s (default queue %s), agent token %s, pipeline app\n", c.ID, c.DefaultQueueID, tok.Secret)
	}

	ln, err := simcmd.Listen(f.Listen, f.Insecure, f.CAOut, selfsigned.Options{CommonName: "buildkite-sim", Organization: []string{"HyperFleet Buildkite simulator"}})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: sim, TLSConfig: ln.TLS, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	if ln.Certificate != nil {
		fmt.Printf("CA certificate (trust it, e.g. curl --cacert):\n%s", ln.Certificate.CAPEM)
	}
	base := ln.URL
	fmt.Printf("Buildkite simulator listening on %s (agent API %s/v3, REST %s/v2, admin API %s)\n",
		base, base, base, f.AdminAPI())

	return simcmd.Serve(srv, ln)
}
