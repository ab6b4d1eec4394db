package agent

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proxytest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
)

// TestRunnerThroughAProxy runs the agent with a proxy in its config
// (a template's spec.network.proxy) while the GitHub simulator is
// reachable only through Debian's tinyproxy (internal/testworld/proxytest:
// a direct connection is refused). The agent downloads the runner package
// through the proxy, and the runner, whose scripts are curl, registers,
// takes its job and finishes through it too: tinyproxy's log holds their
// CONNECTs, and the runner's environment holds the proxy variables in both
// cases whatever the agent's own environment says.
//
// Not parallel: it sets SSL_CERT_FILE (the simulator's CA), as
// TestGitHubSimulator does.
func TestRunnerThroughAProxy(t *testing.T) {
	px := proxytest.Start(t)
	ln := px.Listen(t)
	cert, caPEM, err := githubsim.SelfSignedCertificate(px.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	sim, err := githubsim.New(githubsim.Config{
		Organizations:    []githubsim.OrgConfig{{Login: "octo-org"}},
		Repositories:     []githubsim.RepoConfig{{Name: "octo-org/app"}},
		PATs:             []githubsim.PATConfig{{Token: simPAT, Login: "octocat"}},
		HeartbeatTimeout: githubsim.Duration(10 * time.Second),
	}, githubsim.WithCACertificate(caPEM))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(sim)
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(func() { srv.Close(); _ = sim.Close() })
	sim.SetServerURL(srv.URL)
	caFile := filepath.Join(t.TempDir(), "sim-ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile)
	t.Setenv("HF_SIM_POLL_WAIT", "1")
	// The agent's own environment names no proxy, or a wrong one: the
	// config's wins for the agent and the runner alike.
	t.Setenv("https_proxy", "http://192.0.2.1:9")
	proxytest.CheckDirectRefused(t, ln.Addr().String())

	// The test's own calls go through the proxy as well.
	proxyURL, _ := url.Parse(px.URL)
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL),
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	pkgURL := srv.URL + "/_sim/runner/actions-runner-linux-x64.tar.gz"
	resp, err := hc.Get(pkgURL)
	if err != nil {
		t.Fatal(err)
	}
	pkg, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("runner package: HTTP %d, %v", resp.StatusCode, err)
	}
	sum := sha256.Sum256(pkg)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orgs/octo-org/actions/runners/generate-jitconfig",
		strings.NewReader(`{"name":"agent-proxied","runner_group_id":1,"labels":["self-hosted","hyperfleet","agent-proxied"],"work_folder":"_work"}`))
	req.Header.Set("Authorization", "token "+simPAT)
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		JIT string `json:"encoded_jit_config"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || out.JIT == "" {
		t.Fatalf("JIT config: HTTP %d, %v", resp.StatusCode, err)
	}
	jit := out.JIT
	// Only requests from here on are the agent's and the runner's.
	before := len(px.Requests(t))
	v := newVM(t)
	v.secret = jit
	c := v.baseConfig()
	c.Runner.Software.DownloadURL, c.Runner.Software.DownloadSHA256 = pkgURL, hex.EncodeToString(sum[:])
	c.Proxy = &agentconfig.Proxy{HTTPProxy: px.URL, HTTPSProxy: px.URL, NoProxy: []string{"localhost", "169.254.0.0/16"}}
	v.writeConfig(c)
	v.opts.IdleTimeout, v.opts.DownloadTimeout = time.Minute, time.Minute
	job, err := sim.EnqueueJob(githubsim.JobRequest{Repository: "octo-org/app", Labels: []string{"self-hosted", "agent-proxied"}, Duration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- v.run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		j, _ := sim.Job(job.ID)
		if j.Status == "in_progress" {
			break
		}
		select {
		case code := <-done:
			t.Fatalf("agent exited %d before the job started (job %+v)", code, j)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("the runner did not take the job: %+v", j)
		}
	}
	if err := sim.CompleteJob(job.ID, "success"); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		v.checkCommon(code, ExitOK, 1)
	case <-time.After(60 * time.Second):
		cancel()
		<-done
		t.Fatal("the agent did not finish after the job completed")
	}
	if j, _ := sim.Job(job.ID); j.Status != "completed" || j.RunnerName != "agent-proxied" {
		t.Errorf("job = %+v", j)
	}

	// The agent's download and the runner's calls: CONNECTs to the
	// simulator, several (download, registration, polls, job updates).
	var connects int
	for _, r := range px.Requests(t)[before:] {
		if r == "CONNECT "+ln.Addr().String() {
			connects++
		}
	}
	if connects < 3 {
		t.Errorf("tinyproxy passed %d CONNECTs to the simulator after the test's own; want the agent's download and the runner's calls: %v", connects, px.Requests(t))
	}
	log := v.log.String()
	for _, want := range []string{"runner package verified", "runner online", "Running job: build"} {
		if !strings.Contains(log, want) {
			t.Errorf("agent log lacks %q", want)
		}
	}
}

// TestRunnerEnvironmentCarriesTheProxy checks the runner's environment:
// the config's proxy in both cases, replacing the agent's own.
func TestRunnerEnvironmentCarriesTheProxy(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "http://agent-own:1")
	t.Setenv("no_proxy", "agent-own")
	u := &runAs{proxyEnv: (&agentconfig.Proxy{HTTPSProxy: "http://proxy:3128", NoProxy: []string{".svc"}}).Env()}
	env := "\n" + strings.Join(u.env("X=1"), "\n") + "\n"
	for _, want := range []string{"\nhttps_proxy=http://proxy:3128\n", "\nHTTPS_PROXY=http://proxy:3128\n", "\nno_proxy=.svc\n", "\nNO_PROXY=.svc\n", "\nX=1\n"} {
		if !strings.Contains(env, want) {
			t.Errorf("runner environment lacks %q:%s", strings.TrimSpace(want), env)
		}
	}
	if strings.Contains(env, "agent-own") {
		t.Errorf("the agent's own proxy variables reached the runner:%s", env)
	}
}
