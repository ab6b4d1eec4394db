// Package testobjects holds the small API objects and keys that unit tests
// of several controller packages start from (internal/controller and
// internal/controller/machineclaim): one copy, so that a change of what a
// claim's end or a GitHub template looks like reaches every test at once.
package testobjects

import (
	"bytes"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// Signer is the ownership key of the unit tests (operator id "unit", a
// fixed key of the minimum length).
func Signer(t testing.TB) *ownership.Signer {
	t.Helper()
	s, err := ownership.NewSigner("unit", bytes.Repeat([]byte{7}, ownership.MinKeyLength))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// EndOf is the status.end a claim in phase has (nil before it ends).
func EndOf(phase hfv1.MachineClaimPhase) *hfv1.MachineClaimEnd {
	switch phase {
	case hfv1.MachineClaimTerminating:
		return &hfv1.MachineClaimEnd{Reason: hfv1.EndPoweredOff}
	case hfv1.MachineClaimFailed:
		return &hfv1.MachineClaimEnd{Reason: hfv1.EndFailed, Failed: true}
	case hfv1.MachineClaimFinished:
		return &hfv1.MachineClaimEnd{Reason: hfv1.EndJobCompleted, FinishedAt: &metav1.Time{}}
	}
	return nil
}

// GitHubTemplate is a GitHub Actions template (namespace ci, name debian,
// organization octo-org), changed by mutate.
func GitHubTemplate(mutate func(*hfv1.HypervisorMachineTemplate)) *hfv1.HypervisorMachineTemplate {
	tmpl := &hfv1.HypervisorMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "debian"}}
	tmpl.Spec.Bootstrap.GitHub = &hfv1.GitHubBootstrap{Owner: "octo-org", Organization: "octo-org"}
	if mutate != nil {
		mutate(tmpl)
	}
	return tmpl
}
