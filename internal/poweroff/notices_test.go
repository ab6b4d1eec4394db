package poweroff

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/event"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/agentserver"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// TestNoticesKeepJobReports: a notice with a genuine token that says its
// runner started a job (or that its agent refused the job) is kept for the
// pool (and the claim); a forged one is refused before it is read, and one
// that says nothing keeps nothing.
func TestNoticesKeepJobReports(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	claim := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-1", UID: "uid-1"}}
	quiet := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-2", UID: "uid-2"}}
	signer, err := ownership.NewSigner("test", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	n := &Notices{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(claim, quiet).Build(), Signer: signer, Jobs: NewJobReports(),
		GuestRefusals: NewGuestRefusals()}
	notice := func(c *hfv1.MachineClaim, jobStarted bool) agentconfig.PowerOffNotice {
		return agentconfig.PowerOffNotice{ClaimRef: agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)},
			PowerOffNoticeBody: agentconfig.PowerOffNoticeBody{RunnerOnline: true, JobStarted: jobStarted}}
	}
	ctx := context.Background()
	for _, c := range []struct {
		ref   agentconfig.ClaimRef
		token string
	}{
		{notice(claim, true).ClaimRef, "forged"},
		{notice(claim, true).ClaimRef, signer.PowerOffToken("ci", "runner-2", "uid-2")},
		{agentconfig.ClaimRef{Namespace: "ci", Name: "runner-1", UID: "uid-2"}, signer.PowerOffToken("ci", "runner-1", "uid-1")},
	} {
		if err := n.AuthorizePowerOff(c.ref, c.token); !errors.Is(err, agentserver.ErrBadToken) {
			t.Fatalf("token %q for %+v: %v, want ErrBadToken", c.token, c.ref, err)
		}
	}
	for _, c := range []*hfv1.MachineClaim{quiet, claim} {
		if err := n.AuthorizePowerOff(notice(c, false).ClaimRef, signer.PowerOffToken(c.Namespace, c.Name, string(c.UID))); err != nil {
			t.Fatalf("%s's own token: %v", c.Name, err)
		}
	}
	if err := n.PowerOffNotice(ctx, notice(quiet, false)); err != nil {
		t.Fatal(err)
	}
	refused := notice(claim, true)
	refused.GuestRefusal = agentconfig.GuestRefusalJobUserEscalates
	if err := n.PowerOffNotice(ctx, refused); err != nil {
		t.Fatal(err)
	}
	if got := n.GuestRefusals.Refusal(claim.UID, time.Now()); got != agentconfig.GuestRefusalJobUserEscalates || n.GuestRefusals.Refusal(quiet.UID, time.Now()) != "" {
		t.Fatalf("guest refusals: runner-1 %q (want %s), runner-2 %q (want none)", got, agentconfig.GuestRefusalJobUserEscalates, n.GuestRefusals.Refusal(quiet.UID, time.Now()))
	}
	if !n.Jobs.JobStarted(claim.UID, time.Now()) || n.Jobs.JobStarted(quiet.UID, time.Now()) {
		t.Fatalf("reports: runner-1 %v (want true), runner-2 %v (want false)", n.Jobs.JobStarted(claim.UID, time.Now()), n.Jobs.JobStarted(quiet.UID, time.Now()))
	}
}

func TestJobReportsExpireAndAreBounded(t *testing.T) {
	r := NewJobReports()
	now := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	r.Add("a", now)
	if !r.JobStarted("a", now.Add(reportTTL)) || r.JobStarted("a", now.Add(reportTTL+time.Second)) {
		t.Fatal("a report is kept for reportTTL and no longer")
	}
	var nilReports *JobReports
	if nilReports.JobStarted("a", now) {
		t.Fatal("a nil set knows something")
	}
	for i := range maxReports {
		r.Add(types.UID(strconv.Itoa(i)), now)
	}
	r.Add("late", now)
	if r.JobStarted("late", now) || len(r.at) > maxReports {
		t.Fatalf("%d reports kept, the bound is %d", len(r.at), maxReports)
	}
	// Once the old ones expired they make room.
	r.Add("later", now.Add(reportTTL+time.Second))
	if !r.JobStarted("later", now.Add(reportTTL+time.Second)) {
		t.Fatal("expired reports did not make room")
	}
}

// TestReadyHintWakesTheClaim: a ready hint with the claim's own token
// wakes that claim and is kept (ReadyHints: a standby claim's VM is
// suspended once its agent said so); another claim's token is
// refused before anything is read, and a hint for a claim without a VM,
// an ended one or a gone one wakes nothing. Only the leader takes it.
func TestReadyHintWakesTheClaim(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	vm := &hfv1.VMReference{HypervisorCluster: "pve", Node: "pve1", VMID: 1000}
	booting := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-1", UID: "uid-1"}, Status: hfv1.MachineClaimStatus{VMRef: vm}}
	unplaced := &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-2", UID: "uid-2"}}
	signer, err := ownership.NewSigner("test", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan event.GenericEvent, 4)
	elected := make(chan struct{})
	n := &Notices{Reader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(booting, unplaced).Build(), Signer: signer, ClaimEvents: events, Elected: elected,
		ReadyHints: NewReadyHints()}
	ref := func(c *hfv1.MachineClaim) agentconfig.ClaimRef {
		return agentconfig.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}
	}
	if err := n.AuthorizeReady(ref(booting), signer.PowerOffToken("ci", "runner-2", "uid-2")); !errors.Is(err, agentserver.ErrBadToken) {
		t.Fatalf("another claim's token: %v, want ErrBadToken", err)
	}
	if err := n.AuthorizeReady(ref(booting), signer.PowerOffToken("ci", "runner-1", "uid-1")); err != nil {
		t.Fatalf("the claim's own token: %v", err)
	}
	ctx := context.Background()
	if err := n.ReadyHint(ctx, ref(booting)); !errors.Is(err, agentserver.ErrRetry) {
		t.Fatalf("a replica that does not lead: %v, want ErrRetry", err)
	}
	close(elected)
	for _, c := range []agentconfig.ClaimRef{ref(unplaced), {Namespace: "ci", Name: "runner-1", UID: "uid-9"}, {Namespace: "ci", Name: "gone", UID: "uid-3"}, ref(booting)} {
		if err := n.ReadyHint(ctx, c); err != nil {
			t.Fatalf("ReadyHint(%+v): %v", c, err)
		}
	}
	if len(events) != 1 {
		t.Fatalf("%d claims woken, want the booting one only", len(events))
	}
	if e := <-events; e.Object.GetNamespace() != "ci" || e.Object.GetName() != "runner-1" {
		t.Fatalf("woke %s/%s", e.Object.GetNamespace(), e.Object.GetName())
	}
	for uid, want := range map[types.UID]bool{"uid-1": true, "uid-2": false, "uid-9": false, "uid-3": false} {
		if got := n.ReadyHeard(uid); got != want {
			t.Errorf("ReadyHeard(%s) = %v, want %v (only the accepted hint is kept)", uid, got, want)
		}
	}
}
