package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// guestWrite is one file the operator wrote into a running VM through its
// guest agent.
type guestWrite struct {
	vmid    int
	path    string
	content string
}

// guestWrites records the guest-agent file writes the simulator receives.
type guestWrites struct {
	mu     sync.Mutex
	writes []guestWrite
}

func (g *guestWrites) hook(r *http.Request) {
	vmid, content, ok := proxmoxsim.FileWriteRequest(r)
	if !ok {
		return
	}
	// FileWriteRequest put the body back; read the path from it too.
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	path := ""
	var js map[string]any
	if json.Unmarshal(body, &js) == nil {
		path = fmt.Sprint(js["file"])
	} else if form, err := url.ParseQuery(string(body)); err == nil {
		path = form.Get("file")
	}
	g.mu.Lock()
	g.writes = append(g.writes, guestWrite{vmid: vmid, path: path, content: string(content)})
	g.mu.Unlock()
}

func (g *guestWrites) of(vmid int) []guestWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []guestWrite
	for _, w := range g.writes {
		if w.vmid == vmid {
			out = append(out, w)
		}
	}
	return out
}

func (g *guestWrites) forget(vmid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	kept := g.writes[:0]
	for _, w := range g.writes {
		if w.vmid != vmid {
			kept = append(kept, w)
		}
	}
	g.writes = kept
}

// userDataGen draws a tenant's own cloud-init user-data: none, a
// cloud-config with files, commands and users of its own, or a shell
// script.
var userDataGen = rapid.Custom(func(t *rapid.T) string {
	word := rapid.StringMatching(`[a-z][a-z0-9]{2,12}`)
	switch rapid.IntRange(0, 2).Draw(t, "user-data kind") {
	case 1:
		var b strings.Builder
		b.WriteString("#cloud-config\n")
		if rapid.Bool().Draw(t, "write_files") {
			b.WriteString("write_files:\n")
			for i := range rapid.IntRange(1, 3).Draw(t, "files") {
				fmt.Fprintf(&b, "  - path: /etc/%s-%d.conf\n    content: %q\n", word.Draw(t, "file"), i, word.Draw(t, "content"))
			}
		}
		if rapid.Bool().Draw(t, "runcmd") {
			fmt.Fprintf(&b, "runcmd:\n  - [echo, %q]\n", word.Draw(t, "cmd"))
		}
		if rapid.Bool().Draw(t, "packages") {
			fmt.Fprintf(&b, "packages: [%s]\n", word.Draw(t, "package"))
		}
		return b.String()
	case 2:
		return "#!/bin/sh\necho " + word.Draw(t, "script") + " > /var/tmp/hello\n"
	}
	return ""
})

// Feature: hyperfleet-operator, Property 15: Security - No Persistent Secrets
//
// TestNoPersistentSecretsProperty checks the design's statement in the
// cheap world (cheapworld_lifecycle_test.go), with the operator's own CI
// platforms (internal/workloads) on the GitHub simulator: over generated
// templates (PAT or GitHub App credentials, JIT configuration or
// registration token, organization or repository runners, the tenant's
// own user-data of every kind, and VMs that attest to SPIRE with a join
// token or do not) and a claim of each through its life (provisioned, its
// secrets placed, deleted), everything the operator hands the VM is
// inspected: the cloud-init seed the guest booted from and every
// cloud-init medium at rest on the hypervisor, the VM as the hypervisor
// holds it (name, description, tags, the hypervisor's own cloud-init) and
// the spec the operator asked for it, and every file placed through the
// guest agent. None holds a long-lived secret (the PAT, the App's private
// key, an installation token, the Proxmox API token, the webhook secret,
// the ownership key); the VM's single-use secrets (its JIT configuration
// or registration token; or its join token and broker proof, the runner
// credential then coming from the broker) are in no seed, no medium and no
// VM configuration, and reach the VM only as the secrets file under /run
// (agentconfig.SecretsFile, a tmpfs: never on its disk), which holds
// exactly what its template's method needs.
//
// Mutation: the claim's join token rendered into its seed (appended to
// the broker URL of the agent's config in
// internal/controller/machineclaim/identity_service.go, identityVars)
// fails this test; the old test, which never drew a VM that attests,
// passed it.
func TestNoPersistentSecretsProperty(t *testing.T) {
	gs := startGitHub(t)
	appSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: lifeNamespace, Name: "github-app"},
		Data: map[string][]byte{"app-id": []byte(strconv.Itoa(testGitHubAppID)), "installation-id": []byte(strconv.Itoa(testGitHubInstall)),
			"key": testAppKey.PrivatePEM},
	}
	var attesting int
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		app := rapid.Bool().Draw(rt, "GitHub App")
		token := rapid.Bool().Draw(rt, "registration token")
		repo := rapid.Bool().Draw(rt, "repository runners")
		attest := rapid.Bool().Draw(rt, "join-token attestation")
		userData := userDataGen.Draw(rt, "user-data")
		w := newLifeWorld(t, rt, lifeOptions{github: gs, spire: attest, objs: []client.Object{appSecret.DeepCopy()}})
		tmpl := w.template("p15")
		b := &tmpl.Spec.Bootstrap
		b.GitHub.APIBaseURL = gs.URL + "/api/v3"
		secretsBootstrap(b, gs.URL, app, repo, token)
		if userData != "" {
			tmpl.Spec.CloudInit = &hfv1.CloudInit{UserData: userData}
		}
		if attest {
			attesting++
			tmpl.Spec.Attestation.Method = hfv1.AttestationJoinToken
		}
		w.createTemplate(tmpl)
		claim := w.newClaim("p15", tmpl.Name)
		var got *hfv1.MachineClaim
		var doc agentconfig.GuestSecrets
		w.runUntil("claim "+claim.Name+"'s secrets placed", func() error {
			got = w.get(claim)
			if got == nil || got.Status.VMRef == nil {
				return w.pending("", got)
			}
			if !attest && (got.Status.Bootstrap == nil || got.Status.Bootstrap.CredentialDeliveredAt == nil) {
				return w.pending("credential not delivered", got)
			}
			var ok bool
			if doc, ok = guestSecretsIn(w, w.vmidOf(got)); !ok {
				return w.pending("no secrets file placed", got)
			}
			return nil
		})
		vmid := w.vmidOf(got)

		// What reached the VM through its guest agent: the secrets file
		// only, under /run, with exactly what the template's method needs.
		placed := w.placedIn(vmid)
		for _, f := range placed {
			if f.Path != agentconfig.SecretsFile || !strings.HasPrefix(f.Path, "/run/") {
				rt.Fatalf("VM %d: the operator wrote %s through the guest agent; only %s (tmpfs) may receive secrets", vmid, f.Path, agentconfig.SecretsFile)
			}
		}
		var singleUse []string
		switch {
		case attest:
			if doc.JoinToken == "" || doc.BrokerProof == "" || doc.JITConfig != "" || doc.RegistrationToken != "" {
				rt.Fatalf("VM %d attests: its secrets file holds join token %v, broker proof %v, JIT %v, registration token %v; want the first two only",
					vmid, doc.JoinToken != "", doc.BrokerProof != "", doc.JITConfig != "", doc.RegistrationToken != "")
			}
			singleUse = []string{doc.JoinToken, doc.BrokerProof}
		case token:
			if doc.RegistrationToken == "" || doc.JITConfig != "" || doc.JoinToken != "" {
				rt.Fatalf("VM %d: the secrets file does not hold exactly the registration token the template asks for", vmid)
			}
			singleUse = []string{doc.RegistrationToken}
		default:
			if doc.JITConfig == "" || doc.RegistrationToken != "" || doc.JoinToken != "" {
				rt.Fatalf("VM %d: the secrets file does not hold exactly the JIT configuration the template asks for", vmid)
			}
			singleUse = []string{doc.JITConfig}
		}
		if content, ok := w.hv.GuestFile(vmid, agentconfig.SecretsFile); !ok || !strings.Contains(string(content), singleUse[0]) {
			rt.Fatalf("VM %d: %s in the guest does not hold what was placed", vmid, agentconfig.SecretsFile)
		}

		// The seed the guest booted from, every medium at rest, and the VM
		// as the hypervisor holds it and as the operator asked for it.
		seed, ok := w.hv.DeliveredCloudInit(vmid)
		if !ok || !strings.Contains(string(seed.UserData), "hyperfleet") {
			rt.Fatalf("VM %d booted without the operator's seed: %.200s", vmid, seed.UserData)
		}
		places := map[string]string{"the VM's cloud-init seed": string(seed.UserData) + string(seed.MetaData) + string(seed.NetworkConfig)}
		for _, m := range w.hv.Media() {
			places["the cloud-init medium "+m.ID] = string(m.Data.UserData) + string(m.Data.MetaData) + string(m.Data.NetworkConfig)
		}
		vm, ok := w.hv.VM(vmid)
		if !ok {
			rt.Fatalf("VM %d is not on the hypervisor", vmid)
		}
		places["the VM's configuration"] = mustJSON(rt, vm)
		if native, ok := w.hv.NativeCloudInit(vmid); ok {
			places["the VM's own cloud-init"] = mustJSON(rt, native)
		}
		spec, _ := w.specOf(got.UID)
		places["the VM spec the operator asked for"] = fmt.Sprintf("%s\n%s\n%v\n%+v", spec.Name, spec.Description, spec.Tags, spec.Native)
		for _, f := range placed {
			places["the guest file "+f.Path] = string(f.Content)
		}
		for where, text := range places {
			for what, canary := range longLivedCanaries() {
				if strings.Contains(text, canary) {
					rt.Fatalf("%s found in %s of VM %d", what, where, vmid)
				}
			}
			if m := installationToken.FindString(text); m != "" {
				rt.Fatalf("an installation token (%s…) found in %s of VM %d", m[:8], where, vmid)
			}
			for _, secret := range singleUse {
				if !strings.HasPrefix(where, "the guest file ") && strings.Contains(text, secret) {
					rt.Fatalf("VM %d's single-use secret is in %s: it must reach the running VM only", vmid, where)
				}
			}
		}
		if err := w.kube.Delete(w.ctx, got); err != nil {
			rt.Fatal(err)
		}
		w.runUntil("claim "+claim.Name+" gone with its VM and media", func() error {
			if c := w.get(claim); c != nil || len(w.vmsOf(claim.UID)) > 0 || len(w.mediaOf(claim.UID)) > 0 {
				return w.pending("its VM or media are left", c)
			}
			return nil
		})
	})
	if attesting == 0 {
		t.Errorf("no case drew a VM that attests")
	}
}

// secretsCase is one scenario of TestNoPersistentSecretsScenarios: the
// template's GitHub credentials (a PAT or the App), its method (a JIT
// configuration or a registration token), organization or repository
// runners, and the tenant's own user-data.
type secretsCase struct {
	app, token, repo bool
	userData         string
}

// TestNoPersistentSecretsScenarios keeps property 15 against the real API
// server, the Proxmox simulator (whose guests copy the seed they boot
// from, every file of the ISO) and the GitHub simulator, for three fixed
// templates: everything the operator writes to the VM is inspected (the
// seed, the VM's configuration and description, every file placed through
// the guest agent); none holds a long-lived secret, and the VM's
// single-use credential reaches it only as the secrets file under /run.
func TestNoPersistentSecretsScenarios(t *testing.T) {
	longScenario(t)
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	writes := &guestWrites{}
	hook := writes.hook
	sim.onRequest.Store(&hook)
	gs := startGitHub(t)
	op := startOperator(t, operatorOptions{github: gs.Transport, maxRetryDelay: time.Second})
	f := newFixture(t, sim, nil)
	f.useGitHub(gs, nil)
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "github-app"},
		StringData: map[string]string{"app-id": strconv.Itoa(testGitHubAppID), "installation-id": strconv.Itoa(testGitHubInstall), "key": string(testAppKey.PrivatePEM)},
	})
	w := &propertyWorld{sim: sim, op: op, f: f}
	ctx := context.Background()
	for i, sc := range []secretsCase{
		{},
		{app: true, token: true, repo: true, userData: "#cloud-config\nwrite_files:\n  - path: /etc/team.conf\n    content: \"hello\"\nruncmd:\n  - [echo, \"hi\"]\n"},
		{token: true, userData: "#!/bin/sh\necho script > /var/tmp/hello\n"},
	} {
		name := fmt.Sprintf("p15-%d", i)
		app, token, repo := sc.app, sc.token, sc.repo
		rt := t
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: name}
		b := &tmpl.Spec.Bootstrap
		secretsBootstrap(b, gs.URL, app, repo, token)
		if sc.userData != "" {
			tmpl.Spec.CloudInit = &hfv1.CloudInit{UserData: sc.userData}
		}
		if err := env.Client.Create(ctx, tmpl); err != nil {
			rt.Fatalf("template: %v", err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(ctx, tmpl) })
		claim := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: name},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: name}},
		}
		if err := env.Client.Create(ctx, claim); err != nil {
			rt.Fatal(err)
		}
		var got *hfv1.MachineClaim
		within(t, 60*time.Second, "claim "+name+"'s credential delivered", func() error {
			c, err := getClaim(f.t, claim)
			if err != nil {
				return err
			}
			got = c
			if b := c.Status.Bootstrap; b == nil || b.CredentialDeliveredAt == nil {
				return fmt.Errorf("phase %s, conditions %v", c.Status.Phase, c.Status.Conditions)
			}
			return nil
		})
		vmid := int(got.Status.VMRef.VMID)
		seedDir := filepath.Join(seeds, strconv.Itoa(vmid))

		// What reached the VM through its guest agent: the secrets file
		// only, under /run, with the single-use credential.
		placed := writes.of(vmid)
		if len(placed) == 0 {
			rt.Fatalf("claim %s: its credential is delivered but nothing was written into VM %d", name, vmid)
		}
		var credential string
		for _, pw := range placed {
			if pw.path != agentconfig.SecretsFile || !strings.HasPrefix(pw.path, "/run/") {
				rt.Fatalf("VM %d: the operator wrote %s through the guest agent; only %s (tmpfs) may receive secrets", vmid, pw.path, agentconfig.SecretsFile)
			}
			doc, err := agentconfig.ParseGuestSecrets([]byte(pw.content))
			if err != nil {
				rt.Fatalf("VM %d: %s: %v", vmid, pw.path, err)
			}
			credential = doc.JITConfig
			if token {
				credential = doc.RegistrationToken
			}
			if credential == "" || (doc.JITConfig != "") == token {
				rt.Fatalf("VM %d: the secrets file does not hold exactly the %s the template asks for", vmid, map[bool]string{true: "registration token", false: "JIT configuration"}[token])
			}
		}
		if b, _, err := sim.GuestFile(ctx, vmid, agentconfig.SecretsFile); err != nil || !strings.Contains(string(b), credential) {
			rt.Fatalf("VM %d: %s in the guest does not hold the credential placed (%v)", vmid, agentconfig.SecretsFile, err)
		}

		// The seed the guest booted from, every file of it.
		var seed strings.Builder
		within(t, 30*time.Second, "VM "+strconv.Itoa(vmid)+"'s seed captured", func() error {
			seed.Reset()
			files := 0
			err := filepath.Walk(seedDir, func(p string, info os.FileInfo, err error) error {
				if err != nil || info.IsDir() {
					return err
				}
				raw, err := os.ReadFile(p)
				seed.Write(raw)
				files++
				return err
			})
			if err == nil && files == 0 {
				err = fmt.Errorf("no file in %s", seedDir)
			}
			return err
		})
		if !strings.Contains(seed.String(), "hyperfleet") {
			rt.Fatalf("VM %d's seed is not the operator's: %.200s", vmid, seed.String())
		}
		var vmState string
		for _, vm := range sim.VMs() {
			if vm.VMID == vmid {
				vmState = mustJSON(rt, vm)
			}
		}
		if vmState == "" {
			rt.Fatalf("VM %d is not on the hypervisor", vmid)
		}
		places := map[string]string{"the VM's cloud-init seed": seed.String(), "the VM's configuration": vmState}
		for _, pw := range placed {
			places["the guest file "+pw.path] = pw.content
		}
		for where, text := range places {
			for what, canary := range longLivedCanaries() {
				if strings.Contains(text, canary) {
					rt.Fatalf("%s found in %s of VM %d", what, where, vmid)
				}
			}
			if m := installationToken.FindString(text); m != "" {
				rt.Fatalf("an installation token (%s…) found in %s of VM %d", m[:8], where, vmid)
			}
			if !strings.HasPrefix(where, "the guest file ") && strings.Contains(text, credential) {
				rt.Fatalf("VM %d's runner credential is in %s: it must reach the running VM only", vmid, where)
			}
		}
		w.deleteAndCheckGone(t, got, []int{vmid})
		_ = os.RemoveAll(seedDir)
		writes.forget(vmid)
	}
}

// secretsBootstrap sets a generated property 15 template's GitHub
// bootstrap: an App's credentials instead of the PAT, repository runners,
// and a registration token (runner URLs on the simulator at simURL)
// instead of a JIT configuration.
func secretsBootstrap(b *hfv1.Bootstrap, simURL string, app, repo, token bool) {
	if app {
		b.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{
			AppID:          hfv1.LocalSecretKeySelector{Name: "github-app", Key: "app-id"},
			InstallationID: hfv1.LocalSecretKeySelector{Name: "github-app", Key: "installation-id"},
			PrivateKey:     hfv1.LocalSecretKeySelector{Name: "github-app", Key: "key"},
		}}
	}
	if repo {
		b.GitHub.Organization, b.GitHub.Repository = "", "app"
	}
	if token {
		b.Method = hfv1.BootstrapRunnerToken
		b.GitHub.RunnerURLs = &hfv1.ScopedURLs{Repository: simURL + "/{owner}/{repo}", Organization: simURL + "/{owner}"}
	}
}
