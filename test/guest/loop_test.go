//go:build guest

package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"

	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// The milestones of one VM's life, in the order they must happen.
var milestones = bench.GuestMilestones

// timeline records when each VM reached each milestone, sampled twice a
// second (job times are the GitHub simulator's own, a power-off missed
// between samples the start of the VM's destroy task).
type timeline struct {
	mu    sync.Mutex
	vms   map[string]map[string]time.Time // VM name -> milestone -> time
	ids   map[string]int
	addrs map[string][]string // VM name -> addresses the claim reported
	// secrets are the single-use credentials of each VM, value -> what it
	// is: those of its seed, read while the seed ISO exists (none since
	// the seed holds none; kept to catch one that does), what the operator
	// placed in the running VM (placed), and in SPIFFE mode the join
	// token and broker proof (derived from the claim as the operator
	// derives them). seeded are those found on the seed alone.
	secrets, seeded map[string]map[string]string
	// placed are the secrets the operator wrote into each running VM
	// through its guest agent, by VM id (captured from the Proxmox
	// simulator's requests: the guest's file is gone once read).
	placed *placedSecrets
	// resumes are the operator's resume requests.
	resumes *resumeRequests
	// identities derives the join tokens, enrollment proofs and broker
	// proofs (SPIFFE mode only).
	identities *identity.Issuer
	// leaks names where the GitHub PAT appeared: it must never leave the
	// operator (guests' consoles, the simulators' state).
	leaks []string
}

// addSecret records that value (what it is) is a credential of vm in m.
func (tl *timeline) addSecret(m map[string]map[string]string, vm, value, what string) {
	if m[vm] == nil {
		m[vm] = map[string]string{}
	}
	m[vm][value] = what
}

func (tl *timeline) mark(vm, milestone string, at time.Time) {
	if tl.vms[vm] == nil {
		tl.vms[vm] = map[string]time.Time{}
	}
	if _, seen := tl.vms[vm][milestone]; !seen {
		tl.vms[vm][milestone] = at
	}
}

func (tl *timeline) sample(w *devenv.World) {
	snap, err := w.Snapshot(context.Background())
	if err != nil {
		return
	}
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	claims := map[string]bool{}
	for _, c := range snap.Claims {
		claims[c.Name] = true
	}
	present := map[string]bool{}
	for _, vm := range snap.VMs {
		// A clone carries a temporary name until the operator names it
		// after its claim.
		if !claims[vm.Name] && tl.vms[vm.Name] == nil {
			continue
		}
		present[vm.Name] = true
		tl.ids[vm.Name] = vm.VMID
		tl.mark(vm.Name, "created", now)
		_, suspended := tl.vms[vm.Name]["suspended"]
		switch {
		case vm.Lock == "suspended":
			tl.mark(vm.Name, "suspended", now)
		case suspended && vm.Status == "running" && vm.AgentUp:
			tl.mark(vm.Name, "resumed", now)
		}
		if at, ok := tl.resumes.of(vm.VMID); ok {
			tl.mark(vm.Name, "resume asked", at)
		}
		if at, ok := tl.placed.placedAt(vm.VMID); ok && suspended {
			tl.mark(vm.Name, "credential placed", at)
			// The operator places the credential once the guest agent
			// answers: a resumed guest answered by then at the latest,
			// whatever the samples, twice a second, saw.
			if resumed, ok := tl.vms[vm.Name]["resumed"]; ok && resumed.After(at) {
				tl.vms[vm.Name]["resumed"] = at
			}
		}
		if vm.Status == "running" {
			tl.mark(vm.Name, "booted", now)
			console, err := w.Proxmox.Console(vm.VMID)
			// A guest resumed from a saved state has no cloud-init: the
			// simulator marks its console when it has configured it.
			booted := bytes.Contains(console, []byte("Cloud-init v.")) && bytes.Contains(console, []byte(" finished at "))
			if err == nil && (booted || bytes.Contains(console, []byte(proxmoxsim.ResumedMark))) {
				tl.mark(vm.Name, "cloud-init done", now)
			}
			if bytes.Contains(console, []byte(devenv.PAT)) {
				tl.leaks = append(tl.leaks, "console of "+vm.Name)
			}
		}
		// A VM suspended to disk reads stopped too.
		if _, booted := tl.vms[vm.Name]["booted"]; booted && vm.Status == "stopped" && vm.Lock != "suspended" {
			tl.mark(vm.Name, "powered off", now)
		}
	}
	pve := w.Proxmox.State()
	for name := range tl.vms {
		if present[name] {
			continue
		}
		// A VM can power off and be destroyed between two samples; it
		// was off before its destroy task started (Proxmox refuses to
		// destroy a running VM).
		if _, off := tl.vms[name]["powered off"]; !off {
			if at, ok := destroyStart(pve, tl.ids[name]); ok {
				tl.mark(name, "powered off", at)
			}
		}
		tl.mark(name, "destroyed", now)
	}
	for _, c := range snap.Claims {
		if c.Status.Network != nil && len(c.Status.Network.Addresses) > 0 {
			tl.addrs[c.Name] = c.Status.Network.Addresses
		}
		if tl.identities != nil && c.Status.Identity != nil {
			// What the operator places (identity.Issuer.GuestSecrets): a
			// VM that attests with its TPM gets an enrollment proof
			// instead of a join token.
			if g, err := tl.identities.GuestSecrets(&c); err == nil {
				for value, what := range map[string]string{g.JoinToken: "joinToken", g.EnrollmentProof: "enrollmentProof", g.BrokerProof: "brokerProof"} {
					if value != "" {
						tl.addSecret(tl.secrets, c.Name, value, what)
					}
				}
			}
		}
	}
	// A seed is the ISO volume a VM's CD-ROM names.
	seedOf := map[string]string{}
	for _, vm := range pve.VMs {
		for _, v := range vm.Config {
			if volid, _, _ := strings.Cut(v, ","); strings.Contains(volid, ":iso/") && tl.vms[vm.Name] != nil {
				seedOf[volid] = vm.Name
			}
		}
	}
	for name, id := range tl.ids {
		for value, what := range tl.placed.of(id) {
			tl.addSecret(tl.secrets, name, value, what)
		}
	}
	for _, st := range pve.Storages {
		for _, vol := range st.Volumes {
			if name := seedOf[vol.VolID]; name != "" {
				for value, what := range seedSecrets(vol.Files) {
					tl.addSecret(tl.secrets, name, value, what)
					tl.addSecret(tl.seeded, name, value, what)
				}
			}
		}
	}
	for name, state := range map[string]any{"Proxmox simulator state": pve, "GitHub simulator state": w.GitHub.State()} {
		if data, err := json.Marshal(state); err == nil && bytes.Contains(data, []byte(devenv.PAT)) {
			tl.leaks = append(tl.leaks, name)
		}
	}
	for _, r := range w.GitHub.State().Runners {
		vm := vmOfRunner(r.Name)
		if tl.vms[vm] != nil && r.Status == "online" {
			tl.mark(vm, "runner online", now)
		}
	}
	for _, j := range snap.Jobs {
		vm := vmOfRunner(j.RunnerName)
		if tl.vms[vm] == nil {
			continue
		}
		if !j.StartedAt.IsZero() {
			tl.mark(vm, "job started", j.StartedAt)
		}
		if !j.CompletedAt.IsZero() {
			tl.mark(vm, "job completed", j.CompletedAt)
		}
	}
}

// resumeRequests are when the operator first asked the Proxmox simulator
// to resume each VM (POST .../qemu/<vmid>/status/resume), by VM id.
type resumeRequests struct {
	mu sync.Mutex
	at map[int]time.Time
}

// observe is a devenv.Options.OnProxmoxRequest.
func (rr *resumeRequests) observe(r *http.Request) {
	path := strings.Split(r.URL.Path, "/")
	if r.Method != http.MethodPost || len(path) < 4 || !strings.HasSuffix(r.URL.Path, "/status/resume") {
		return
	}
	vmid, err := strconv.Atoi(path[len(path)-3])
	if err != nil {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if _, seen := rr.at[vmid]; !seen {
		rr.at[vmid] = time.Now()
	}
}

// of is when VM vmid's resume was first asked for.
func (rr *resumeRequests) of(vmid int) (time.Time, bool) {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	at, ok := rr.at[vmid]
	return at, ok
}

// destroyStart is when the last destroy task of vmid started (a UPID's
// fifth field is its start time, hex Unix seconds).
func destroyStart(pve proxmoxsim.State, vmid int) (time.Time, bool) {
	var at time.Time
	for _, task := range pve.Tasks {
		f := strings.Split(task.UPID, ":")
		if task.Type != "qmdestroy" || task.ID != strconv.Itoa(vmid) || len(f) < 5 {
			continue
		}
		if sec, err := strconv.ParseInt(f[4], 16, 64); err == nil {
			at = time.Unix(sec, 0)
		}
	}
	return at, !at.IsZero()
}

// vmOfRunner: a runner is named <claim>-<uid part>-<install mark>, its VM
// after the claim.
func vmOfRunner(runner string) string {
	vm := runner
	for range 2 {
		vm = vm[:max(strings.LastIndex(vm, "-"), 0)]
	}
	return vm
}

// TestRunnerPoolJobsOnRealGuests: the operator, both simulators and real
// guests. A RunnerPool runs 2 jobs, each on a fresh VM that resumes the
// image's saved state (its own overlay, identity, address and seed given
// after the resume: docs/guest-snapshots.md; TestRealGuestThroughTheProxmoxAPI
// boots cold through cloud-init), starts the agent under systemd, runs the job against the GitHub simulator over QEMU's
// network and powers itself off; the operator destroys it. Afterwards no
// VM, ISO, claim, runner or guest disk is left, and the guests' disks hold
// no credential.
//
// The pool's template has agentSource Operator, on the image without an
// agent: the seed's runcmd downloads the agent from the operator's agent
// server (HTTPS, its CA from the seed), checks its SHA-256 and installs it
// before the unit starts it. Every other real-guest scenario runs the agent
// the image holds, so both sources run here, and this scenario boots no
// guest of its own for the operator's (a boot under TCG is about two
// minutes of a core: docs/testing.md, "CI timings").
//
// The two guests resume one saved state, and each must be its own VM
// (identities.probe): its own machine-id, the claim's host name and MAC,
// and the host's time.
//
// Mutation: resumeGuest (internal/testworld/simulator/proxmox/
// realguest_resume.go) without the new machine-id fails this test; so
// does it without the clock step, with a state saved over a minute
// earlier (the cached state of an earlier run). The old test booted each
// guest and had nothing to check here.
//
// Each job's one step is a hostile job's look at what it runs under
// (jobUserCheck): as the runner's user, it sees no process of another
// user, cannot find or read the agent (root) nor read the memory of or
// attach to the runner (its own user's, its ancestor), and cannot become
// root; the job fails otherwise (docs/templates.md, "The job user").
func TestRunnerPoolJobsOnRealGuests(t *testing.T) {
	img := resumable(t)
	ids := &identities{ids: map[string]guestID{}}
	_, last, _ := runJobs(t, scenario{jobs: 2, opts: devenv.Options{GuestImage: &img, AgentFromOperator: true}, steps: []string{jobUserCheck()}, probe: ids.probe})
	// Both guests resumed one saved state; each became its own VM.
	ids.checkDistinct(t, 2)
	for _, j := range last.Jobs {
		if !jobUserChecked(j.Log) {
			t.Errorf("job %d did not check what it runs under; its steps printed:\n%s", j.ID, j.Log)
		}
	}
}

// keepLogs copies a failed scenario's world directory (the operator's and
// the simulators' logs, the guests' consoles) to
// $TMPDIR/hyperfleet-guest-<test name>.
func keepLogs(t *testing.T, dir string) {
	keep := filepath.Join(os.TempDir(), "hyperfleet-guest-"+strings.ReplaceAll(t.Name(), "/", "-"))
	_ = os.RemoveAll(keep)
	if err := os.CopyFS(keep, os.DirFS(dir)); err == nil {
		t.Logf("logs kept in %s", keep)
	}
}

// scenario is a run of jobs through a world of real guests.
type scenario struct {
	// jobs are queued at once, on a pool of at most that many VMs.
	jobs int
	opts devenv.Options
	// probe, when set, reads a running guest's own view (its agent
	// answers). It runs on every sample until it returns nil, which it
	// must have done for every VM that ran a job.
	probe func(ctx context.Context, w *devenv.World, vmid int, claim hfv1.MachineClaim) error
	// onClaim, when set, is called with every claim of every sample, from
	// its first sighting (before its VM boots): what the world outside the
	// operator prepares per claim, such as a DHCP reservation for its host
	// name. An error fails the test.
	onClaim func(claim hfv1.MachineClaim) error
	// prepare, when set, runs once the world is up, before the jobs are
	// queued (the queueing is the timings' zero): what the pool must have
	// first, such as its standby tier. It calls sample while it waits, so
	// that its VMs' milestones are recorded.
	prepare func(t *testing.T, w *devenv.World, sample func())
	// onProxmoxRequest, when set, sees every request to the Proxmox
	// simulator once the world has started, before the simulator handles
	// it: what a VM's volumes hold just before the operator destroys it
	// (its TPM state, Simulator.TPMState) is gone after.
	onProxmoxRequest func(w *devenv.World, r *http.Request)
	// steps, when set, are what every job runs on its runner, in the guest
	// (githubsim.JobRequest.Steps): a job succeeds when they do. Without
	// steps a job lasts 5 s.
	steps []string
}

// runJobs runs the scenario and checks everything the loop promises. It
// returns the world, still running (the test's cleanup stops it), its
// last snapshot and the VMs' timeline.
func runJobs(t *testing.T, sc scenario) (*devenv.World, devenv.Snapshot, *timeline) {
	dir := t.TempDir()
	opts := sc.opts
	opts.Dir, opts.AgentBinary, opts.MaxReplicas, opts.Progress = dir, agentBinary, int32(sc.jobs), testWriter{t}
	opts.KeepGuestDisks = filepath.Join(dir, "destroyed-disks")
	placed := &placedSecrets{byVM: map[int]map[string]string{}, firstAt: map[int]time.Time{}}
	resumes := &resumeRequests{at: map[int]time.Time{}}
	var started atomic.Pointer[devenv.World]
	opts.OnProxmoxRequest = func(r *http.Request) {
		placed.observe(r)
		resumes.observe(r)
		if w := started.Load(); w != nil && sc.onProxmoxRequest != nil {
			sc.onProxmoxRequest(w, r)
		}
	}
	w, err := devenv.Start(context.Background(), opts)
	if err != nil {
		// The operator's and the simulators' logs say why the world did
		// not come up; keep them as a failed scenario's are kept.
		keepLogs(t, dir)
		t.Fatal(err)
	}
	started.Store(w)
	tl := &timeline{vms: map[string]map[string]time.Time{}, ids: map[string]int{}, addrs: map[string][]string{},
		secrets: map[string]map[string]string{}, seeded: map[string]map[string]string{}, placed: placed, resumes: resumes}
	if opts.SPIFFE {
		signer, err := manager.LoadOrCreateSigner(context.Background(), w.API.Client, manager.SignerOptions{Namespace: devenv.SystemNamespace, Name: "hyperfleet-ownership"})
		if err != nil {
			t.Fatal(err)
		}
		// The key ring internal/manager/manager.go derives from.
		tl.identities = &identity.Issuer{Keys: signer}
	}
	t.Cleanup(func() {
		if t.Failed() {
			_ = os.RemoveAll(opts.KeepGuestDisks)
			keepLogs(t, dir)
		}
		if err := w.Stop(); err != nil {
			t.Errorf("stop world: %v", err)
		}
	})
	if sc.prepare != nil {
		sc.prepare(t, w, func() { tl.sample(w) })
	}
	start := time.Now()
	w.GitHub.SetDefaultJobSteps(sc.steps...)
	if _, err := w.EnqueueJobs(sc.jobs, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	probes := &prober{probe: sc.probe, errs: map[string][]string{}, ok: map[string]bool{}}
	var last devenv.Snapshot
	deadline := time.Now().Add(25 * time.Minute)
	for {
		tl.sample(w)
		snap, err := w.Snapshot(context.Background())
		if sc.onClaim != nil && err == nil {
			for _, c := range snap.Claims {
				if err := sc.onClaim(c); err != nil {
					t.Fatalf("claim %s: %v", c.Name, err)
				}
			}
		}
		if sc.probe != nil && err == nil {
			probes.start(w, snap)
		}
		if err == nil && len(snap.Jobs) == sc.jobs && snap.Done(0) {
			last = snap
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not done within 25 minutes: jobs %+v, VMs %+v, claims %d, runners %d", snap.Jobs, snap.VMs, len(snap.Claims), len(snap.Runners))
		}
		time.Sleep(500 * time.Millisecond)
	}
	tl.sample(w)
	t.Logf("%d jobs done on real guests in %s", sc.jobs, time.Since(start).Round(time.Second))
	logTimeline(t, tl, start)
	writeTimings(t, tl, start, dir)

	// Every job ran once, to success, on a runner of its own VM.
	seen := map[string]bool{}
	for _, j := range last.Jobs {
		if j.Status != "completed" || j.Conclusion != "success" {
			t.Errorf("job %d: %s/%s, want completed/success; its steps printed:\n%s", j.ID, j.Status, j.Conclusion, j.Log)
		}
		if len(sc.steps) > 0 {
			t.Logf("job %d's steps printed:\n%s", j.ID, j.Log)
		}
		vm := vmOfRunner(j.RunnerName)
		if tl.vms[vm] == nil {
			t.Errorf("job %d ran on runner %q, whose VM the operator never created", j.ID, j.RunnerName)
		}
		if seen[vm] {
			t.Errorf("VM %s ran two jobs", vm)
		}
		seen[vm] = true
	}
	// Every VM that ran a job went through every milestone, in order, and
	// its guest agent reported its address on the guests' network.
	_, guestNet, _ := net.ParseCIDR(w.Proxmox.GuestHostAddress() + "/24")
	for vm := range seen {
		checkMilestones(t, tl, vm)
		inNet := false
		for _, a := range tl.addrs[vm] {
			ip, _, _ := strings.Cut(a, "/")
			inNet = inNet || guestNet.Contains(net.ParseIP(ip))
		}
		if !inNet {
			t.Errorf("VM %s: the claim's addresses %v are not on the guests' network %s", vm, tl.addrs[vm], guestNet)
		}
	}
	if sc.probe != nil {
		probes.check(t, seen)
	}
	if len(tl.leaks) > 0 {
		t.Errorf("the GitHub PAT appeared in: %v", tl.leaks)
	}
	if len(last.VMs) != 0 || len(last.ISOs) != 0 || len(last.Claims) != 0 || len(last.Runners) != 0 {
		t.Errorf("left behind: VMs %v, ISOs %v, claims %d, runners %d", last.VMs, last.ISOs, len(last.Claims), len(last.Runners))
	}
	// No guest disk, ISO or socket is left on the host. The simulator's
	// swtpm local CA (tpm-ca, made on first use: tpmCALocked in
	// internal/testworld/simulator/proxmox/realtpm.go) is the node's, not
	// a VM's: it stays, as /var/lib/swtpm-localca does on a Proxmox node.
	entries, _ := os.ReadDir(filepath.Join(dir, "guests"))
	var names []string
	for _, e := range entries {
		if e.Name() != "tpm-ca" {
			names = append(names, e.Name())
		}
	}
	if len(names) > 0 {
		t.Errorf("left in the guests' work dir: %v", names)
	}
	// The seed holds no secret in any mode: the runner credential (or
	// the join token) reaches the running VM through its guest agent.
	for vm, seeded := range tl.seeded {
		for _, what := range seeded {
			t.Errorf("VM %s: its seed holds a %s; a seed holds no secret, the VM receives it through its guest agent", vm, what)
		}
	}
	checkDisks(t, tl, seen, opts.KeepGuestDisks)
	return w, last, tl
}

// prober runs a scenario's probe on each running guest, in a goroutine
// of its own (a probe waits on the guest's agent for seconds, which the
// twice-a-second sampling must not), until it succeeds once or the VM
// stops.
type prober struct {
	probe func(context.Context, *devenv.World, int, hfv1.MachineClaim) error
	mu    sync.Mutex
	// errs are each VM's distinct failures, nil once it succeeded.
	errs map[string][]string
	ok   map[string]bool
	wg   sync.WaitGroup
}

// start probes the snapshot's running guests not probed yet.
func (p *prober) start(w *devenv.World, snap devenv.Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, vm := range snap.VMs {
		if _, seen := p.errs[vm.Name]; seen || vm.Status != "running" || !vm.AgentUp {
			continue
		}
		for _, c := range snap.Claims {
			if c.Name == vm.Name {
				p.errs[vm.Name] = []string{}
				p.wg.Add(1)
				go p.run(w, vm.VMID, c)
			}
		}
	}
}

func (p *prober) run(w *devenv.World, vmid int, claim hfv1.MachineClaim) {
	defer p.wg.Done()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		// The claim's latest status (its allocations, its conditions).
		_ = w.API.Client.Get(ctx, client.ObjectKeyFromObject(&claim), &claim)
		err := p.probe(ctx, w, vmid, claim)
		cancel()
		p.mu.Lock()
		if err == nil {
			p.ok[claim.Name] = true
		} else if msg := err.Error(); !slices.Contains(p.errs[claim.Name], msg) {
			p.errs[claim.Name] = append(p.errs[claim.Name], msg)
		}
		p.mu.Unlock()
		if err == nil || !running(w, vmid) {
			return
		}
		time.Sleep(2 * time.Second)
	}
}

// running: VM vmid still runs.
func running(w *devenv.World, vmid int) bool {
	for _, vm := range w.Proxmox.VMs() {
		if vm.VMID == vmid {
			return vm.Status == "running"
		}
	}
	return false
}

// check fails the test for every VM of vms the probe never succeeded on.
func (p *prober) check(t *testing.T, vms map[string]bool) {
	t.Helper()
	p.wg.Wait()
	for vm := range vms {
		if !p.ok[vm] {
			t.Errorf("VM %s: the guest's own view was never right: %v", vm, p.errs[vm])
		}
	}
}

// checkMilestones: vm went through every milestone, in order; a standby
// VM's own only if it is one (it was seen suspended).
func checkMilestones(t *testing.T, tl *timeline, vm string) {
	t.Helper()
	var prev time.Time
	_, standby := tl.vms[vm]["suspended"]
	for _, m := range milestones {
		at, ok := tl.vms[vm][m]
		switch {
		case ok:
		case !standby && slices.Contains(bench.StandbyMilestones, m):
			continue
		default:
			t.Errorf("VM %s: never saw %q", vm, m)
			continue
		}
		// Sampling is per second; job times are exact.
		if at.Before(prev.Add(-2 * time.Second)) {
			t.Errorf("VM %s: %q at %s, before the previous milestone (%s)", vm, m, at.Format(time.TimeOnly), prev.Format(time.TimeOnly))
		}
		prev = at
	}
}

// checkDisks scans the disk each VM that ran a job left when it was
// destroyed. The PAT must not be anywhere in what the guest wrote (it
// never reaches a VM); no file may hold the single-use credentials the
// VM received (in /run, a tmpfs, which the agent removes; blocks of
// deleted files may still hold spent ones: logged, not long-lived). The
// disks are removed afterwards.
func checkDisks(t *testing.T, tl *timeline, ran map[string]bool, kept string) {
	t.Helper()
	defer os.RemoveAll(kept)
	for vm := range ran {
		overlay := filepath.Join(kept, fmt.Sprintf("vm-%d.qcow2", tl.ids[vm]))
		if len(tl.secrets[vm]) == 0 {
			t.Errorf("VM %s: no credential seen placed in it or derived for it, nothing to look for", vm)
		}
		secrets := map[string]string{devenv.PAT: "the GitHub PAT"}
		maps.Copy(secrets, tl.secrets[vm])
		start := time.Now()
		res, err := scanDisk(overlay, t.TempDir(), secrets)
		if err != nil {
			t.Errorf("VM %s: %v", vm, err)
			continue
		}
		t.Logf("VM %s: disk scanned in %s; spent credentials in freed blocks: %v", vm, time.Since(start).Round(time.Second), res.inBlocks)
		if slices.Contains(res.inBlocks, "the GitHub PAT") {
			t.Errorf("VM %s: the GitHub PAT is on its disk", vm)
		}
		if len(res.inFiles) > 0 {
			t.Errorf("VM %s: credentials in files after power-off: %v", vm, res.inFiles)
		}
	}
}

// logTimeline writes each VM's milestones, as seconds since the jobs were
// queued.
func logTimeline(t *testing.T, tl *timeline, start time.Time) {
	names := make([]string, 0, len(tl.vms))
	for n := range tl.vms {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		var parts []string
		for _, m := range milestones {
			if at, ok := tl.vms[n][m]; ok {
				parts = append(parts, fmt.Sprintf("%s +%ds", m, int(at.Sub(start).Seconds())))
			}
		}
		t.Logf("VM %d %s: %s; addresses %v", tl.ids[n], n, strings.Join(parts, " -> "), tl.addrs[n])
	}
}

// testWriter sends the world's progress messages to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
