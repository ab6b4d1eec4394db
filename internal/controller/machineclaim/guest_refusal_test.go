package machineclaim

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// guestRefusals is what VMs' agents refused, by claim UID.
type guestRefusals map[types.UID]string

func (g guestRefusals) Refusal(uid types.UID, _ time.Time) string { return g[uid] }

// TestGuestRefusalFailsTheClaim: a claim whose VM powered off after its
// agent refused to run the job (the image lets the job user become root
// and the credential is multi-job) fails with JobUserCanEscalate, a
// message that names the image, the template and the ways out, and a
// warning event; any other VM that powers off just ends.
func TestGuestRefusalFailsTheClaim(t *testing.T) {
	for name, tc := range map[string]struct {
		said       string
		wantFailed bool
	}{
		"the agent refused the job": {said: agentconfig.GuestRefusalJobUserEscalates, wantFailed: true},
		"nothing said":              {},
		"something else said":       {said: "SomethingElse"},
	} {
		t.Run(name, func(t *testing.T) {
			r, _, _, rec := serviceWorld(t)
			c := unitClaim("runner-1", 0)
			c.Spec.TemplateRef.Name = "debian"
			r.PowerOff.GuestRefusals = guestRefusals{c.UID: tc.said}
			drainEvents(rec)
			inScope(r, &c, func(s *claimScope) { r.endPoweredOff(context.Background(), s, "VM proxmox://1001 powered off") })
			end := c.Status.End
			switch {
			case end == nil:
				t.Fatal("the claim did not end")
			case tc.wantFailed && (!end.Failed || end.Reason != hfv1.EndFailed):
				t.Fatalf("end %+v; want failed", end)
			case !tc.wantFailed && (end.Failed || end.Reason != hfv1.EndPoweredOff):
				t.Fatalf("end %+v; want powered_off, not failed", end)
			}
			if !tc.wantFailed {
				return
			}
			for _, says := range []string{"VM proxmox://1001 powered off", "exit code 14", "HypervisorMachineTemplate debian", "docs/templates.md", "spec.guest.jobMayEscalate"} {
				if !strings.Contains(end.Message, says) {
					t.Errorf("the message %q does not say %q", end.Message, says)
				}
			}
			if p := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimProvisionedCondition); p == nil || p.Reason != string(hfv1.JobUserCanEscalateReason) {
				t.Errorf("Provisioned = %+v, want reason JobUserCanEscalate", p)
			}
			if events := drainEvents(rec); !hasEvent(events, "Warning JobUserCanEscalate") {
				t.Errorf("events %q", events)
			}
		})
	}
}
