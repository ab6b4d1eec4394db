package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// These tests cover docs/security.md, "An honest API": a field the
// operator does not act on makes its object not Ready, with a reason and a
// message naming the field, and nothing is built from it: no VM is cloned
// and no credential issued. Each then removes the field and sees the
// object work, so that the "nothing built" checks could fail.

// waitCondition waits until the object's condition typ has status and reason.
func waitCondition(t *testing.T, obj client.Object, conds func() []metav1.Condition, typ string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	return waitConditionSaying(t, obj, conds, typ, status, reason, "")
}

// waitConditionSaying waits for the condition with a message containing
// text. A status can pass through the right reason with a message written
// from an older view (a claim whose template's refusal had not reached
// the operator's cache yet reads "not validated yet") before it settles.
func waitConditionSaying(t *testing.T, obj client.Object, conds func() []metav1.Condition, typ string, status metav1.ConditionStatus, reason, text string) *metav1.Condition {
	t.Helper()
	var got *metav1.Condition
	eventually(t, 60*time.Second, fmt.Sprintf("%T %s %s=%s/%s saying %q", obj, obj.GetName(), typ, status, reason, text), func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		got = meta.FindStatusCondition(conds(), typ)
		if got == nil || got.Status != status || got.Reason != reason || !strings.Contains(got.Message, text) {
			return fmt.Errorf("%s = %+v", typ, got)
		}
		return nil
	})
	return got
}

func waitClaimProvisioned(t *testing.T, claim *hfv1.MachineClaim, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	return waitCondition(t, claim, func() []metav1.Condition { return claim.Status.Conditions }, string(hfv1.MachineClaimProvisionedCondition), status, reason)
}

// wantNothingBuilt checks that no VM exists on the simulator and that no
// credential was issued for the claim.
func wantNothingBuilt(t *testing.T, sim *simulator, claim *hfv1.MachineClaim) {
	t.Helper()
	if vms := operatorVMs(sim); len(vms) != 0 {
		t.Errorf("%d VMs were cloned, want none: %+v", len(vms), vms)
	}
	if n := credentialsIssuedFor(claim); n != 0 {
		t.Errorf("%d credentials were issued for claim %s, want none", n, claim.Name)
	}
}

// wantBuilt waits for the claim's VM and checks that exactly one
// credential was issued for it.
func wantBuilt(t *testing.T, claim *hfv1.MachineClaim) {
	t.Helper()
	waitPhase(t, claim, hfv1.MachineClaimBootstrapping, 60*time.Second)
	// Issued once the VM runs, and placed in it.
	waitClaimBootstrapped(t, claim, hfv1.CredentialDeliveredReason)
	if n := credentialsIssuedFor(claim); n != 1 {
		t.Errorf("%d credentials were issued for claim %s, want 1", n, claim.Name)
	}
}

func updateTemplate(t *testing.T, tmpl *hfv1.HypervisorMachineTemplate, mutate func(*hfv1.HypervisorMachineTemplate)) {
	t.Helper()
	// The operator writes the template's status meanwhile: read again on
	// a conflict.
	err := retry.RetryOnConflict(conflictRetry, func() error {
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(tmpl), tmpl); err != nil {
			return err
		}
		mutate(tmpl)
		return env.Client.Update(context.Background(), tmpl)
	})
	if err != nil {
		t.Fatalf("update template %s: %v", tmpl.Name, err)
	}
}

// TestRefusedTemplatesBuildNothing: a template with attestation join-token
// or tpm on a cluster without spec.spire is SPIRENotConfigured, one asking systemd-networkd for a DHCP lease time is
// DHCPClientUnsupported, one whose cloud-init renders without per-VM
// values but not for a VM is TemplateInvalid; their claims wait with
// TemplateNotReady, without a VM or a credential.
func TestRefusedTemplatesBuildNothing(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	waitTemplate(t, f.template, metav1.ConditionTrue, "")

	cases := []struct {
		name, reason, text string
		mutate             func(*hfv1.HypervisorMachineTemplate)
	}{
		{"join-token", string(hfv1.SPIRENotConfiguredReason), "has no spec.spire", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationJoinToken, JoinToken: &hfv1.JoinTokenAttestation{TTL: &metav1.Duration{Duration: 15 * time.Minute}}}
		}},
		{"tpm", string(hfv1.SPIRENotConfiguredReason), "spec.attestation.method is tpm, but HypervisorCluster", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationTPM, TPM: &hfv1.TPMAttestation{AddVirtualTPM: true}}
		}},
		{"networkd-lease-time", string(hfv1.DHCPClientUnsupportedReason), "spec.network.dhcp.client: systemd-networkd", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.Network.DHCP = &hfv1.DHCPOptions{Client: hfv1.DHCPClientNetworkd, LeaseTime: &metav1.Duration{Duration: time.Hour}}
		}},
		{"per-vm-render", string(hfv1.TemplateInvalidReason), "userData", func(tm *hfv1.HypervisorMachineTemplate) {
			tm.Spec.CloudInit = &hfv1.CloudInit{UserData: "#cloud-config\n{{ if .RunnerName }}runcmd: [{{ .NoSuchVariable }}]{{ end }}\n"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := f.template.DeepCopy()
			tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: tc.name}
			tmpl.Status = hfv1.HypervisorMachineTemplateStatus{}
			tc.mutate(tmpl)
			f.create(tmpl)
			waitTemplate(t, tmpl, metav1.ConditionFalse, tc.reason)
			ready := waitCondition(t, tmpl, func() []metav1.Condition { return tmpl.Status.Conditions }, string(hfv1.ReadyCondition), metav1.ConditionFalse, tc.reason)
			if !strings.Contains(ready.Message, tc.text) {
				t.Errorf("Ready message %q does not mention %q", ready.Message, tc.text)
			}

			claim := &hfv1.MachineClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "claim-" + tc.name},
				Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
			}
			f.create(claim)
			// The claim's message gives the template's reason once the
			// operator has seen the template's refusal.
			waitConditionSaying(t, claim, func() []metav1.Condition { return claim.Status.Conditions },
				string(hfv1.MachineClaimProvisionedCondition), metav1.ConditionFalse, string(hfv1.TemplateNotReadyReason), tc.reason)
			wantNothingBuilt(t, sim, claim)
			if err := env.Client.Delete(context.Background(), claim); err != nil {
				t.Fatal(err)
			}
		})
	}

	// Without the field the same template works: a VM and one credential.
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "join-token"}}
	updateTemplate(t, tmpl, func(tm *hfv1.HypervisorMachineTemplate) {
		tm.Spec.Attestation = hfv1.Attestation{Method: hfv1.AttestationNone}
	})
	waitTemplate(t, tmpl, metav1.ConditionTrue, "")
	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "claim-fixed"},
		Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
	}
	f.create(claim)
	wantBuilt(t, claim)
}

// TestRefusedPoolAndClaim: a RunnerPool or a MachineClaim whose CI
// platform (GitLab CI) differs from its template's (GitHub) is refused
// with InvalidSpec naming the missing section, and builds nothing.
func TestRefusedPoolAndClaim(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	waitTemplate(t, f.template, metav1.ConditionTrue, "")
	ctx := context.Background()

	claim := &hfv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "gitlab"},
		Spec: hfv1.MachineClaimSpec{
			TemplateRef:    hfv1.ObjectName{Name: f.template.Name},
			WorkloadConfig: &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitLabCI},
		},
	}
	f.create(claim)
	cond := waitClaimProvisioned(t, claim, metav1.ConditionFalse, string(hfv1.InvalidSpecReason))
	if !strings.Contains(cond.Message, "spec.bootstrap.gitlab") {
		t.Errorf("claim message %q does not name the field", cond.Message)
	}
	wantNothingBuilt(t, sim, claim)

	pool := &hfv1.RunnerPool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.namespace, Name: "gitlab"},
		Spec: hfv1.RunnerPoolSpec{
			TemplateRef: hfv1.ObjectName{Name: f.template.Name},
			Workload:    hfv1.Workload{Type: hfv1.WorkloadGitLabCI, GitLab: &hfv1.GitLabWorkload{Tags: []string{"linux"}}},
			Scaling:     hfv1.Scaling{MinReplicas: 2, MaxReplicas: 4},
		},
	}
	f.create(pool)
	ready := waitCondition(t, pool, func() []metav1.Condition { return pool.Status.Conditions }, string(hfv1.ReadyCondition), metav1.ConditionFalse, string(hfv1.InvalidSpecReason))
	if !strings.Contains(ready.Message, "spec.workload.type is gitlab-ci, but HypervisorMachineTemplate") || !strings.Contains(ready.Message, "has no spec.bootstrap.gitlab") {
		t.Errorf("pool message %q does not name the field", ready.Message)
	}
	var claims hfv1.MachineClaimList
	if err := env.Client.List(ctx, &claims, client.InNamespace(f.namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 0 {
		t.Errorf("the refused pool created %d claims, want none", len(claims.Items))
	}

	// Fixed, both work.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(claim), claim); err != nil {
		t.Fatal(err)
	}
	claim.Spec.WorkloadConfig = &hfv1.WorkloadConfig{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubRunnerConfig{Labels: []string{"linux"}}}
	if err := env.Client.Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	wantBuilt(t, claim)

	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
		t.Fatal(err)
	}
	pool.Spec.Workload = hfv1.Workload{Type: hfv1.WorkloadGitHubActions, GitHub: &hfv1.GitHubWorkload{Labels: []string{"linux"}}}
	if err := env.Client.Update(ctx, pool); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the fixed pool creates its minReplicas claims", func() error {
		if err := env.Client.List(ctx, &claims, client.InNamespace(f.namespace), client.MatchingLabels{hfv1.RunnerPoolLabel: pool.Name}); err != nil {
			return err
		}
		if len(claims.Items) != 2 {
			return fmt.Errorf("%d claims", len(claims.Items))
		}
		return nil
	})
}
