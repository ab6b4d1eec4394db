package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// GuestMilestones are the milestones of one real guest's life, in the
// order they must happen (test/guest records them; docs/testing.md,
// "Real-guest timings"). StandbyMilestones are a standby VM's alone.
var GuestMilestones = []string{"created", "booted", "cloud-init done", "suspended", "resume asked", "resumed", "credential placed",
	"runner online", "job started", "job completed", "powered off", "destroyed"}

// StandbyMilestones are the milestones of a VM of a pool's standby tier:
// suspended to disk before its job was queued (its earlier milestones
// read negative), the operator's resume request, its guest agent
// answering again, and the operator writing its secrets into it (a cold
// guest's agent answers, and gets them, before its boot has finished).
var StandbyMilestones = []string{"suspended", "resume asked", "resumed", "credential placed"}

// GuestTimings is the file a real-guest scenario writes: each VM's
// milestones, in seconds since the scenario's jobs were queued.
type GuestTimings struct {
	Test       string    `json:"test"`
	QueuedAt   time.Time `json:"queuedAt"`
	Milestones []string  `json:"milestones"`
	VMs        []GuestVM `json:"vms"`
}

// GuestVM is one VM's milestones.
type GuestVM struct {
	Name string `json:"name"`
	VMID int    `json:"vmid"`
	// At maps a milestone to its seconds since QueuedAt; a milestone
	// never seen is absent.
	At map[string]float64 `json:"at"`
}

// guestClockSkew is how far, in seconds, a milestone may read before the
// one it follows: the job's times are the GitHub simulator's own and the
// others come from the scenario's samples twice a second, so a VM seen
// powered off in one sample can read a little before its job's recorded
// end. A step between them is shown as no time at all.
const guestClockSkew = 1.0

// ReadGuestTimings reads every *.json timings file in dir, ordered by
// test name. A directory that does not exist holds none; a file that does
// not parse, or a VM whose milestones run backwards, is an error naming
// the file, so that a stale format cannot slip into the report.
func ReadGuestTimings(dir string) ([]GuestTimings, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, fmt.Errorf("guest timings: %w", err)
	}
	var out []GuestTimings
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("guest timings: %w", err)
		}
		var g GuestTimings
		if err := json.Unmarshal(b, &g); err != nil {
			return nil, fmt.Errorf("guest timings %s: %w", f, err)
		}
		if g.Test == "" || g.QueuedAt.IsZero() {
			return nil, fmt.Errorf("guest timings %s: test and queuedAt are required", f)
		}
		for _, vm := range g.VMs {
			// A standby VM's first milestones come before the queueing.
			last := math.Inf(-1)
			for _, m := range GuestMilestones {
				at, ok := vm.At[m]
				if !ok {
					continue
				}
				if at < last-guestClockSkew {
					return nil, fmt.Errorf("guest timings %s: VM %s reached %q at %.3f s, more than %.0f s before an earlier milestone (%.3f s)", f, vm.Name, m, at, guestClockSkew, last)
				}
				last = max(last, at)
			}
		}
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b GuestTimings) int { return strings.Compare(a.Test, b.Test) })
	return out, nil
}

// guestSteps are the report's columns: the step between two consecutive
// milestones, named by where it ends. A standby VM's registration counts
// from its resume (from the first of from's milestones that it reached).
var guestSteps = []struct {
	from []string
	to   string
	name string
}{
	{[]string{"created"}, "booted", "clone + start"},
	{[]string{"booted"}, "cloud-init done", "boot + cloud-init"},
	{[]string{"resumed", "cloud-init done"}, "runner online", "runner registration"},
	{[]string{"runner online"}, "job started", "job assigned"},
	{[]string{"job started"}, "job completed", "job"},
	{[]string{"job completed"}, "powered off", "power-off"},
	{[]string{"powered off"}, "destroyed", "destroyed"},
}

// writeGuestSection writes the real guests' steps as a table, after a row
// with the simulated cold start's (clone, boot, registration) for the same
// steps, so the two can be read side by side.
func writeGuestSection(b *strings.Builder, runs []GuestTimings, cold []ColdStart) {
	b.WriteString("\n## Real guests\n\n")
	if len(runs) == 0 {
		b.WriteString("No real-guest timings were given (HF_BENCH_GUEST_TIMINGS names the directory `make test-guest` writes them to; docs/testing.md, \"Real-guest timings\").\n")
		return
	}
	b.WriteString("The real-guest scenarios (`make test-guest`: Debian under QEMU TCG, real cloud-init, the real agent and runner script) record each VM's milestones; each column is the time between two of them, then job queued -> destroyed and queued -> runner online (the wait a job sees for its runner). The simulated row is this run's first cold start (the realistic preset's task latencies): its clone, configuration and start tasks, its boot and its registration are the Proxmox and GitHub simulators' own times. TCG emulates the CPU, so a real guest boots several times slower here than under KVM on a Proxmox node.\n\n")
	b.WriteString("A VM of the standby tier (marked *standby*) was cloned, booted and suspended to disk before its job was queued, and resumed for it: its clone and boot columns are the tier's, paid before the job; its registration counts from its resume. Its last column splits queued -> runner online into the work the standby path does: the resume (the operator's resume request to the guest agent answering), the credential's placement (to the operator writing the secrets into the guest) and the runner's registration, with the ratio of the whole wait to their sum (1.00 would be a pool that asks for the resume the moment the job is queued; the rest is the pool noticing the job and taking the VM).\n\n")
	b.WriteString("| run | VM |")
	for _, s := range guestSteps {
		b.WriteString(" " + s.name + " |")
	}
	b.WriteString(" queued -> destroyed | queued -> runner online | standby: resume + placement + registration (ratio) |\n|---|---|" + strings.Repeat("---|", len(guestSteps)+3) + "\n")
	if len(cold) > 0 {
		c := cold[0]
		fmt.Fprintf(b, "| simulated (this run) | first cold start | %s | %s | %s | - | - | - | - | - | - | - |\n", secs(c.Clone+c.Configure+c.Start), secs(c.Boot), secs(c.Registration))
	}
	for _, g := range runs {
		for _, vm := range g.VMs {
			kind := ""
			if _, ok := vm.At["suspended"]; ok {
				kind = ", *standby*"
			}
			fmt.Fprintf(b, "| %s (%s) | %s (%d%s) |", g.Test, g.QueuedAt.UTC().Format("2006-01-02 15:04 UTC"), vm.Name, vm.VMID, kind)
			for _, s := range guestSteps {
				b.WriteString(" " + guestStep(vm, s.from, s.to) + " |")
			}
			fmt.Fprintf(b, " %s | %s | %s |\n", guestStep(vm, nil, "destroyed"), guestStep(vm, nil, "runner online"), standbyWait(vm))
		}
	}
}

// guestStep is the time to milestone to from the first of from that vm
// reached (none: the jobs' queueing), or "-" when there is none.
func guestStep(vm GuestVM, from []string, to string) string {
	start, ok := 0.0, len(from) == 0
	for _, m := range from {
		if start, ok = vm.At[m]; ok {
			break
		}
	}
	end, ok2 := vm.At[to]
	if !ok || !ok2 {
		return "-"
	}
	return secs(time.Duration(max(0, end-start) * float64(time.Second)))
}

// standbyWait is a standby VM's queued -> runner online as its resume,
// its credential's placement and its registration, and the ratio of the
// whole wait to their sum; "-" for any other VM.
func standbyWait(vm GuestVM) string {
	at := func(m string) (time.Duration, bool) {
		s, ok := vm.At[m]
		return time.Duration(s * float64(time.Second)), ok
	}
	asked, ok1 := at("resume asked")
	resumed, ok2 := at("resumed")
	placed, ok3 := at("credential placed")
	online, ok4 := at("runner online")
	if !ok1 || !ok2 || !ok3 || !ok4 || online <= asked {
		return "-"
	}
	return fmt.Sprintf("%s + %s + %s = %s (%.2f)", secs(resumed-asked), secs(placed-resumed), secs(online-placed), secs(online-asked),
		online.Seconds()/(online-asked).Seconds())
}
