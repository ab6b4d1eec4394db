//go:build guest

package guest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/internal/testworld/spireworld"
)

var (
	spiffeImageOnce sync.Once
	spiffeImage     proxmoxsim.GuestImage
	spiffeImageErr  error
)

// spireImage is the template image with the agent and the cached
// spire-agent (built against this host's Debian 12, as the guest is),
// where docs/templates.md's SPIFFE section installs it.
func spireImage(t *testing.T) proxmoxsim.GuestImage {
	t.Helper()
	spiffeImageOnce.Do(func() {
		dir, err := spireworld.Dir()
		if err != nil {
			spiffeImageErr = err
			return
		}
		spiffeImageErr = buildImage(&spiffeImage, "--agent", agentBinary, "--spire-agent", filepath.Join(dir, "spire-agent"))
	})
	if spiffeImageErr != nil {
		t.Fatal(spiffeImageErr)
	}
	return spiffeImage
}

// spireResumable is spireImage with its saved state (resumable), for
// scenarios that test what runs in the guest rather than its boot.
func spireResumable(t *testing.T) proxmoxsim.GuestImage {
	t.Helper()
	dir, err := spireworld.Dir()
	if err != nil {
		t.Fatal(err)
	}
	return resumable(t, "--agent", agentBinary, "--spire-agent", filepath.Join(dir, "spire-agent"))
}

// TestSPIFFEOnRealGuest: a job on a real guest in SPIFFE mode. The
// operator places the join token and the broker proof in the running guest
// through its real QEMU guest agent (the Proxmox simulator forwards
// agent/file-write to qemu-ga); the guest's agent starts the image's
// spire-agent with that token, attests to the world's spire-server (on the
// host's loopback, which the guest reaches at the simulator's
// GuestHostAddress), and fetches its runner credential from the operator's
// broker with its X509-SVID and the proof: the claim is Attested, its
// status records the join token's delivery (joinTokenDeliveredAt) and its
// CredentialDelivered event names it, the join token
// was spent (its agent attested), the seed held neither the token nor a
// runner credential, no file on the disk holds the token (the disk scan),
// and afterwards nothing is left on the SPIRE server.
func TestSPIFFEOnRealGuest(t *testing.T) {
	img := spireResumable(t)
	td := spiffeid.RequireTrustDomainFromString(devenv.TrustDomain)
	// The SPIRE agents seen while the guest ran (probes run in goroutines).
	var mu sync.Mutex
	agents := map[string]bool{}
	probe := func(ctx context.Context, w *devenv.World, _ int, claim hfv1.MachineClaim) error {
		if !attested(claim) {
			return fmt.Errorf("claim %s is not Attested: %+v", claim.Name, claim.Status.Conditions)
		}
		// The delivery is in the claim's status (JoinTokenDelivered is a
		// line of the operator's log, not an event:
		// internal/controller/machineclaim/events.go).
		if id := claim.Status.Identity; id == nil || id.JoinTokenDeliveredAt == nil {
			return fmt.Errorf("claim %s is Attested without status.identity.joinTokenDeliveredAt", claim.Name)
		}
		on, err := w.SPIRELeftovers(ctx)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, s := range on {
			if id, ok := strings.CutPrefix(s, "agent "); ok {
				agents[id] = true
			}
		}
		return nil
	}
	w, last, tl := runJobs(t, scenario{jobs: 1, opts: devenv.Options{GuestImage: &img, SPIFFE: true}, probe: probe})

	tokens := 0
	for vm, secrets := range tl.secrets {
		for value, what := range secrets {
			if what != "joinToken" {
				continue
			}
			tokens++
			if id := spire.JoinTokenAgentID(td, value).String(); !agents[id] {
				t.Errorf("VM %s: no SPIRE agent %s attested with its join token (agents seen: %v)", vm, id, agents)
			}
		}
	}
	if tokens == 0 {
		t.Error("no join token derived for any claim")
	}
	evs, err := w.ClaimEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range last.Jobs {
		claim := vmOfRunner(j.RunnerName)
		if msg, ok := evs[claim]["CredentialDelivered"]; !ok || !strings.Contains(msg, j.RunnerName) {
			t.Errorf("claim %s: CredentialDelivered event %q, want one naming runner %s (events %v)", claim, msg, j.RunnerName, evs[claim])
		}
	}
	eventually(t, time.Minute, "nothing left on the SPIRE server", func() error {
		left, err := w.SPIRELeftovers(context.Background())
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%s", strings.Join(left, "; "))
		}
		return nil
	})
}

// attested: the claim's Attested condition is True.
func attested(c hfv1.MachineClaim) bool {
	cond := hfv1.FindCondition(c.Status.Conditions, hfv1.MachineClaimAttestedCondition)
	return cond != nil && cond.Status == metav1.ConditionTrue
}
