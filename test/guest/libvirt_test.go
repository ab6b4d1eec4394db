//go:build guest

package guest

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// TestGitHubJobOnLibvirt: a GitHub job on a real Debian guest of a real
// libvirtd, the image the Proxmox scenarios boot, served from the pool's
// standby tier. The world's cluster is a private libvirtd in the host's
// network namespace (its guests' QEMU user-mode network reaches the
// world's loopback servers), with the image as the template domain's
// volume. The pool keeps one standby VM: the operator clones the template
// (a qcow2 overlay on the image and a NoCloud seed in the media pool),
// Debian boots, cloud-init applies the seed, the agent says it waits for
// its credential, and the operator suspends the guest to disk (a libvirt
// managed save: the domain shut off with its memory in an image). Then
// one job is queued: the operator resumes the domain from its image, the
// agent gets its runner credential through the QEMU guest agent (with the
// operator's time and fresh entropy), registers and runs the job, whose
// step prints the guest's /etc/debian_version and its clock; the job
// succeeds, the VM powers off and its domain, its volumes and its saved
// image are gone from libvirtd. The guest boots once (a standby VM's boot
// is the cold path's), so this costs a cold job's boot plus a save and a
// restore.
//
// The guest's clock starts 30 s behind the host's (its RTC, devenv
// LibvirtHost.GuestClockBehind): a suspend alone does not put a guest's
// clock behind under TCG, whose emulated TSC goes on with the host's while
// the guest is saved, so the offset is what makes the check decisive. The
// job's step prints the guest's clock, which must be the host's within
// clockTolerance: the agent stepped it to the operator's time before it
// used its credential (mutation: freshen without its clock step fails
// this test; so did a step to the operator's time at the write alone,
// which set the clock of a guest that read its secrets seconds late back
// by that long).
func TestGitHubJobOnLibvirt(t *testing.T) {
	const clockBehind, clockTolerance = 30 * time.Second, 1500 * time.Millisecond
	d := libvirtd.Start(t, libvirtd.HostNetwork())
	dir := t.TempDir()
	img := image
	opts := devenv.Options{Dir: dir, AgentBinary: agentBinary, MaxReplicas: 1, Progress: testWriter{t}, GuestImage: &img,
		Libvirt: &devenv.LibvirtHost{SocketPath: d.SocketPath(), Dir: d.Dir(), GuestClockBehind: clockBehind}}
	w, err := devenv.Start(context.Background(), opts)
	if err != nil {
		keepLogs(t, dir)
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	t.Cleanup(func() {
		if t.Failed() {
			keepLogs(t, dir)
			t.Logf("libvirtd:\n%s", d.Logs())
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	conn := d.Dial(t)
	ctx := context.Background()

	start := time.Now()
	if err := w.SetStandby(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// The guest's QEMU CPU time, read from /proc while its domain runs:
	// the last reading before the domain goes away is its whole life
	// (a resumed QEMU's counts from the resume: guestUsage adds the runs).
	guest := guestUsage{}
	eventually(t, 20*time.Minute, "the standby VM booted and suspended to disk", func() error {
		guest.sample(t, d, conn)
		claim, err := onlyClaim(ctx, w)
		if err != nil {
			return err
		}
		if claim.Status.Standby == nil || claim.Status.Standby.SuspendedAt == nil {
			return fmt.Errorf("claim %s is %s, not standing by yet (guest domain %q)", claim.Name, claim.Status.Phase, guest.domain)
		}
		return nil
	})
	booted := time.Since(start)
	dom, err := conn.DomainLookupByName(guest.domain)
	if err != nil {
		t.Fatalf("the standby domain %s: %v", guest.domain, err)
	}
	if state, _, err := conn.DomainGetState(dom, 0); err != nil || golibvirt.DomainState(state) != golibvirt.DomainShutoff {
		t.Fatalf("standby domain %s: state %d, %v; want it shut off with its memory saved", guest.domain, state, err)
	}
	if saved, err := conn.DomainHasManagedSaveImage(dom, 0); err != nil || saved != 1 {
		t.Fatalf("standby domain %s has no managed save image (%d, %v)", guest.domain, saved, err)
	}
	queued := time.Now()
	job, err := w.GitHub.EnqueueJob(githubsim.JobRequest{Repository: devenv.Repository, Labels: []string{"self-hosted", devenv.JobLabel},
		Steps: []string{`echo "debian $(cat /etc/debian_version) kernel $(uname -r) on $(hostname) clock $(date +%s.%N) uptime $(cut -d" " -f1 /proc/uptime) clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"`}})
	if err != nil {
		t.Fatal(err)
	}
	var done githubsim.Job
	tierEmptied := false
	eventually(t, 10*time.Minute, "the job succeeded on the resumed libvirt guest", func() error {
		guest.sample(t, d, conn)
		if !tierEmptied {
			// Once the pool took the VM, the tier goes to 0: a refill
			// would boot a second guest for nothing.
			if claim, err := onlyClaim(ctx, w); err == nil && claim.Status.Standby != nil && claim.Status.Standby.ResumedAt != nil {
				if err := w.SetStandby(ctx, 0); err != nil {
					return err
				}
				tierEmptied = true
			}
		}
		j, ok := w.GitHub.Job(job.ID)
		if !ok {
			return fmt.Errorf("job %d unknown to the simulator", job.ID)
		}
		if j.Status != "completed" {
			return fmt.Errorf("job is %s (guest domain %q)", j.Status, guest.domain)
		}
		if j.Conclusion != "success" {
			t.Fatalf("job concluded %s; log:\n%s", j.Conclusion, j.Log)
		}
		done = j
		return nil
	})
	jobWall := time.Since(queued)
	if !tierEmptied {
		t.Fatal("the job ran, but its VM was never seen resumed from the standby tier (status.standby.resumedAt)")
	}
	if !strings.Contains(done.Log, "debian 12") {
		t.Errorf("job log %q; want it to have run on the Debian 12 guest", done.Log)
	}
	checkGuestClock(t, done, clockTolerance)
	eventually(t, 5*time.Minute, "the VM's domain, its volumes, its saved image and its claim gone", func() error {
		guest.sample(t, d, conn)
		return libvirtLeftovers(ctx, w, conn)
	})
	guest.logCPU(t)
	t.Logf("libvirt guest %s: booted and suspended %s after the tier was sized; job succeeded %s after it was queued on the resumed guest, domain and volumes gone after %s; QEMU CPU %.1f s",
		guest.domain, booted.Round(time.Second), jobWall.Round(time.Second), time.Since(start).Round(time.Second), guest.cpu.Seconds())
}

// onlyClaim is the world's one claim.
func onlyClaim(ctx context.Context, w *devenv.World) (hfv1.MachineClaim, error) {
	snap, err := w.Snapshot(ctx)
	if err != nil {
		return hfv1.MachineClaim{}, err
	}
	if len(snap.Claims) != 1 {
		return hfv1.MachineClaim{}, fmt.Errorf("%d claims, want 1", len(snap.Claims))
	}
	return snap.Claims[0], nil
}

// checkGuestClock checks the guest's clock as the job's step printed it
// ("clock <seconds since the epoch>") against the host's while the job
// ran (the simulator's start and completion times), within tolerance.
func checkGuestClock(t *testing.T, j githubsim.Job, tolerance time.Duration) {
	t.Helper()
	_, after, ok := strings.Cut(j.Log, " clock ")
	if !ok {
		t.Fatalf("the job printed no guest clock; log:\n%s", j.Log)
	}
	secs, err := strconv.ParseFloat(strings.Fields(after)[0], 64)
	if err != nil {
		t.Fatalf("guest clock %q: %v", after, err)
	}
	guestNow := time.Unix(0, int64(secs*1e9))
	if guestNow.Before(j.StartedAt.Add(-tolerance)) || guestNow.After(j.CompletedAt.Add(tolerance)) {
		t.Errorf("the guest's clock read %s while the job ran from %s to %s (host): off by more than %s after the resume (job log: %s)",
			guestNow.UTC().Format(time.RFC3339Nano), j.StartedAt.UTC().Format(time.RFC3339Nano), j.CompletedAt.UTC().Format(time.RFC3339Nano), tolerance, j.Log)
	}
}

// guestUsage follows the one clone domain of the scenario.
type guestUsage struct {
	domain string
	// cpu is the domain's QEMU CPU time over its runs: a resume from a
	// managed save is a new QEMU, whose time counts from zero, so a
	// reading below the last one starts a new run (earlier keeps the
	// runs before it).
	cpu, last, earlier time.Duration
}

// sample notes the running clone domain and its QEMU's CPU time so far.
func (g *guestUsage) sample(t *testing.T, d *libvirtd.Daemon, conn *golibvirt.Libvirt) {
	t.Helper()
	doms, _, err := conn.ConnectListAllDomains(1, golibvirt.ConnectListDomainsActive)
	if err != nil {
		t.Fatalf("list domains: %v", err)
	}
	for _, dom := range doms {
		if dom.Name == devenv.LibvirtTemplate {
			continue
		}
		if g.domain != "" && g.domain != dom.Name {
			t.Fatalf("a second clone domain %s beside %s for one job", dom.Name, g.domain)
		}
		g.domain = dom.Name
		// The domain may stop between the listing and the read: keep the
		// last reading then.
		if cpu, ok := d.DomainCPU(dom.Name); ok {
			if cpu < g.last {
				g.earlier += g.last
			}
			g.last, g.cpu = cpu, g.earlier+cpu
		}
	}
}

// logCPU appends the guest's line to the QEMU CPU log make test-guest
// keeps (qemu.EnvCPULog), in the format the Proxmox simulator's QEMUs
// write: its name, boot (it booted; libvirt clones resume no saved state)
// and its CPU-seconds, as last read while it ran.
func (g *guestUsage) logCPU(t *testing.T) {
	path := os.Getenv(qemu.EnvCPULog)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		_, err = fmt.Fprintf(f, "libvirt-%s boot %.2f\n", g.domain, g.cpu.Seconds())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Errorf("QEMU CPU log %s: %v", path, err)
	}
}

// libvirtLeftovers says what is left of the pool's VMs: claims, domains
// other than the template, volumes other than the template's; nil when
// nothing is.
func libvirtLeftovers(ctx context.Context, w *devenv.World, conn *golibvirt.Libvirt) error {
	snap, err := w.Snapshot(ctx)
	if err != nil {
		return err
	}
	var left []string
	for _, c := range snap.Claims {
		left = append(left, "claim "+c.Name)
	}
	doms, _, err := conn.ConnectListAllDomains(1, 0)
	if err != nil {
		return fmt.Errorf("list domains: %w", err)
	}
	for _, dom := range doms {
		if dom.Name != devenv.LibvirtTemplate {
			left = append(left, "domain "+dom.Name)
		}
	}
	for _, name := range []string{devenv.LibvirtVolumePool, devenv.LibvirtMediaPool} {
		pool, err := conn.StoragePoolLookupByName(name)
		if err != nil {
			return fmt.Errorf("pool %s: %w", name, err)
		}
		if err := conn.StoragePoolRefresh(pool, 0); err != nil {
			return fmt.Errorf("refresh pool %s: %w", name, err)
		}
		vols, _, err := conn.StoragePoolListAllVolumes(pool, 1, 0)
		if err != nil {
			return fmt.Errorf("volumes of pool %s: %w", name, err)
		}
		for _, v := range vols {
			if v.Name != devenv.LibvirtTemplateVolume {
				left = append(left, "volume "+name+"/"+v.Name)
			}
		}
	}
	if len(left) != 0 {
		return fmt.Errorf("left: %s", strings.Join(left, ", "))
	}
	return nil
}
