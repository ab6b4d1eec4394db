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
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// TestForgedReservationGetsNoVM replays the tenant escape of a forged
// hyperfleet.io/vm-reservation annotation (where claims placed by an
// earlier operator keep their reservation, and where this one still reads
// it): a namespace the cluster does not admit writes the annotation
// (unsigned, with a made-up signature, and copied from a real claim of an
// admitted namespace: the reservation the install's key signs for that
// claim's VM) naming a VM id outside the cluster's range. None of its claims may get a VM or a credential;
// each says why it waits and records the refused reservation.
func TestForgedReservationGetsNoVM(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.AllowedNamespaces = &metav1.LabelSelector{MatchLabels: map[string]string{"hyperfleet.io/tenant": "yes"}}
	})
	// A real claim of an admitted namespace, and the reservation of its VM
	// as the install's key signs it.
	legit := waitPhase(t, f.newClaim("legit"), hfv1.MachineClaimBootstrapping, 60*time.Second)
	ref := legit.Status.VMRef
	signed := strings.Join([]string{ref.HypervisorCluster, ref.Node, testSigner.SignReservation(ownership.Reservation{
		ClaimUID: string(legit.UID), Cluster: ref.HypervisorCluster, Node: ref.Node, VM: ref.ProviderID}), ref.ProviderID}, "/")
	if parts := strings.SplitN(signed, "/", 4); len(parts) != 4 || parts[3] != legit.Status.VMRef.ProviderID || !strings.HasPrefix(parts[2], "r2.") {
		t.Fatalf("the operator wrote reservation %q, want <cluster>/<node>/<signature>/%s", signed, legit.Status.VMRef.ProviderID)
	}
	node := legit.Status.VMRef.Node

	intruder := f.namespace + "-x"
	f.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: intruder}})
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: intruder}})
	})
	f.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: intruder, Name: "github"}, StringData: map[string]string{"token": "ghp_intruder"}})
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: intruder, Name: f.template.Name}, Spec: *f.template.Spec.DeepCopy()}
	f.create(tmpl)

	forgeries := map[string]string{
		"unsigned":   fmt.Sprintf("%s/%s/4242", f.cluster.Name, node),
		"made-up":    fmt.Sprintf("%s/%s/r2.1.bm90LWEtc2lnbmF0dXJl/proxmox://4242", f.cluster.Name, node),
		"made-up-r1": fmt.Sprintf("%s/%s/4242/r1.1.bm90LWEtc2lnbmF0dXJl", f.cluster.Name, node),
		"copied":     signed,
		"re-pointed": strings.Replace(signed, "/"+legit.Status.VMRef.ID(), "/proxmox://4242", 1),
	}
	var claims []*hfv1.MachineClaim
	for name, annotation := range forgeries {
		c := &hfv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: intruder, Name: name, Annotations: map[string]string{hfv1.VMReservationAnnotation: annotation}},
			Spec:       hfv1.MachineClaimSpec{TemplateRef: hfv1.ObjectName{Name: tmpl.Name}},
		}
		f.create(c)
		claims = append(claims, c)
	}
	for _, c := range claims {
		eventually(t, 60*time.Second, "claim "+c.Name+" refused", func() error {
			got, err := getClaim(t, c)
			if err != nil {
				return err
			}
			cond := hfv1.FindCondition(got.Status.Conditions, hfv1.MachineClaimProvisionedCondition)
			if cond == nil || (cond.Reason != string(hfv1.NamespaceNotAllowedReason) && cond.Reason != string(hfv1.TemplateNotReadyReason)) {
				return fmt.Errorf("Provisioned condition %+v, want NamespaceNotAllowed or TemplateNotReady", cond)
			}
			return rejectedEvent(c)
		})
	}
	// Give a wrongly restored reservation every chance to act.
	time.Sleep(3 * time.Second)
	for _, vm := range sim.VMs() {
		if vm.VMID == 4242 {
			t.Fatalf("VM 4242 exists: %+v", vm)
		}
	}
	if vms := operatorVMs(sim); len(vms) != 1 || vms[0].VMID != int(legit.Status.VMRef.VMID) {
		t.Fatalf("operator VMs %+v, want only the admitted claim's VM %d", vms, legit.Status.VMRef.VMID)
	}
	for _, c := range claims {
		got, err := getClaim(t, c)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.VMRef != nil || got.Status.Bootstrap != nil || got.Status.Phase != hfv1.MachineClaimPending {
			t.Fatalf("claim %s: vmRef %+v, bootstrap %+v, phase %q; want no VM, no credential, Pending", c.Name, got.Status.VMRef, got.Status.Bootstrap, got.Status.Phase)
		}
	}
}

// rejectedEvent finds the ReservationRejected event of claim c.
func rejectedEvent(c *hfv1.MachineClaim) error {
	var events corev1.EventList
	if err := env.Client.List(context.Background(), &events, client.InNamespace(c.Namespace)); err != nil {
		return err
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == c.Name && e.Reason == string(hfv1.ReservationRejectedReason) {
			return nil
		}
	}
	return fmt.Errorf("no %s event for claim %s", hfv1.ReservationRejectedReason, c.Name)
}
