// Package proxy_test checks that the operator's own HTTP clients honour
// HTTPS_PROXY, as the chart's proxy values set it (charts/hyperfleet,
// docs/install.md, "Behind an HTTP proxy"): the Proxmox API client
// (pkg/provider/proxmox), the GitHub, GitLab and Buildkite clients
// (pkg/workload/...) and the secret store client
// (internal/secretstore/vault) each reach their
// simulator, which only Debian's tinyproxy can reach
// (internal/testworld/proxytest: a direct connection is refused), and
// tinyproxy's log holds a CONNECT to each.
//
// Go reads the proxy variables once per process (http.ProxyFromEnvironment
// caches them), as the manager does at its start; so the test runs its
// clients in a child process of its own binary, started with the
// variables, as the Deployment starts the manager.
package proxy_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
	"github.com/hyperfleet/hyperfleet/internal/secretstore/vault"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proxytest"
	bksim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	vaultsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/vault"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/buildkite"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// childEnv names the file of the servers the child process calls.
const childEnv = "HF_PROXYTEST_SERVERS"

const (
	pveUser, pveToken, pveSecret = "hyperfleet@pve", "operator", "0d5b9c1e-5a43-4c44-9d7e-0c2a5b4e8f11"
	pat                          = "ghp_proxyTest00000000000000000000000000"
	gitlabPAT                    = "glpat-proxytest0000000000"
	buildkiteToken               = "bkua_proxytest"
	vaultToken                   = "hvs.proxytest-operator"
)

// servers is what the child needs to call the three servers.
type servers struct {
	Proxmox, ProxmoxFingerprint string
	GitHub                      string
	GitLab                      string
	Buildkite, BuildkiteCluster string
	Vault                       string
	CA                          []byte
}

func TestOperatorClientsUseTheProxy(t *testing.T) {
	if f := os.Getenv(childEnv); f != "" {
		callServers(t, f)
		return
	}
	px := proxytest.Start(t)
	cert, caPEM, err := githubsim.SelfSignedCertificate(px.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	serve := func(h http.Handler) (string, string) {
		srv := httptest.NewUnstartedServer(h)
		_ = srv.Listener.Close()
		srv.Listener = px.Listen(t)
		srv.EnableHTTP2 = false
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return srv.URL, srv.Listener.Addr().String()
	}

	var s servers
	pveCfg := proxmoxsim.DefaultConfig()
	pveCfg.AuthFailureDelay = 0
	no := false
	pveCfg.Users = append(pveCfg.Users, proxmoxsim.UserConfig{ID: pveUser, Privileges: proxmoxsim.Privileges{"/": {"Administrator"}},
		Tokens: []proxmoxsim.TokenConfig{{ID: pveToken, Secret: pveSecret, Privsep: &no}}})
	pve, err := proxmoxsim.New(pveCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pve.Close() })
	fp := proxmoxsim.FormatFingerprint(sha256.Sum256(cert.Certificate[0]))
	pve.SetFingerprint(fp)

	gh, err := githubsim.New(githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:  []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:          []githubsim.PATConfig{{Token: pat, Login: "octocat"}},
	}, githubsim.WithCACertificate(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gh.Close() })

	gl, err := gitlabsim.New(gitlabsim.Config{
		Groups: []gitlabsim.GroupConfig{{Path: "acme"}},
		Users:  []gitlabsim.UserConfig{{Username: "owner", Members: map[string]int{"acme": gitlabsim.Owner}}},
		Tokens: []gitlabsim.TokenConfig{{Token: gitlabPAT, User: "owner", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gl.Close)

	bk := bksim.New(bksim.Config{APITokens: []bksim.APIToken{{Token: buildkiteToken, Scopes: bksim.Scopes()}}})
	t.Cleanup(bk.Close)
	s.BuildkiteCluster = bk.CreateCluster("linux").ID

	vs := vaultsim.New()
	vs.EnableKV("secret")
	accessor := vs.EnableJWT("jwt", vaultsim.JWTConfig{})
	vs.SetPolicy("hyperfleet-operator", vaultsim.OperatorPolicy("secret", "hyperfleet", "jwt", "hyperfleet-secret-store", "hyperfleet-vm")...)
	vs.SetPolicy("hyperfleet-vm", vaultsim.VMPolicy("secret", "hyperfleet", accessor)...)
	vs.AddToken(vaultToken, "hyperfleet-operator")

	var addrs []string
	var addr string
	s.Proxmox, addr = serve(pve)
	addrs = append(addrs, addr)
	s.GitHub, addr = serve(gh)
	gh.SetServerURL(s.GitHub)
	addrs = append(addrs, addr)
	s.Vault, addr = serve(vs.Handler())
	addrs = append(addrs, addr)
	s.GitLab, addr = serve(gl)
	addrs = append(addrs, addr)
	s.Buildkite, addr = serve(bk)
	addrs = append(addrs, addr)
	s.ProxmoxFingerprint, s.CA = fp, caPEM
	for _, a := range addrs {
		proxytest.CheckDirectRefused(t, a)
	}

	spec := filepath.Join(t.TempDir(), "servers.json")
	raw, _ := json.Marshal(s)
	if err := os.WriteFile(spec, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOperatorClientsUseTheProxy$", "-test.count=1", "-test.v")
	var env []string
	for _, kv := range os.Environ() {
		if !agentconfig.IsProxyEnv(kv) {
			env = append(env, kv)
		}
	}
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	child.Env = append(env, childEnv+"="+spec, "SSL_CERT_FILE="+caFile, "HTTPS_PROXY="+px.URL, "HTTP_PROXY="+px.URL, "NO_PROXY=localhost,127.0.0.1")
	out, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("the clients' process failed: %v\n%s", err, out)
	}
	for i, name := range []string{"Proxmox", "GitHub", "Vault", "GitLab", "Buildkite"} {
		if !px.Proxied(t, addrs[i]) {
			t.Errorf("tinyproxy passed no CONNECT to the %s simulator at %s: %v", name, addrs[i], px.Requests(t))
		}
	}
}

// callServers is the child: each client calls its server once, through
// whatever proxy the environment names.
func callServers(t *testing.T, file string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var s servers
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	key := sha256.Sum256([]byte("proxy test ownership key"))
	signer, err := ownership.NewSigner("proxytest", key[:])
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxmox.New(provider.ClusterConfig{
		Name: "lab", Endpoint: s.Proxmox + "/api2/json", TokenID: pveUser + "!" + pveToken, TokenSecret: pveSecret,
		FingerprintSHA256: s.ProxmoxFingerprint, DefaultBridge: "vmbr0", VMIDStart: 1000, VMIDEnd: 1999,
		ClonesPerNode: 2, ClonesPerStorage: 2, RequestTimeout: 10 * time.Second,
	}, provider.Deps{Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Probe(ctx); err != nil {
		t.Errorf("Proxmox: %v", err)
	}

	// No Transport: http.DefaultTransport, as in the manager, trusting the
	// simulator's CA through SSL_CERT_FILE as the chart's trustedCA does
	// through SSL_CERT_DIR.
	g, err := github.New(github.Config{BaseURL: s.GitHub, Scope: workload.Scope{Owner: "octo-org"}, Token: pat})
	if err != nil {
		t.Fatal(err)
	}
	if repos, err := g.Repositories(ctx); err != nil || strings.Join(repos, ",") != "octo-org/app" {
		t.Errorf("GitHub: repositories %v, %v", repos, err)
	}

	store, err := vault.New(vault.Config{Address: s.Vault, CABundle: s.CA, KVMount: "secret", PathPrefix: "hyperfleet", AuthMount: "jwt",
		Audience: "hyperfleet-secret-store", VMPolicy: "hyperfleet-vm", Token: vaultToken})
	if err != nil {
		t.Fatal(err)
	}
	id := spiffeid.RequireFromString("spiffe://example.org/vm/ci/runner-a/uid-a")
	if err := store.Put(ctx, id, secretstore.Credential{Method: agentconfig.BootstrapJITConfig, JITConfig: "eyJqaXQiOnRydWV9"}); err != nil {
		t.Errorf("Vault: %v", err)
	}

	lab, err := gitlab.New(gitlab.Config{URL: s.GitLab, Token: gitlabPAT, Scope: workload.Scope{Owner: "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lab.VerifyScope(ctx); err != nil {
		t.Errorf("GitLab: %v", err)
	}

	kite, err := buildkite.New(buildkite.Config{APIURL: s.Buildkite, AgentEndpoint: s.Buildkite + "/v3", Organization: "acme",
		Cluster: s.BuildkiteCluster, Scope: workload.Scope{Owner: "acme"}, Token: buildkiteToken})
	if err != nil {
		t.Fatal(err)
	}
	if err := kite.VerifyScope(ctx); err != nil {
		t.Errorf("Buildkite: %v", err)
	}
}
