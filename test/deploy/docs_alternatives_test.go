//go:build deploy

package deploy

import (
	"context"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"

	"github.com/hyperfleet/hyperfleet/internal/testworld/docblocks"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// The blocks of docs/install.md that are alternatives to the path
// TestInstallPageRunsAsWritten follows, each run as written by the test
// its mark names.

// TestInstallRolesOnProxmoxVE8 runs step 2 for Proxmox VE 8: the role
// block for version 8, then the page's user, ACL and token block, against
// a Proxmox VE 8 simulator through its pveum. The token the page creates
// must then do what the base role is for: read a VM's configuration,
// clone the template, and write into a guest through its agent, which
// Proxmox VE 8 checks as VM.Monitor (VM.GuestAgent.FileWrite on 9).
func TestInstallRolesOnProxmoxVE8(t *testing.T) {
	blocks := readPage(t, "docs/install.md")
	steps := docblocks.RunBy(blocks, "TestInstallRolesOnProxmoxVE8")
	for _, b := range docblocks.Unmarked(blocks) {
		if strings.Contains(b.Text, "pveum user token add") {
			steps = append(steps, b)
		}
	}
	if len(steps) != 2 {
		t.Fatalf("want the Proxmox VE 8 role block and the token block of docs/install.md, found %d blocks", len(steps))
	}
	cfg := proxmoxsim.DefaultConfig()
	cfg.PVEVersion = 8
	cfg.Latency, cfg.AuthFailureDelay = proxmoxsim.Latency{}, 0
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(true))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(sim)
	t.Cleanup(func() {
		srv.Close()
		_ = sim.Close()
	})
	dir := t.TempDir()
	tools := docsTools{pveumURL: srv.URL + "/_sim/pveum", pveumFingerprint: proxmoxsim.FormatFingerprint(sha256.Sum256(srv.Certificate().Raw))}
	sh := &docsShell{t: t, env: append(os.Environ(), "PATH="+tools.path(t, dir)+":"+os.Getenv("PATH")), replace: strings.NewReplacer()}
	ctx := context.Background()
	sh.run(ctx, steps[0])
	m := tokenValueRE.FindStringSubmatch(sh.run(ctx, steps[1]))
	if m == nil {
		t.Fatal("the token block printed no secret")
	}
	call := func(method, path string, form url.Values) int {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+"/api2/json"+path, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "PVEAPIToken=hyperfleet@pve!operator="+m[1])
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		what, method, path string
		form               url.Values
	}{
		{"read the template's configuration", http.MethodGet, "/nodes/pve1/qemu/9000/config", nil},
		{"clone the template", http.MethodPost, "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"100000"}, "full": {"0"}}},
		{"write a file through the guest agent", http.MethodPost, "/nodes/pve1/qemu/9000/agent/file-write", url.Values{"file": {"/run/x"}, "content": {"y"}}},
	} {
		if code := call(c.method, c.path, c.form); code == http.StatusForbidden || code == http.StatusUnauthorized {
			t.Errorf("the Proxmox VE 8 role cannot %s: %d", c.what, code)
		}
	}
}

// TestKustomizeInstallAsWritten runs the page's kustomize install in a
// copy of config/ (its kustomize edit changes the kustomization, as in a
// reader's clone) against an API server of its own: every object applies
// (kubectl fails otherwise) and the image it sets is the Deployment's.
func TestKustomizeInstallAsWritten(t *testing.T) {
	blocks := docblocks.RunBy(readPage(t, "docs/install.md"), "TestKustomizeInstallAsWritten")
	if len(blocks) != 1 {
		t.Fatalf("want one block of docs/install.md marked run-by TestKustomizeInstallAsWritten, found %d", len(blocks))
	}
	env := bareAPIServer(t)
	dir := t.TempDir()
	clone := filepath.Join(dir, "clone")
	if err := os.CopyFS(filepath.Join(clone, "config"), os.DirFS(filepath.Join(testenv.RepoRoot(), "config"))); err != nil {
		t.Fatal(err)
	}
	kubeconfig := newCluster(t, env.KubeConfig()).kubeconfig
	sh := &docsShell{t: t, dir: clone, replace: strings.NewReplacer(),
		env: append(os.Environ(), "PATH="+docsTools{}.path(t, dir)+":"+os.Getenv("PATH"), "KUBECONFIG="+kubeconfig)}
	ctx := context.Background()
	sh.run(ctx, blocks[0])
	var deps appsv1.DeploymentList
	if err := env.Client.List(ctx, &deps); err != nil {
		t.Fatal(err)
	}
	const want = "registry.example.com/hyperfleet/hyperfleet:v0.1.0"
	var images []string
	for _, d := range deps.Items {
		for _, c := range d.Spec.Template.Spec.Containers {
			images = append(images, d.Namespace+"/"+d.Name+": "+c.Image)
			if c.Image == want {
				return
			}
		}
	}
	t.Fatalf("no Deployment runs %s after the kustomize install: %v", want, images)
}
