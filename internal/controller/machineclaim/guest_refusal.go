package machineclaim

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// GuestRefusals says why a claim's VM refused to run its job, as its
// power-off notice said (poweroff.GuestRefusals).
type GuestRefusals interface {
	Refusal(uid types.UID, now time.Time) string
}

// refusedByGuest fails a claim whose VM powered off because its agent
// refused to run the job (internal/agent, harden.go: the image lets the job
// user become root, and the VM's credential serves more than one job), and
// reports whether it did. Failed, not ended: a pool replacing the VM would
// get the same refusal from every VM of the image, and the failure counts
// towards the pool's replacement backoff. The notice is the VM's word; it
// only words the end of a claim whose VM the hypervisor reports powered off.
func (p *PowerOff) refusedByGuest(s *claimScope, poweredOff string) bool {
	claim := s.claim
	if p.GuestRefusals == nil || p.GuestRefusals.Refusal(claim.UID, s.clock.Now()) != agentconfig.GuestRefusalJobUserEscalates {
		return false
	}
	msg := fmt.Sprintf("%s: the VM's agent refused to run the job (exit code 14): the image's job user can become root (a sudo rule, "+
		"or a root-equivalent group such as docker), and the credential of HypervisorMachineTemplate %s serves more than one job on its CI "+
		"platform, which root in the VM could take. Rebuild the image as docs/templates.md says (\"The job user\"), use a single-job credential, "+
		"or set spec.guest.jobMayEscalate: true on the template to accept that a job can take the credential",
		poweredOff, claim.Spec.TemplateRef.Name)
	s.fail(claimEnd{reason: hfv1.EndFailed, condition: hfv1.JobUserCanEscalateReason, message: msg})
	s.recorder.Event(claim, corev1.EventTypeWarning, string(hfv1.JobUserCanEscalateReason), msg)
	return true
}
