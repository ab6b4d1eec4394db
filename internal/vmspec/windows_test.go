package vmspec

import (
	"bytes"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/internal/testworld/testobjects"
)

// TestWindowsTemplate: a Windows template (spec.guest.os windows) goes
// through the same checks as a Linux one (its VMs' cloud-init renders with
// placeholder credentials; its hash is its own), renders cloudbase-init's
// user data, and a Windows system directory as a runner path is refused
// when it is checked, naming the field (docs/windows.md).
func TestWindowsTemplate(t *testing.T) {
	ws := githubsimtest.Backends(t, nil)
	runner := func(install string) *hfv1.RunnerSoftware {
		return &hfv1.RunnerSoftware{OS: "win", Arch: "x64", InstallPath: install, WorkDir: "/hyperfleet/work", ConfigScript: "config.sh", RunScript: "run.sh"}
	}
	windows := func(install string) *hfv1.HypervisorMachineTemplate {
		return testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Guest = &hfv1.Guest{OS: hfv1.GuestWindows}
			tm.Spec.Bootstrap.GitHub.Runner = runner(install)
		})
	}
	linux := testobjects.GitHubTemplate(func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Bootstrap.GitHub.Runner = runner("/actions-runner")
		tm.Spec.Bootstrap.GitHub.Runner.OS = "linux"
	})
	cluster := proxmoxCluster()
	win := windows("/actions-runner")
	if err := CheckTemplate(ws, win, cluster, nil, nil); err != nil {
		t.Fatalf("a Windows template does not render: %v", err)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "win-1", UID: placeholderClaimUID}}
	v := ClaimVars(ws, claim, win, cluster, nil)
	if v.GuestOS != cloudinit.GuestWindows {
		t.Fatalf("GuestOS %q", v.GuestOS)
	}
	out, err := cloudinit.Render(Input(win, withPlaceholderCredentials(ws, v, win)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out.UserData, []byte("Content-Type: multipart/mixed")) || !bytes.Contains(out.UserData, []byte("#ps1_sysnative")) {
		t.Errorf("the user data is not cloudbase-init's multipart:\n%s", out.UserData)
	}
	hw, err := TemplateHash(ws, win, cluster, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	hl, err := TemplateHash(ws, linux, cluster, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if hw == hl {
		t.Error("a Windows and a Linux template of the same runner have the same template hash")
	}
	err = CheckTemplate(ws, windows("/Windows/actions-runner"), cluster, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "runner.software.installPath") || !strings.Contains(err.Error(), `C:\Windows`) {
		t.Errorf("a runner in C:\\Windows: %v", err)
	}
}
