// Command gitlab-sim serves a simulated GitLab under /api/v4: the REST
// endpoints HyperFleet's GitLab back-end calls (runners, projects, groups,
// jobs, token introspection), the runner API gitlab-runner speaks, Job Hook
// webhooks, and a stand-in for `gitlab-runner run-single` under
// /_sim/gitlab-runner/ (internal/testworld/simulator/gitlab, README.md).
//
// It speaks HTTPS with a certificate signed by a throw-away CA, whose PEM is
// printed at start-up (and written to --ca-out), unless --insecure-http is
// given. The admin API under /_sim/ is off unless --admin is given, and
// answers loopback clients only.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simcmd"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
)

func main() { simcmd.Main("gitlab-sim", run) }

// defaultConfig is the world without --config: group acme/platform with
// project acme/platform/app, user root (administrator) with a personal
// access token, and user maintainer (Maintainer of the project).
func defaultConfig() gitlabsim.Config {
	return gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/platform/app"}},
		Users: []gitlabsim.UserConfig{
			{Username: "root", Admin: true},
			{Username: "maintainer", Members: map[string]int{"acme/platform/app": gitlabsim.Maintainer}},
		},
		Tokens: []gitlabsim.TokenConfig{
			{Token: "glpat-simulator000000000000", User: "root", Scopes: []string{"api"}, Name: "default"},
			{Token: "glpat-maintainer00000000000", User: "maintainer", Scopes: []string{"api", "create_runner"}, Name: "maintainer"},
		},
	}
}

func run() error {
	var f simcmd.Flags
	f.Define("127.0.0.1:8444", "YAML or JSON world (users, groups, projects, tokens, rate limit; see the simulator's README.md); default: project acme/platform/app and token glpat-simulator000000000000 of the administrator root", "pipelines, hooks, tokens, faults")
	f.DefineCAOut()
	f.DefineFakeClock()
	flag.Parse()

	cfg, err := simcmd.World(&f, defaultConfig, simcmd.Decode[gitlabsim.Config](func(raw []byte, v any) error { return yaml.UnmarshalStrict(raw, v) }))
	if err != nil {
		return err
	}
	ln, err := simcmd.Listen(f.Listen, f.Insecure, f.CAOut, selfsigned.Options{CommonName: "gitlab-sim", Organization: []string{"HyperFleet GitLab simulator"}})
	if err != nil {
		return err
	}
	if ln.Certificate != nil {
		fmt.Printf("CA certificate (trust it, e.g. curl --cacert, gitlab-runner --tls-ca-file):\n%s", ln.Certificate.CAPEM)
	}
	if cfg.URL == "" {
		cfg.URL = ln.URL
	}
	opts := append([]gitlabsim.Option{gitlabsim.WithAdmin(f.Admin), gitlabsim.WithLogger(simcmd.Logger())}, simcmd.ClockOption(&f, gitlabsim.WithClock)...)
	sim, err := gitlabsim.New(cfg, opts...)
	if err != nil {
		return err
	}
	defer sim.Close()

	srv := &http.Server{Handler: sim, TLSConfig: ln.TLS, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute}
	fmt.Printf("GitLab simulator listening on %s (API at /api/v4, gitlab-runner stand-in at /_sim/gitlab-runner/gitlab-runner-linux-amd64, admin API %s)\n",
		cfg.URL, f.AdminAPI())

	return simcmd.Serve(srv, ln)
}
