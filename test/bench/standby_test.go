//go:build bench

package bench

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// standbyStarts sizes the pool's standby tier, waits until its VMs are
// suspended to disk, then serves n jobs one at a time, each once the tier
// is full again, and measures job queued -> runner online against what
// the simulators took for the same VM: its resume, the credential's
// placement and the guest's registration. It runs on Proxmox's own task
// times (the realistic preset), as the cold starts do, and reads a
// standby VM's idle cost from the simulator's state; warm is a warm VM's
// (warmPool's), shown next to it. A job not served within its wait ends
// the figure with the jobs served so far, so that a stalled tier still
// yields its report (and fails the small run).
func standbyStarts(t *testing.T, w *devenv.World, px *recorder, size, n int, warm bench.IdleCost) bench.Standby {
	ctx := context.Background()
	lat, restore := realisticTimings(t, w)
	defer restore()

	waitEmpty(t, w, 3*time.Minute)
	base := hostMemory(w)
	if err := w.SetStandby(ctx, int32(size)); err != nil {
		t.Fatal(err)
	}
	out := bench.Standby{Size: size, Warm: warm}
	for i := range n {
		// A new VM of the tier takes a clone, a boot and a suspend: about
		// half a minute on the realistic preset.
		memory, ok := waitTierReady(t, w, size, 3*time.Minute)
		if !ok {
			t.Logf("standby: the tier of %d was not ready within 3 minutes before job %d of %d", size, i+1, n)
			break
		}
		if i == 0 {
			out.Idle = idleCost(w, base, memory)
		}
		s, ok := serveFromTier(t, w, px, lat, memory)
		if !ok {
			break
		}
		out.Starts = append(out.Starts, s)
	}
	if err := w.SetStandby(ctx, 0); err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, w, 3*time.Minute)
	return out
}

// waitTierReady waits until the pool's only claims are its standby tier's,
// every one suspended to disk (status.standby.suspendedAt) and counted
// ready in the pool's status (what the pool decides on), and the only VMs
// theirs, locked suspended. It returns the tier's VMs' memory by VM id.
func waitTierReady(t *testing.T, w *devenv.World, size int, d time.Duration) (map[int]int64, bool) {
	t.Helper()
	var memory map[int]int64
	ok := waitUntil(d, func() bool {
		claims := poolClaims(t, w)
		if len(claims) != size {
			return false
		}
		for _, c := range claims {
			if !c.Spec.Standby || c.Status.Standby == nil || c.Status.Standby.SuspendedAt == nil {
				return false
			}
		}
		var pool hfv1.RunnerPool
		if err := w.API.Client.Get(context.Background(), poolKey(), &pool); err != nil {
			return false
		}
		if st := pool.Status.Standby; st == nil || int(st.Ready) != size {
			return false
		}
		vms := operatorVMs(w)
		if len(vms) != size {
			return false
		}
		memory = map[int]int64{}
		for _, vm := range vms {
			mib, err := strconv.ParseInt(vm.Config["memory"], 10, 64)
			if vm.Lock != "suspended" || err != nil {
				return false
			}
			memory[vm.VMID] = mib << 20
		}
		return true
	})
	return memory, ok
}

// serveFromTier queues one job and measures it: queued -> runner online
// (the GitHub simulator's times and a 20 ms poll of its runners), the
// resume and credential write its VM received (the Proxmox requests), and
// the physical minimum for the same VM from the preset lat. It is false
// when the job was not served by a VM of the tier within two minutes.
func serveFromTier(t *testing.T, w *devenv.World, px *recorder, lat proxmoxsim.Latency, memory map[int]int64) (bench.StandbyStart, bool) {
	px.trace(true)
	var up time.Time
	stop := make(chan struct{})
	wait := every20ms(stop, func(now time.Time) {
		if up.IsZero() && runnerOnline(w) {
			up = now
		}
	})
	ids, err := w.EnqueueJobs(1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	done := waitUntil(2*time.Minute, func() bool {
		j, _ := w.GitHub.Job(ids[0])
		return j.Status == "completed"
	})
	close(stop)
	wait()
	vms := px.trace(false)
	if !done {
		t.Logf("standby: job %d not completed within 2 minutes", ids[0])
		return bench.StandbyStart{}, false
	}
	j, _ := w.GitHub.Job(ids[0])
	if up.IsZero() || (!j.StartedAt.IsZero() && up.After(j.StartedAt)) {
		// The runner was online by the time it started the job; the
		// 20 ms poll can see it later than GitHub's own start time.
		up = j.StartedAt
	}
	var resumed []int
	for id, vm := range vms {
		if n, err := strconv.Atoi(id); err == nil && !vm.resume.IsZero() {
			resumed = append(resumed, n)
		}
	}
	if len(resumed) != 1 || memory[resumed[0]] == 0 {
		t.Errorf("standby: job %d was served with %d resumes (VMs %v) of the tier's VMs %v, want one: the pool did not take a standby VM for it", ids[0], len(resumed), resumed, memory)
		return bench.StandbyStart{}, false
	}
	vmid := resumed[0]
	vm := vms[strconv.Itoa(vmid)]
	// The resume task takes the preset's fixed part plus its part per GiB
	// of the VM's memory (the simulator's handleResume); the credential
	// is written through the guest agent, whose call the preset times as
	// any API call's (lat.API). Registration is the guest's own time from
	// the resume's end, or from the credential's write when the operator
	// made it later: the wait for the credential is the operator's.
	resume := time.Duration(lat.Resume) + time.Duration(float64(memory[vmid])/(1<<30)*float64(lat.ResumePerGiB))
	placement := time.Duration(lat.API)
	resumeEnd := vm.resume.Add(resume)
	ready := resumeEnd
	if !vm.placed.IsZero() && vm.placed.Add(placement).After(ready) {
		ready = vm.placed.Add(placement)
	}
	s := bench.StandbyStart{Total: up.Sub(j.CreatedAt), Resume: resume, Placement: placement, Registration: max(0, up.Sub(ready)),
		ToResume: vm.resume.Sub(j.CreatedAt)}
	if !vm.placed.IsZero() {
		s.ToCredential = max(0, vm.placed.Sub(resumeEnd))
	}
	var delivered time.Time
	for _, d := range w.GitHub.Deliveries() {
		if d.JobID == j.ID && d.Action == "queued" && !d.DeliveredAt.IsZero() {
			delivered = d.DeliveredAt
		}
	}
	// Where the time went, for whoever reads a miss: the operator's parts
	// (queued -> resume request, resume end -> credential written) and the
	// hypervisor's and the guest's.
	t.Logf("standby job %d on VM %d: %s against %s (ratio %.3f): queued -> webhook delivered %s, -> resume request %s; resume %s; resume end -> credential written %s; -> runner online %s",
		j.ID, vmid, s.Total.Round(time.Millisecond), s.Physical().Round(time.Millisecond), bench.Ratio(s.Total, s.Physical()),
		since(j.CreatedAt, delivered), since(j.CreatedAt, vm.resume), resume, since(resumeEnd, vm.placed), since(ready, up))
	return s, true
}

// since is to - from for the log, or "never" when to was not seen.
func since(from, to time.Time) string {
	if to.IsZero() {
		return "never"
	}
	return to.Sub(from).Round(time.Millisecond).String()
}

// hostMemory is the host memory the Proxmox simulator's nodes hold.
func hostMemory(w *devenv.World) int64 {
	var used int64
	for _, n := range w.Proxmox.State().Nodes {
		used += n.MemUsed
	}
	return used
}

// idleCost reads from the simulator what each VM of vms (by id) holds
// while it waits for a job: the host memory above base (what the nodes
// held with no VM of the pool), its disks and its saved memory (the state
// volume of a suspend to disk), each averaged over the VMs.
func idleCost(w *devenv.World, base int64, vms map[int]int64) bench.IdleCost {
	st := w.Proxmox.State()
	var c bench.IdleCost
	for _, n := range st.Nodes {
		c.Memory += n.MemUsed
	}
	c.Memory -= base
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			if _, ok := vms[v.VMID]; !ok || v.Content != "images" {
				continue
			}
			if strings.Contains(v.VolID, "-state-") {
				c.State += v.Size
			} else {
				c.Disk += v.Size
			}
		}
	}
	k := int64(max(len(vms), 1))
	return bench.IdleCost{Memory: c.Memory / k, Disk: c.Disk / k, State: c.State / k}
}

// waitUntil polls cond every 50 ms until it holds (true) or d passes
// (false).
func waitUntil(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func poolKey() client.ObjectKey {
	return client.ObjectKey{Namespace: devenv.Namespace, Name: devenv.PoolName}
}

// runningVMs are the pool's VMs that run, with their memory by VM id.
func runningVMs(t *testing.T, w *devenv.World) map[int]int64 {
	t.Helper()
	out := map[int]int64{}
	for _, vm := range operatorVMs(w) {
		if vm.Status != "running" {
			continue
		}
		mib, err := strconv.ParseInt(vm.Config["memory"], 10, 64)
		if err != nil {
			t.Fatalf("VM %d: memory %q: %v", vm.VMID, vm.Config["memory"], err)
		}
		out[vm.VMID] = mib << 20
	}
	return out
}
