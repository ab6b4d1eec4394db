package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestClusterReportsNodesAndVersion: a reachable cluster is Ready with its
// version, nodes and capacity, and TLS verified by the pinned fingerprint.
func TestClusterReportsNodesAndVersion(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	c := waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	if c.Status.Version == "" || c.Status.ConnectedNodes != 1 || len(c.Status.Nodes) != 1 || c.Status.Nodes[0].Name != "pve1" || c.Status.Nodes[0].State != "online" {
		t.Errorf("status = %+v", c.Status)
	}
	if c.Status.AvailableResources == nil || c.Status.AvailableResources.Memory == nil || c.Status.AvailableResources.Memory.Value() <= 0 {
		t.Errorf("available resources = %+v", c.Status.AvailableResources)
	}
	if !hfv1.IsConditionTrue(c.Status.Conditions, hfv1.HypervisorClusterTLSVerifiedCondition) ||
		!hfv1.IsConditionTrue(c.Status.Conditions, hfv1.HypervisorClusterConnectedCondition) {
		t.Errorf("conditions = %+v", c.Status.Conditions)
	}
	if c.Status.ObservedGeneration != c.Generation {
		t.Errorf("observedGeneration %d, generation %d", c.Status.ObservedGeneration, c.Generation)
	}
	wantEvents(t, c, "Connected")
}

// TestClusterConnectionProblems: each way a connection can fail ends in
// Ready=False with a reason that says what to fix.
func TestClusterConnectionProblems(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	cases := []struct {
		name       string
		mutate     func(*hfv1.HypervisorCluster)
		wantReason string
		wantText   string
	}{
		{"wrong token secret", func(c *hfv1.HypervisorCluster) {
			c.Spec.Credentials.TokenSecret.Key = "wrong"
		}, string(hfv1.AuthenticationFailedReason), ""},
		{"missing secret", func(c *hfv1.HypervisorCluster) {
			c.Spec.Credentials.TokenID.Name = "does-not-exist"
		}, string(hfv1.SecretNotFoundReason), "spec.credentials.tokenID: Secret hyperfleet-system/does-not-exist does not exist"},
		{"wrong fingerprint", func(c *hfv1.HypervisorCluster) {
			c.Spec.TLS.FingerprintSHA256 = strings.Repeat("AB:", 31) + "AB"
		}, string(hfv1.InvalidTLSReason), "does not match tls.fingerprintSHA256"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, sim, tc.mutate)
			if tc.name == "wrong token secret" {
				var s corev1.Secret
				key := client.ObjectKey{Namespace: secretNamespace, Name: f.cluster.Spec.Credentials.TokenSecret.Name}
				if err := env.Client.Get(context.Background(), key, &s); err != nil {
					t.Fatal(err)
				}
				s.Data["wrong"] = []byte("not-the-secret")
				if err := env.Client.Update(context.Background(), &s); err != nil {
					t.Fatal(err)
				}
			}
			c := waitClusterReady(t, f.cluster, metav1.ConditionFalse)
			eventually(t, 30*time.Second, "reason "+tc.wantReason, func() error {
				if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(c), c); err != nil {
					return err
				}
				cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition)
				if cond.Reason != tc.wantReason || !strings.Contains(cond.Message, tc.wantText) {
					return fmt.Errorf("Ready = %s: %s", cond.Reason, cond.Message)
				}
				return nil
			})
		})
	}
}

// TestClusterInsecureTLSIsFlagged: skipping verification works but is
// reported in status.
func TestClusterInsecureTLSIsFlagged(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.TLS = &hfv1.HypervisorTLS{InsecureSkipVerify: true}
	})
	c := waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.HypervisorClusterTLSVerifiedCondition)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != string(hfv1.InsecureTLSReason) {
		t.Fatalf("TLSVerified = %+v", cond)
	}
}

// TestNamespaceNotAllowed: a cluster's allowedNamespaces keeps other
// tenants' claims off it, and the claim says so.
func TestNamespaceNotAllowed(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "other"}}
	})
	claim := f.newClaim("not-allowed")
	eventually(t, 30*time.Second, "claim refused", func() error {
		got, err := getClaim(t, claim)
		if err != nil {
			return err
		}
		// The template is refused first (docs/security.md), so the claim
		// waits for its template and quotes the template's reason.
		cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
		if cond == nil || cond.Status != metav1.ConditionFalse || !strings.Contains(cond.Message, string(hfv1.NamespaceNotAllowedReason)) {
			return fmt.Errorf("Provisioned = %+v", cond)
		}
		return nil
	})
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Fatalf("VM created for a namespace the cluster does not admit: %+v", vms)
	}
}

// TestClustersAreIndependent: one cluster going down pauses only its own
// claims (docs/architecture.md, "Polling O(clusters)").
func TestClustersAreIndependent(t *testing.T) {
	longScenario(t)
	down, up := startSim(t, nil), startSim(t, nil)
	startOperator(t, operatorOptions{})
	fDown, fUp := newFixture(t, down, nil), newFixture(t, up, nil)
	waitClusterReady(t, fDown.cluster, metav1.ConditionTrue)
	if err := down.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{"*": {DropRate: 1}}}); err != nil {
		t.Fatal(err)
	}
	waitClusterReady(t, fDown.cluster, metav1.ConditionFalse)
	waiting := fDown.newClaim("on-down")
	running := fUp.newClaim("on-up")
	waitPhase(t, running, hfv1.MachineClaimBootstrapping, 60*time.Second)
	got, err := getClaim(t, waiting)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.VMRef != nil || got.Status.Phase == hfv1.MachineClaimBootstrapping {
		t.Fatalf("claim on the unreachable cluster got a VM: %+v", got.Status)
	}
	if c := waitClusterReady(t, fUp.cluster, metav1.ConditionTrue); c.Status.ConnectedNodes != 1 {
		t.Fatalf("healthy cluster status %+v", c.Status)
	}
	if err := down.SetFaults(proxmoxsim.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, waiting, hfv1.MachineClaimBootstrapping, 90*time.Second)
}

// TestClusterAvailableStorage: status.availableResources.storage is the
// free space of the storages that hold VM disks: the simulator's 500 GiB
// local-lvm minus its template's disks (local holds ISOs only).
func TestClusterAvailableStorage(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	c := waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	av := c.Status.AvailableResources
	if av == nil || av.Storage == nil {
		t.Fatalf("availableResources = %+v, want storage", av)
	}
	if got := av.Storage.Value(); got <= 467<<30 || got > 468<<30 {
		t.Fatalf("availableResources.storage = %s, want 500Gi minus the template's 32Gi disk and cloud-init drive", av.Storage)
	}
}

// TestClusterCredentialRotation: the cluster's token Secret is watched, so
// a rotated token takes effect without a restart: a wrong one makes the
// cluster AuthenticationFailed, the right one connects it again.
func TestClusterCredentialRotation(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
	ctx := context.Background()
	setToken := func(v string) {
		t.Helper()
		var s corev1.Secret
		key := client.ObjectKey{Namespace: secretNamespace, Name: f.cluster.Spec.Credentials.TokenSecret.Name}
		if err := env.Client.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		s.Data["secret"] = []byte(v)
		if err := env.Client.Update(ctx, &s); err != nil {
			t.Fatal(err)
		}
	}
	waitReason := func(status metav1.ConditionStatus, reason hfv1.ConditionReason) {
		t.Helper()
		eventually(t, time.Minute, fmt.Sprintf("Connected %s (%s)", status, reason), func() error {
			c := &hfv1.HypervisorCluster{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), c); err != nil {
				return err
			}
			cond := hfv1.FindCondition(c.Status.Conditions, hfv1.HypervisorClusterConnectedCondition)
			if cond == nil || cond.Status != status || (reason != "" && !hfv1.HasReason(cond, reason)) {
				return fmt.Errorf("Connected = %+v", cond)
			}
			return nil
		})
	}
	setToken("a-rotated-token-the-hypervisor-does-not-know")
	waitReason(metav1.ConditionFalse, hfv1.AuthenticationFailedReason)
	setToken(simTokenSecret)
	waitReason(metav1.ConditionTrue, "")
}

// TestHungClusterHoldsUpNoOther: a cluster whose API stops answering
// (every request held, as behind a network partition) occupies one of the
// HypervisorCluster controller's workers until its probe gives up at
// spec.probeTimeout, and no other cluster waits for it: a cluster created
// while that probe hangs is Connected before the hung one has any
// Connected condition. With one worker (before), the new cluster was
// connected only after the hung probe's timeout and status write.
func TestHungClusterHoldsUpNoOther(t *testing.T) {
	hung, healthy := startSim(t, nil), startSim(t, nil)
	held, release := hung.holdRequests(nil)
	startOperator(t, operatorOptions{})
	fHung := newFixture(t, hung, func(c *hfv1.HypervisorCluster) {
		c.Spec.ProbeTimeout = &metav1.Duration{Duration: 30 * time.Second}
	})
	// Before the hung cluster is deleted and the operator stops (cleanups
	// run last first): its held probe would keep both until the timeout.
	t.Cleanup(release)
	eventually(t, 30*time.Second, "the hung cluster's first probe held", func() error {
		if held.Load() == 0 {
			return fmt.Errorf("no request held yet")
		}
		return nil
	})
	fUp := newFixture(t, healthy, nil)
	waitClusterReady(t, fUp.cluster, metav1.ConditionTrue)
	var got hfv1.HypervisorCluster
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(fHung.cluster), &got); err != nil {
		t.Fatal(err)
	}
	if c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorClusterConnectedCondition); c != nil {
		t.Fatalf("the healthy cluster was connected only after the hung one's probe gave up (%s: %s)", c.Reason, c.Message)
	}
}
