//go:build guest

package guest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// standbyAge is how long the standby VM's saved state is at least when it
// is resumed: over agentconfig.MaxClockSkew, so that the guest's clock,
// which stood still from the save, is off by more than the agent
// tolerates, and the agent must step it (and renew its lease) for the
// checks to pass.
const standbyAge = 3 * time.Second

// probedMark is the file the probe creates in the guest once it has seen
// everything: the job's one step waits for it, so that the VM runs until
// it has been looked at, and no longer.
const probedMark = "/run/hyperfleet-standby-probed"

// waitProbed is the job's step: it waits 25 s at most, since the GitHub
// simulator's runner does not poll while its steps run, and a runner
// silent for 30 s (devenv's HeartbeatTimeout) fails its job.
var waitProbed = `for i in $(seq 50); do [ -e ` + probedMark + ` ] && exit 0; sleep 0.5; done; echo "the test never probed the resumed guest"; exit 1`

// TestStandbyOnRealGuest: a RunnerPool's standby tier of one VM on real
// guests (docs/runnerpool.md, "Standby"). The tier's VM is cloned and
// resumes the image's saved state (no cold boot), its seed's runcmd
// downloads the agent from the operator, and the operator
// suspends it to disk (the Proxmox simulator migrates QEMU's state into
// the state volume's file and QEMU quits: realguest_suspend.go). Once it
// has stood by for standbyAge, one job is queued: the pool takes the VM,
// the operator resumes it (a new QEMU loading that state on the VM's own
// overlay), places its credential, and its runner registers and runs the
// job; the VM is destroyed after, and the tier is emptied once the VM was
// taken, so that nothing is refilled.
//
// Inside the resumed guest, through its guest agent (standbyProbe): the
// agent reseeded the kernel's random number generator before it used the
// credential, and stepped the clock by at least standbyAge (so the guest
// resumed with its clock stopped at the save), which is then within 1 s
// of the host's; its DHCP lease was renewed after the resume (the lease
// file's newest lease acknowledged since) and is the address the claim
// reports, the guest's own.
//
// Mutation: freshen without the clock step fails the clock checks; without
// the lease renewal, the lease check (the newest lease is the one resumeGuest
// took when the VM was made); resumeRealGuestLocked booting instead of
// loading the state makes the agent start afresh after its config was
// removed, and no runner ever comes online.
func TestStandbyOnRealGuest(t *testing.T) {
	img := resumable(t)
	sp := &standbyProbe{}
	var world *devenv.World
	var emptied sync.Once
	// The agent from the operator, on the image without one: the saved
	// state TestRunnerPoolJobsOnRealGuests resumes too, which a new agent
	// does not make again.
	runJobs(t, scenario{jobs: 1, opts: devenv.Options{GuestImage: &img, AgentFromOperator: true},
		prepare: func(t *testing.T, w *devenv.World, sample func()) {
			world = w
			sp.standBy(t, w, sample)
		},
		onClaim: func(c hfv1.MachineClaim) error {
			// Taken for the job: the pool's only room (maxReplicas 1) is
			// the job's until its VM is destroyed, and then a refill would
			// boot another guest.
			var err error
			if !c.Spec.Standby && c.Status.Standby != nil && c.Status.Standby.ResumedAt != nil {
				emptied.Do(func() { err = world.SetStandby(context.Background(), 0) })
			}
			return err
		},
		probe: sp.probe,
		steps: []string{waitProbed},
	})
	if t.Failed() {
		t.Logf("the standby VM's agent journal, as the probe last read it:\n%s", sp.lastJournal)
	}
	t.Logf("standby VM %d: suspended at %s (state %d MiB on the host), resumed at %s; the agent stepped its clock by %s (then %s off the host's at most) and renewed its lease of %s (acknowledged at %s)",
		sp.vmid, sp.suspendedAt.Format(time.TimeOnly), sp.stateBytes>>20, sp.resumedAt.Format(time.TimeOnly), sp.stepped, sp.offBy.Round(time.Millisecond), sp.addr, sp.ackedAt.Format(time.TimeOnly))
}

// standbyProbe readies the standby tier and reads the resumed guest's own
// view.
type standbyProbe struct {
	mu sync.Mutex
	// Set by standBy, before the probe runs.
	vmid        int
	suspendedAt time.Time
	stateBytes  int64
	// What the probe found, once it succeeded.
	resumedAt, ackedAt time.Time
	stepped            time.Duration
	// offBy is how far the guest's clock was from the host's, at most
	// (the call to read it included).
	offBy time.Duration
	addr  string
	// lastJournal is the agent's journal as the probe last read it.
	lastJournal string
}

// standBy sizes the tier to one VM and waits until that VM stands by
// (status.standby.suspendedAt set and the VM locked "suspended"), then
// until its state is older than standbyAge.
func (sp *standbyProbe) standBy(t *testing.T, w *devenv.World, sample func()) {
	t.Helper()
	ctx := context.Background()
	if err := w.SetStandby(ctx, 1); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
		sample()
		snap, err := w.Snapshot(ctx)
		if err == nil && sp.found(snap) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby VM suspended within 15 minutes: claims %d, VMs %+v", len(snap.Claims), snap.VMs)
		}
	}
	// While it stands by, its memory is at rest in the state volume's
	// file, and QEMU is gone.
	vol, ok := stateVolumeOf(w.Proxmox.State(), sp.vmid)
	fi, err := os.Stat(vol.File)
	if !ok || err != nil || fi.Size() == 0 {
		t.Fatalf("VM %d stands by without its state at rest: volume %+v, file %v", sp.vmid, vol, err)
	}
	sp.stateBytes = fi.Size()
	// suspendedAt has whole seconds: a second more makes sure.
	until := sp.suspendedAt.Add(time.Second + standbyAge)
	for ; time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
		sample()
	}
}

// found records the standby claim's VM once it stands by.
func (sp *standbyProbe) found(snap devenv.Snapshot) bool {
	for _, c := range snap.Claims {
		if !c.Spec.Standby || c.Status.Standby == nil || c.Status.Standby.SuspendedAt == nil {
			continue
		}
		for _, vm := range snap.VMs {
			if vm.Name == c.Name && vm.Lock == "suspended" {
				sp.mu.Lock()
				sp.vmid, sp.suspendedAt = vm.VMID, c.Status.Standby.SuspendedAt.Time
				sp.mu.Unlock()
				return true
			}
		}
	}
	return false
}

// stateVolumeOf is VM vmid's saved state volume.
func stateVolumeOf(st proxmoxsim.State, vmid int) (proxmoxsim.VolumeState, bool) {
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			if v.VMID == vmid && strings.Contains(v.VolID, "-state-suspend-") {
				return v, true
			}
		}
	}
	return proxmoxsim.VolumeState{}, false
}

// sectionMark separates the parts of the probe's answer.
const sectionMark = "@@hyperfleet-probe@@"

var (
	steppedRE = regexp.MustCompile(`msg="clock stepped to the operator's[^"]*" by=(\S+)`)
	inetRE    = regexp.MustCompile(`\binet (\d+\.\d+\.\d+\.\d+)/`)
)

// probe checks the resumed standby VM from inside: the agent's journal,
// the clock, eth0's address and its DHCP lease file. It fails until the
// agent has made the guest fresh.
func (sp *standbyProbe) probe(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error {
	sp.mu.Lock()
	standby := sp.vmid
	sp.mu.Unlock()
	if vmid != standby {
		return fmt.Errorf("VM %d is not the standby VM %d: a job took a VM of its own", vmid, standby)
	}
	if claim.Status.Standby == nil || claim.Status.Standby.ResumedAt == nil {
		return errors.New("not resumed yet")
	}
	resumedAt := claim.Status.Standby.ResumedAt.Time
	// The clock first, on its own: the call's duration bounds the check.
	before := time.Now()
	date, err := guestStdout(ctx, w, vmid, "date", "+%s.%N")
	after := time.Now()
	if err != nil {
		return err
	}
	sec, nsec, _ := strings.Cut(date, ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	ns, err2 := strconv.ParseInt(nsec, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("the guest's date %q: %w", date, err)
	}
	guestNow := time.Unix(s, ns)
	// The rest in one call: eth0's address, dhclient's leases, the agent's
	// journal (-m: journald writes under the machine-id the guest booted
	// with, which the simulator replaced when it made the guest its VM).
	out, err := guestStdout(ctx, w, vmid, "sh", "-c", "ip -4 -o addr show dev eth0; echo "+sectionMark+
		"; cat /var/lib/dhcp/dhclient.eth0.leases; echo "+sectionMark+"; journalctl -m -u hyperfleet-agent.service -o cat --no-pager")
	if err != nil {
		return err
	}
	sections := strings.SplitN(out, sectionMark+"\n", 3)
	if len(sections) != 3 {
		return fmt.Errorf("the guest's answer has %d sections, want 3:\n%s", len(sections), out)
	}
	ip, leases, journal := sections[0], sections[1], sections[2]
	sp.mu.Lock()
	sp.lastJournal = journal
	sp.mu.Unlock()
	lines := strings.Split(journal, "\n")
	at := func(s string) int {
		for i, l := range lines {
			if strings.Contains(l, s) {
				return i
			}
		}
		return -1
	}
	reseeded, used, renewed := at("random number generator reseeded with the operator's entropy"), at("runner credential obtained"), at("DHCP leases renewed after the resume")
	switch {
	case used < 0 || renewed < 0:
		return errors.New("the agent has not used its credential yet")
	case reseeded < 0 || reseeded > used:
		return fmt.Errorf("the agent used its credential (line %d) without reseeding first (line %d)", used, reseeded)
	case !strings.Contains(lines[renewed], "interfaces=eth0"):
		return fmt.Errorf("the agent renewed the leases of other interfaces than eth0: %s", lines[renewed])
	}
	m := steppedRE.FindStringSubmatch(journal)
	if m == nil {
		return fmt.Errorf("the agent did not step the clock of a guest resumed after %s: its journal:\n%s", standbyAge, journal)
	}
	stepped, err := time.ParseDuration(m[1])
	if err != nil {
		return fmt.Errorf("the agent's clock step %q: %w", m[1], err)
	}
	if stepped < standbyAge {
		return fmt.Errorf("the agent stepped the clock by %s, want at least the %s the state was old", stepped, standbyAge)
	}
	if guestNow.Before(before.Add(-agentconfig.MaxClockSkew)) || guestNow.After(after.Add(agentconfig.MaxClockSkew)) {
		return fmt.Errorf("the guest's clock read %s, the host's %s to %s: more than %s off", guestNow.Format(time.StampMilli), before.Format(time.StampMilli), after.Format(time.StampMilli), agentconfig.MaxClockSkew)
	}
	im := inetRE.FindStringSubmatch(ip)
	if im == nil {
		return fmt.Errorf("eth0 has no IPv4 address: %s", ip)
	}
	addr := im[1]
	reported := false
	if nw := claim.Status.Network; nw != nil {
		for _, a := range nw.Addresses {
			reported = reported || strings.Split(a, "/")[0] == addr
		}
	}
	if !reported {
		return fmt.Errorf("eth0's address %s is not among the claim's %+v", addr, claim.Status.Network)
	}
	l, err := lastLease(leases)
	if err != nil {
		return err
	}
	// The lease file has whole seconds, resumedAt too; the guest's clock
	// is within MaxClockSkew.
	if l.addr != addr || l.ackedAt.Before(resumedAt.Add(-agentconfig.MaxClockSkew)) {
		return fmt.Errorf("the newest lease is of %s acknowledged at %s, want eth0's %s renewed since the resume at %s:\n%s",
			l.addr, l.ackedAt.Format(time.TimeOnly), addr, resumedAt.Format(time.TimeOnly), leases)
	}
	// Seen: the job's step may end.
	if _, err := guestStdout(ctx, w, vmid, "touch", probedMark); err != nil {
		return err
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.resumedAt, sp.ackedAt, sp.stepped, sp.addr = resumedAt, l.ackedAt, stepped, addr
	sp.offBy = max(guestNow.Sub(before).Abs(), after.Sub(guestNow).Abs())
	return nil
}

// guestStdout runs argv in the guest and returns its output.
func guestStdout(ctx context.Context, w *devenv.World, vmid int, argv ...string) (string, error) {
	res, err := w.Proxmox.GuestExec(ctx, vmid, argv...)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("%s in the guest exited %d: %s", strings.Join(argv, " "), res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout), nil
}

// dhcpLease is the newest lease of an ISC dhclient lease file: its
// address and when the server acknowledged it (its expiry less its
// length: dhclient counts the lease from the acknowledgement).
type dhcpLease struct {
	addr    string
	ackedAt time.Time
}

var (
	fixedAddressRE = regexp.MustCompile(`fixed-address (\S+);`)
	leaseTimeRE    = regexp.MustCompile(`option dhcp-lease-time (\d+);`)
	expireRE       = regexp.MustCompile(`expire \d+ (\d{4}/\d\d/\d\d \d\d:\d\d:\d\d);`)
)

func lastLease(file string) (dhcpLease, error) {
	i := strings.LastIndex(file, "lease {")
	if i < 0 {
		return dhcpLease{}, fmt.Errorf("no lease in the lease file:\n%s", file)
	}
	block := file[i:]
	fa, lt, ex := fixedAddressRE.FindStringSubmatch(block), leaseTimeRE.FindStringSubmatch(block), expireRE.FindStringSubmatch(block)
	if fa == nil || lt == nil || ex == nil {
		return dhcpLease{}, fmt.Errorf("the newest lease lacks its address, length or expiry:\n%s", block)
	}
	secs, _ := strconv.Atoi(lt[1])
	// dhclient writes its times in UTC.
	expire, err := time.Parse("2006/01/02 15:04:05", ex[1])
	if err != nil {
		return dhcpLease{}, fmt.Errorf("the newest lease's expiry: %w", err)
	}
	return dhcpLease{addr: fa[1], ackedAt: expire.Add(-time.Duration(secs) * time.Second)}, nil
}
