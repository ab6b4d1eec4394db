package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestTemplateRunnerVersionResolvesRelease: runner.version latest resolves
// from the GitHub simulator's actions/runner releases into the template's
// status.runner, and a claim's VM gets exactly that package and checksum;
// a version that was never released makes the template not Ready with a
// message naming the field.
func TestTemplateRunnerVersionResolvesRelease(t *testing.T) {
	seeds := t.TempDir()
	sim := startSimCapturingSeeds(t, seeds)
	gs := startGitHub(t)
	startOperator(t, operatorOptions{github: gs.Transport})
	f := newFixture(t, sim, nil)
	f.useGitHub(gs, func(b *hfv1.Bootstrap) { b.GitHub.Runner = &hfv1.RunnerSoftware{Version: "latest"} })

	var resolved *hfv1.ResolvedRunner
	eventually(t, 60*time.Second, "the runner release resolved", func() error {
		var tmpl hfv1.HypervisorMachineTemplate
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.template), &tmpl); err != nil {
			return err
		}
		if tmpl.Status.Runner == nil || !hfv1.IsConditionTrue(tmpl.Status.Conditions, hfv1.ReadyCondition) {
			return fmt.Errorf("status.runner %+v, conditions %+v", tmpl.Status.Runner, tmpl.Status.Conditions)
		}
		resolved = tmpl.Status.Runner
		return nil
	})
	if resolved.Version != "2.329.0" || !strings.HasSuffix(resolved.DownloadURL, "/actions-runner-linux-x64-2.329.0.tar.gz") || len(resolved.DownloadSHA256) != 64 {
		t.Fatalf("status.runner = %+v", resolved)
	}

	claim := waitPhase(t, f.newClaim("latest-runner"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	agent := seedAgentConfig(t, seeds, claim.Status.VMRef.VMID)
	runner, _ := agent["runner"].(map[string]any)
	software, _ := runner["software"].(map[string]any)
	if software["downloadURL"] != resolved.DownloadURL || software["downloadSHA256"] != resolved.DownloadSHA256 {
		t.Fatalf("the VM's runner software is %+v, want the resolved %+v", software, resolved)
	}

	if err := retry.RetryOnConflict(conflictRetry, func() error {
		var tmpl hfv1.HypervisorMachineTemplate
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.template), &tmpl); err != nil {
			return err
		}
		tmpl.Spec.Bootstrap.GitHub.Runner.Version = "1.0.0"
		return env.Client.Update(context.Background(), &tmpl)
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "an unreleased version refused", func() error {
		var tmpl hfv1.HypervisorMachineTemplate
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.template), &tmpl); err != nil {
			return err
		}
		c := hfv1.FindCondition(tmpl.Status.Conditions, hfv1.ReadyCondition)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != "RunnerReleaseNotFound" || !strings.Contains(c.Message, "spec.bootstrap.github.runner.version") {
			return fmt.Errorf("Ready = %+v", c)
		}
		return nil
	})
}
