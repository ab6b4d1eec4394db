//go:build guest

package guest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	golibvirt "github.com/digitalocean/go-libvirt"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/libvirtd"
	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/qemu"
)

// TestGitHubJobOnLibvirt: a GitHub job on a real Debian guest of a real
// libvirtd, the image the Proxmox scenarios boot. The world's cluster is
// a private libvirtd in the host's network namespace (its guests' QEMU
// user-mode network reaches the world's loopback servers), with the
// image as the template domain's volume. One job is queued at the GitHub
// simulator; the operator clones the template (a qcow2 overlay on the
// image and a NoCloud seed in the media pool), Debian boots, cloud-init
// applies the seed, the agent gets its runner credential through the
// QEMU guest agent, registers and runs the job, whose step prints the
// guest's /etc/debian_version; the job succeeds, the VM powers off and
// its domain and volumes are gone from libvirtd. The guest's wall time
// and QEMU CPU time are logged.
func TestGitHubJobOnLibvirt(t *testing.T) {
	d := libvirtd.Start(t, libvirtd.HostNetwork())
	dir := t.TempDir()
	img := image
	opts := devenv.Options{Dir: dir, AgentBinary: agentBinary, MaxReplicas: 1, Progress: testWriter{t}, GuestImage: &img,
		Libvirt: &devenv.LibvirtHost{SocketPath: d.SocketPath(), Dir: d.Dir()}}
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

	start := time.Now()
	job, err := w.GitHub.EnqueueJob(githubsim.JobRequest{Repository: devenv.Repository, Labels: []string{"self-hosted", devenv.JobLabel},
		Steps: []string{`echo "debian $(cat /etc/debian_version) kernel $(uname -r) on $(hostname)"`}})
	if err != nil {
		t.Fatal(err)
	}
	// The guest's QEMU CPU time, read from /proc while its domain runs:
	// the last reading before the domain goes away is its whole life.
	guest := guestUsage{}
	var done githubsim.Job
	eventually(t, 20*time.Minute, "the job succeeded on a libvirt guest", func() error {
		guest.sample(t, d, conn)
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
	jobWall := time.Since(start)
	if !strings.Contains(done.Log, "debian 12") {
		t.Errorf("job log %q; want it to have run on the Debian 12 guest", done.Log)
	}
	if guest.domain == "" {
		t.Fatal("the job succeeded but no clone domain was ever seen running on libvirtd")
	}
	eventually(t, 5*time.Minute, "the VM's domain, its volumes and its claim gone", func() error {
		guest.sample(t, d, conn)
		return libvirtLeftovers(context.Background(), w, conn)
	})
	guest.logCPU(t)
	t.Logf("libvirt guest %s: job succeeded %s after it was queued, domain and volumes gone after %s; QEMU CPU %.1f s",
		guest.domain, jobWall.Round(time.Second), time.Since(start).Round(time.Second), guest.cpu.Seconds())
}

// guestUsage follows the one clone domain of the scenario.
type guestUsage struct {
	domain string
	cpu    time.Duration
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
			g.cpu = cpu
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
