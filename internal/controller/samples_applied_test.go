package controller_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/testworld/dnsserver"
	"github.com/hyperfleet/hyperfleet/internal/testworld/mtlsproxy"
	buildkitesim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/buildkite/buildkitesimtest"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	gitlabsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/gitlab"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/kit"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// samplesNamespace is where the namespaced samples are applied; it carries
// the tenant label the sample clusters admit.
const samplesNamespace = "hyperfleet-samples"

// TestSamplesWorkWhenApplied applies every sample in config/samples to the
// real API server as written, with only the addresses, TLS pins and
// Secrets of this machine's simulators filled in (as a user fills in their
// own; the mTLS sample's cluster is put behind a real nginx that requires
// its client certificate, the DNS sample's cluster registers on a real
// BIND, and the external-dns sample's writes its DNSEndpoints into the
// namespace it names, with external-dns's CRD installed as the sample
// asks), and checks each object's conditions: clusters connected and Ready,
// templates Ready, IP pools Ready, pools Ready, and the manual claim up
// with its runner credential issued. The simulators are set up as the
// samples assume a real site is (nodes, templates, storages, resource pool,
// GitHub accounts), so a sample that refers to something it does not
// define fails here.
// testGitHubEnterprisePAT is the enterprise sample's classic PAT, with
// manage_runners:enterprise.
const testGitHubEnterprisePAT = "ghp_enterpriseOwnerTokenForTheSamples0000000"

func TestSamplesWorkWhenApplied(t *testing.T) {
	sim := startSim(t, func(c *proxmoxsim.Config) {
		node := c.Nodes[0]
		// Room for every sample at once: the pools' warm VMs (minReplicas,
		// minIdle) and the manual claim all land on pve-node-1, whose
		// templates are there, and on a 64 GiB node whichever came last
		// waited InsufficientCapacity for good (the pools' idle VMs
		// stay), the manual claim in a race run.
		node.Memory, node.CPUs = 512<<30, 256
		n1, n2 := node, node
		n1.Name, n2.Name = "pve-node-1", "pve-node-2"
		n2.IP = "192.0.2.12"
		c.Nodes = []proxmoxsim.NodeConfig{n1, n2}
		tmpl := c.Templates[0]
		t9000, t9001, tv1, twin := tmpl, tmpl, tmpl, tmpl
		t9000.Node, t9000.Name = "pve-node-1", "debian-12-ci"
		t9001.VMID, t9001.Node, t9001.Name = 9001, "pve-node-1", "debian-12-runner"
		tv1.VMID, tv1.Node, tv1.Name = 9002, "pve-node-2", "debian-12-runner-v1"
		// The Windows sample's (docs/windows.md builds it).
		twin.VMID, twin.Node, twin.Name = 9003, "pve-node-1", "win2022-runner"
		c.Templates = []proxmoxsim.TemplateConfig{t9000, t9001, tv1, twin}
		c.Pools = []proxmoxsim.PoolConfig{{ID: "ci"}}
	})
	// The kit the delivery proxmox sample names, placed as a platform
	// team does (scp to the node's snippets directory): the template is
	// not Ready without it.
	if _, err := sim.PutSnippet("local", "pve-node-1", "hyperfleet-kit.yaml", kit.VendorData(true)); err != nil {
		t.Fatal(err)
	}
	gs := githubsimtest.Start(t, githubsim.Config{
		Organizations: []githubsim.OrgConfig{{Login: "example-org", RunnerGroups: []githubsim.RunnerGroupConfig{{ID: 7, Name: "hyperfleet"}}}, {Login: "platform"}},
		Users:         []githubsim.UserConfig{{Login: "example"}},
		Repositories:  []githubsim.RepoConfig{{Name: "example/hyperfleet"}, {Name: "platform/builds"}},
		// The enterprise sample's: example-org in enterprise example-corp,
		// whose runner group hyperfleet serves it.
		Enterprises: []githubsim.EnterpriseConfig{{Slug: "example-corp", Organizations: []string{"example-org"},
			RunnerGroups: []githubsim.EnterpriseRunnerGroupConfig{{ID: 70, Name: "hyperfleet", Visibility: "selected", SelectedOrganizations: []string{"example-org"}}}}},
		PATs: []githubsim.PATConfig{{Token: testGitHubPAT, Login: "octocat"},
			{Token: testGitHubEnterprisePAT, Login: "enterprise-owner", Scopes: []string{"manage_runners:enterprise", "repo"}}},
		Apps: []githubsim.AppConfig{{ID: testGitHubAppID, PublicKey: testAppKey.PublicPEM, Installations: []githubsim.InstallationConfig{
			{ID: testGitHubInstall, Account: "example"},
		}}},
		HeartbeatTimeout: githubsim.Duration(30 * time.Second),
	})
	// The Buildkite samples' organization, cluster and queue, and their
	// API token's Secret.
	bk := buildkitesimtest.Start(t, buildkitesim.Config{Organization: "acme", AgentBinary: "/nonexistent",
		APITokens: []buildkitesim.APIToken{{Token: testBuildkiteToken, Scopes: buildkitesim.Scopes()}}})
	bkCluster := bk.Sim.CreateCluster("linux")
	if _, err := bk.Sim.CreateQueue(bkCluster.ID, "linux"); err != nil {
		t.Fatal(err)
	}
	// The GitLab samples' group and their access token's Secret.
	glSim, err := gitlabsim.New(gitlabsim.Config{
		Projects: []gitlabsim.ProjectConfig{{Path: "acme/platform/app"}},
		Users:    []gitlabsim.UserConfig{{Username: "owner", Members: map[string]int{"acme/platform": gitlabsim.Owner}}},
		Tokens:   []gitlabsim.TokenConfig{{Token: testGitLabToken, User: "owner", Scopes: []string{"api"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	gl := httptest.NewTLSServer(glSim)
	t.Cleanup(func() { gl.Close(); glSim.Close() })
	certFile, keyFile, _ := webhookCertificate(t)
	agents := t.TempDir()
	if err := os.WriteFile(filepath.Join(agents, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	startOperator(t, operatorOptions{github: byHost{bk.Listener.Addr().String(): bk.Client().Transport, gl.Listener.Addr().String(): gl.Client().Transport, "": gs.Transport}, agentServer: &manager.AgentServerOptions{
		Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: agents, URL: "https://hyperfleet-agent.hyperfleet-system.svc:9443",
	}})
	ctx := context.Background()
	ensure := func(obj client.Object) {
		t.Helper()
		if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	ensure(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "hyperfleet-system"}})
	ensure(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: samplesNamespace, Labels: map[string]string{"hyperfleet.io/tenant": "true"}}})
	secret := func(ns, name string, data map[string]string) {
		ensure(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: data})
	}
	secret("hyperfleet-system", "proxmox-token", map[string]string{"tokenId": simTokenID, "tokenSecret": simTokenSecret})
	secret("hyperfleet-system", "proxmox-login", map[string]string{"username": "root@pam", "password": "root"})
	secret(samplesNamespace, "github-app", map[string]string{"app-id": fmt.Sprint(testGitHubAppID), "installation-id": fmt.Sprint(testGitHubInstall), "private-key": string(testAppKey.PrivatePEM)})
	secret(samplesNamespace, "github-pat", map[string]string{"token": testGitHubPAT})
	secret(samplesNamespace, "ghes-pat", map[string]string{"token": testGitHubPAT})
	secret(samplesNamespace, "github-enterprise-pat", map[string]string{"token": testGitHubEnterprisePAT})
	secret(samplesNamespace, "buildkite-api", map[string]string{"token": testBuildkiteToken})
	secret(samplesNamespace, "gitlab-token", map[string]string{"token": testGitLabToken})
	// The mTLS sample's cluster is reached through a real nginx that
	// requires a client certificate from clientCA, with the one its Secret
	// holds (a kubernetes.io/tls Secret, as the sample says).
	clientCA := mtlsproxy.NewCA(t, "samples client CA")
	proxy := mtlsproxy.Start(t, mtlsproxy.Options{Upstream: strings.TrimSuffix(sim.url, "/api2/json"), ClientCA: clientCA.PEM})
	clientCert := clientCA.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet"})
	ensure(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "hyperfleet-system", Name: "proxmox-client-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{corev1.TLSCertKey: clientCert.CertPEM, corev1.TLSPrivateKeyKey: clientCert.KeyPEM}})
	secret("hyperfleet-system", "proxmox-gw-ca", map[string]string{"ca.crt": string(proxy.ServerCA)})
	// The DNS sample's cluster registers its VMs on a real BIND holding
	// its zones, with the TSIG key its Secret holds.
	bind := dnsserver.StartBIND(t, dnsserver.Options{Zones: []string{"ci.example.com", "2.0.192.in-addr.arpa", "8.b.d.0.1.0.0.2.ip6.arpa"}})
	secret("hyperfleet-system", "dns-update-key", map[string]string{"tsig.key": dnsserver.UpdateKey.Clause()})
	// The external-dns sample's DNSEndpoints go to external-dns's namespace
	// (the suite's API server has its CRD).
	ensure(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "external-dns"}})

	// The addresses a user fills in: the simulators instead of
	// pve.example.com, github.com and github.example.com.
	local := strings.NewReplacer(
		"ns1.example.com:53", bind.Addr,
		"https://api.github.com", gs.URL+"/api/v3",
		"https://github.example.com/api/v3", gs.URL+"/api/v3",
		"https://github.com", gs.URL,
		"0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", bkCluster.ID,
		"https://gitlab.example.com", gl.URL,
	)
	var applied []*unstructured.Unstructured
	files, _ := filepath.Glob(filepath.Join(testenv.RepoRoot(), "config", "samples", "hyperfleet_*.yaml"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal([]byte(local.Replace(string(raw))), &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		switch u.GetKind() {
		case "CIJob":
			// A demand record the operator writes; the admission policy
			// keeps users from creating one.
			continue
		case "HypervisorCluster":
			_ = unstructured.SetNestedField(u.Object, "1s", "spec", "pollInterval")
			if _, mtls, _ := unstructured.NestedMap(u.Object, "spec", "credentials", "clientCert"); mtls {
				// The sample's own tls.caBundleRef trusts the proxy.
				_ = unstructured.SetNestedField(u.Object, proxy.URL+"/api2/json", "spec", "endpoint")
				break
			}
			_ = unstructured.SetNestedField(u.Object, sim.url, "spec", "endpoint")
			_ = unstructured.SetNestedMap(u.Object, map[string]any{"fingerprintSHA256": sim.fingerprint}, "spec", "tls")
			// The simulators stand in for every CI platform host, the
			// public services included: the tenancy rules allow them
			// where a sample allows the company's own.
			rules, _, _ := unstructured.NestedSlice(u.Object, "spec", "tenancy")
			for i := range rules {
				if rule, ok := rules[i].(map[string]any); ok {
					rule["apiHosts"] = []any{strings.TrimPrefix(gs.URL, "https://"), bk.Listener.Addr().String(), gl.Listener.Addr().String()}
				}
			}
			if len(rules) > 0 {
				_ = unstructured.SetNestedSlice(u.Object, rules, "spec", "tenancy")
			}
		case "HypervisorMachineTemplate":
			_, github, _ := unstructured.NestedMap(u.Object, "spec", "bootstrap", "github")
			if _, found, _ := unstructured.NestedString(u.Object, "spec", "bootstrap", "github", "apiBaseURL"); github && !found {
				_ = unstructured.SetNestedField(u.Object, gs.URL+"/api/v3", "spec", "bootstrap", "github", "apiBaseURL")
			}
			if _, buildkite, _ := unstructured.NestedMap(u.Object, "spec", "bootstrap", "buildkite"); buildkite {
				_ = unstructured.SetNestedField(u.Object, bk.URL, "spec", "bootstrap", "buildkite", "apiURL")
				_ = unstructured.SetNestedField(u.Object, bk.URL+"/v3", "spec", "bootstrap", "buildkite", "agentEndpoint")
			}
		}
		if u.GetNamespace() == "" && u.GetKind() != "HypervisorCluster" && u.GetKind() != "IPPool" {
			u.SetNamespace(samplesNamespace)
		}
		if err := env.Client.Create(ctx, u); err != nil {
			t.Fatalf("apply %s: %v", filepath.Base(f), err)
		}
		applied = append(applied, u)
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), u) })
	}

	if len(applied) < 10 {
		t.Fatalf("applied %d samples from config/samples, want every one", len(applied))
	}
	for _, u := range applied {
		want, wantStatus, wantReason := hfv1.ReadyCondition, metav1.ConditionTrue, ""
		if u.GetKind() == "MachineClaim" {
			want = hfv1.MachineClaimProvisionedCondition
		}
		if m, _, _ := unstructured.NestedString(u.Object, "spec", "attestation", "method"); m == string(hfv1.AttestationJoinToken) || m == string(hfv1.AttestationTPM) {
			// The sample's SPIRE server is not here: the template says so
			// (the TPM template only once its cluster's spec.spire.tpm
			// passed, else TPMNotConfigured). test/e2e's SPIFFE scenarios
			// run both against a real one.
			wantStatus, wantReason = metav1.ConditionFalse, string(hfv1.SPIREUnavailableReason)
		}
		eventually(t, 2*time.Minute, fmt.Sprintf("%s %s %s", u.GetKind(), u.GetName(), want), func() error {
			got := &unstructured.Unstructured{}
			got.SetGroupVersionKind(u.GroupVersionKind())
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(u), got); err != nil {
				return err
			}
			raw, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			var conds []metav1.Condition
			for _, c := range raw {
				m, _ := c.(map[string]any)
				conds = append(conds, metav1.Condition{Type: fmt.Sprint(m["type"]), Status: metav1.ConditionStatus(fmt.Sprint(m["status"])), Reason: fmt.Sprint(m["reason"]), Message: fmt.Sprint(m["message"])})
			}
			if c := meta.FindStatusCondition(conds, string(want)); c == nil || c.Status != wantStatus || wantReason != "" && c.Reason != wantReason {
				return fmt.Errorf("%s = %+v, want %s %s", want, c, wantStatus, wantReason)
			}
			return nil
		})
	}
	// The validation sample's settings reach the API server as written
	// (a misspelt field would be pruned silently); claims are validated
	// with them in TestNetworkValidation and test/guest.
	validated := &hfv1.HypervisorCluster{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "proxmox-validated"}, validated); err != nil {
		t.Fatal(err)
	}
	if d, n := validated.Spec.DNS, validated.Spec.Network; d == nil || d.Validation == nil || !d.Validation.ValidateReverse || d.Validation.OnFailure != hfv1.ValidationReport ||
		n == nil || n.Validation == nil || !n.Validation.SSHTest || n.Validation.OnFailure != hfv1.ValidationFailClaim {
		t.Fatalf("the validation sample's cluster reads back as dns %+v, network %+v", d, n)
	}
	dnsCluster := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "proxmox-dns"}}
	waitClusterCondition(t, dnsCluster, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionTrue, string(hfv1.ReadyReason))
	// The external-dns sample's DNSEndpoints are labelled for the
	// external-dns that publishes to Route 53 (externalDNS.labelValue).
	route53 := &hfv1.HypervisorCluster{ObjectMeta: metav1.ObjectMeta{Name: "proxmox-route53"}}
	if c := waitClusterCondition(t, route53, string(hfv1.HypervisorClusterDNSReadyCondition), metav1.ConditionTrue, string(hfv1.ReadyReason)); !strings.Contains(c.Message, "namespace external-dns") || !strings.Contains(c.Message, "hyperfleet.io/dns-provider=route53") {
		t.Errorf("the external-dns sample's DNSReady says %q", c.Message)
	}
	if reqs := proxy.Requests(t); len(reqs) == 0 || reqs[len(reqs)-1].Serial != clientCert.Serial || reqs[len(reqs)-1].Verify != "SUCCESS" {
		t.Fatalf("the mTLS sample's cluster did not reach the API through the proxy with its client certificate: %+v", reqs)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: "debug-runner"}}
	got := waitDelivered(t, claim, time.Minute)
	if got.Status.Bootstrap == nil || got.Status.Bootstrap.CredentialIssuedAt == nil {
		t.Fatalf("the sample claim's runner credential was not issued: %+v", got.Status.Bootstrap)
	}
}

// testBuildkiteToken is the Buildkite samples' API token on the simulator.
const testBuildkiteToken = "bkua_samplesTokenForTheBuildkiteSimulator"

// testGitLabToken is the GitLab samples' access token on the simulator.
const testGitLabToken = "glpat-samplesTokenForTheGitLabSim"

// byHost sends each request through the transport of its host, the one
// under "" for any other: the operator's one workload transport reaching
// two simulators, each with its own CA.
type byHost map[string]http.RoundTripper

func (b byHost) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt, ok := b[r.URL.Host]; ok {
		return rt.RoundTrip(r)
	}
	return b[""].RoundTrip(r)
}
