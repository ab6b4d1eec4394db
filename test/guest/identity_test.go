//go:build guest

package guest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// guestID is who a running guest says it is.
type guestID struct {
	machineID, hostname string
}

// identities collects the guests' own view of who they are, to check
// that guests resumed from one saved state each became their own VM.
type identities struct {
	mu  sync.Mutex
	ids map[string]guestID // VM name -> identity
}

// probe reads a configured guest's identity through its guest agent:
// its machine-id, host name (the claim's name, from its seed), its NIC's
// MAC (the VM's, which the claim reports) and its clock (the host's,
// within a minute: a resumed guest runs on from the moment of the save
// unless its clock is stepped). A guest is configured once its seed wrote
// the agent's unit (the agent removes its config file as it starts; which
// runner each VM's agent registered is runJobs' check).
func (ids *identities) probe(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
	res, err := w.Proxmox.GuestExec(ctx, vmid, "sh", "-c",
		`test -f /etc/systemd/system/hyperfleet-agent.service && cat /etc/machine-id && hostname && cat /sys/class/net/eth0/address && date +%s`)
	if err != nil {
		return err
	}
	f := strings.Split(strings.TrimSpace(res.Stdout), "\n")
	if res.ExitCode != 0 || len(f) != 4 {
		return fmt.Errorf("guest not configured yet: exit %d: %q %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	id := guestID{machineID: f[0], hostname: f[1]}
	if id.hostname != claim.Name {
		return fmt.Errorf("host name %q, want the claim's %q", id.hostname, claim.Name)
	}
	if st := claim.Status.Network; st == nil || !strings.EqualFold(st.MACAddress, f[2]) {
		return fmt.Errorf("eth0's MAC %s is not the one the claim reports (%+v)", f[2], claim.Status.Network)
	}
	secs, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return fmt.Errorf("the guest's date: %w", err)
	}
	if skew := time.Since(time.Unix(secs, 0)); skew > time.Minute || skew < -time.Minute {
		return fmt.Errorf("the guest's clock is %s off the host's", skew)
	}
	ids.mu.Lock()
	defer ids.mu.Unlock()
	ids.ids[claim.Name] = id
	return nil
}

// checkDistinct fails the test unless n guests were probed, each with a
// machine-id of its own (their host names are their claims').
func (ids *identities) checkDistinct(t *testing.T, n int) {
	t.Helper()
	machines := map[string]bool{}
	for _, id := range ids.ids {
		machines[id.machineID] = true
	}
	if len(ids.ids) != n || len(machines) != n {
		t.Errorf("%d guests, want %d, each with its own machine-id: %+v", len(ids.ids), n, ids.ids)
	}
}
