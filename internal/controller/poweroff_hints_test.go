package controller_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// TestPowerOffHintEndsClaimBeforeListingRefresh (docs/architecture.md,
// "Power-off hints"): with Proxmox's 10 s status refresh (the realistic
// preset) on a simulator clock that never moves, no /cluster/resources
// refresh can happen after the power-offs, so the listing keeps showing
// every VM running. The VM whose agent announced its power-off is destroyed
// and its claim gone all the same: the notice made the operator read that
// VM directly. A forged notice is refused (401) and reads nothing; a VM
// that sent no notice is left to the listing, which catches it at the next
// refresh.
func TestPowerOffHintEndsClaimBeforeListingRefresh(t *testing.T) {
	realistic, err := proxmoxsim.Preset(proxmoxsim.PresetRealistic)
	if err != nil {
		t.Fatal(err)
	}
	clk := proxmoxsim.NewFakeClock(time.Now())
	sim := startSim(t, func(c *proxmoxsim.Config) {
		// Every task completes at once: the fake clock never has to move,
		// so the only status refreshes are the test's RefreshResources.
		c.Latency = proxmoxsim.Latency{}
		c.RefreshInterval = realistic.RefreshInterval
	}, proxmoxsim.WithClock(clk))
	certFile, keyFile, hc := webhookCertificate(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hyperfleet-agent-linux-amd64"), []byte("\x7fELF stand-in for the agent"), 0o755); err != nil {
		t.Fatal(err)
	}
	op := startOperator(t, operatorOptions{agentServer: &manager.AgentServerOptions{
		Addr: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Dir: dir, URL: "https://127.0.0.1:9443",
	}})
	<-op.components.AgentServer.Ready()
	noticeURL := "https://" + op.components.AgentServer.Addr().String() + agentserver.PowerOffPath
	if got := op.components.AgentServer.PowerOffURL(); got != "https://127.0.0.1:9443"+agentserver.PowerOffPath {
		t.Fatalf("PowerOffURL = %q", got)
	}

	f := newFixture(t, sim, nil)
	names := []string{"hinted", "unhinted", "forged"}
	claims := map[string]*hfv1.MachineClaim{}
	for _, n := range names {
		claims[n] = f.newClaim(n)
	}
	for _, n := range names {
		claims[n] = waitDelivered(t, claims[n], 60*time.Second)
	}
	// The last pvestatd round before the power-offs: the listing shows
	// every VM running until the next one.
	sim.RefreshResources()
	before := clk.Now()
	// The operator's own listing must have read that round: a VM missing
	// from an older listing is checked with a direct read at once (it may
	// be gone), which is not what this test is about.
	eventually(t, 10*time.Second, "the operator's listing shows every VM running", func() error {
		l := op.components.Registry.Listing(f.cluster.Name)
		if l == nil {
			return fmt.Errorf("no listing yet")
		}
		for _, n := range names {
			if vm, ok := l.VM(provider.ID(claims[n].Status.VMRef.ID())); !ok || vm.Power != provider.PowerRunning {
				return fmt.Errorf("VM of claim %s: %+v, listed %v", n, vm, ok)
			}
		}
		return nil
	})
	// And no claim pass that read an older listing may still be under way:
	// one that found its VM missing from it reads the VM directly, and
	// under load that read can land after the power-offs below (seen in
	// the race run: the silent VM's claim ended on it).
	waitIdleWorkers(t, "machineclaim")

	steps := &vmRequestLog{}
	hook := func(r *http.Request) { steps.record(f.cluster.Name, r) }
	sim.onRequest.Store(&hook)
	defer sim.onRequest.Store(nil)
	off := time.Now()
	for _, n := range names {
		if err := sim.GuestPowerOff(int(claims[n].Status.VMRef.VMID)); err != nil {
			t.Fatal(err)
		}
	}

	notice := func(c *hfv1.MachineClaim, token string) int {
		t.Helper()
		body, _ := json.Marshal(agentconfig.PowerOffNoticeBody{RunnerOnline: true})
		to := agentconfig.PowerOffNotify{URL: noticeURL, Claim: agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}}
		req, err := http.NewRequest(http.MethodPost, to.NoticeURL(), bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Forged: a made-up token, and the hinted claim's own token presented
	// for another claim. Both are refused before anything is read.
	if code := notice(claims["forged"], strings.Repeat("0f", 32)); code != http.StatusUnauthorized {
		t.Fatalf("forged token: %d, want 401", code)
	}
	hintedToken := testSigner.PowerOffToken(claims["hinted"].Namespace, claims["hinted"].Name, string(claims["hinted"].UID))
	if code := notice(claims["forged"], hintedToken); code != http.StatusUnauthorized {
		t.Fatalf("another claim's token: %d, want 401", code)
	}
	if code := notice(claims["hinted"], hintedToken); code != http.StatusAccepted {
		t.Fatalf("the VM's own notice: %d, want 202", code)
	}

	eventually(t, 10*time.Second, "the hinted claim gone", func() error {
		if _, err := getClaim(t, claims["hinted"]); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim still there: %w", err)
		}
		return nil
	})
	gone := time.Now()
	if !clk.Now().Equal(before) {
		t.Fatalf("the simulator clock moved (%s -> %s): a status refresh could have happened", before, clk.Now())
	}
	// Causality: the claim ended with the listing still showing its VM
	// running (no refresh since the power-off), after the VM's own read.
	vmid := int(claims["hinted"].Status.VMRef.VMID)
	read, ok := steps.first(f.cluster.Name, vmid, http.MethodGet, "/status/current", off)
	if !ok {
		t.Fatal("the hinted VM was never read directly")
	}
	if _, ok := steps.first(f.cluster.Name, vmid, http.MethodDelete, "", off); !ok {
		t.Fatal("the hinted VM was not destroyed")
	}
	for _, vm := range sim.VMs() {
		if vm.VMID == vmid {
			t.Fatalf("VM %d still exists: %+v", vmid, vm)
		}
	}
	t.Logf("power-off -> first direct read %s, -> claim gone %s, listing not refreshed", read.Sub(off).Round(time.Millisecond), gone.Sub(off).Round(time.Millisecond))

	// The forged notice and the silent VM: no direct read, claims kept
	// until the listing shows them stopped.
	time.Sleep(2 * time.Second)
	for _, n := range []string{"unhinted", "forged"} {
		if _, err := getClaim(t, claims[n]); err != nil {
			var lines []string
			for _, l := range strings.Split(op.logs.String(), "\n") {
				if strings.Contains(l, `"name":"`+n+`"`) {
					lines = append(lines, l)
				}
			}
			t.Fatalf("claim %s ended without a listing refresh or a valid notice: %v\n%s", n, err, strings.Join(lines[max(0, len(lines)-30):], "\n"))
		}
		if at, ok := steps.first(f.cluster.Name, int(claims[n].Status.VMRef.VMID), http.MethodGet, "/status/current", off); ok {
			t.Errorf("VM of claim %s read directly at +%s without a valid notice", n, at.Sub(off))
		}
	}
	// The safety net: the next refresh shows them stopped.
	sim.RefreshResources()
	for _, n := range []string{"unhinted", "forged"} {
		eventually(t, 30*time.Second, "claim "+n+" gone after the listing refresh", func() error {
			if _, err := getClaim(t, claims[n]); !apierrors.IsNotFound(err) {
				return fmt.Errorf("claim still there: %w", err)
			}
			return nil
		})
	}
}

// waitIdleWorkers waits until none of controller's workers is reconciling
// (controller-runtime's controller_runtime_active_workers): every pass
// that started before the call has ended.
func waitIdleWorkers(t *testing.T, controller string) {
	t.Helper()
	eventually(t, 10*time.Second, "no "+controller+" reconcile under way", func() error {
		families, err := crmetrics.Registry.Gather()
		if err != nil {
			return err
		}
		for _, fam := range families {
			if fam.GetName() != "controller_runtime_active_workers" {
				continue
			}
			for _, m := range fam.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "controller" && l.GetValue() == controller {
						if n := m.GetGauge().GetValue(); n != 0 {
							return fmt.Errorf("%v reconciles under way", n)
						}
						return nil
					}
				}
			}
		}
		return fmt.Errorf("no controller_runtime_active_workers for controller %q", controller)
	})
}
