package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Results is everything one benchmark run measured; the report is drawn
// from it alone (WriteReport), and test/bench writes it as results.json
// beside the report for whoever wants the raw numbers.
type Results struct {
	Date     time.Time     `json:"date"`
	Small    bool          `json:"small"`
	Machine  Machine       `json:"machine"`
	Duration time.Duration `json:"duration"`

	Overhead Overhead    `json:"overhead"`
	Cold     []ColdStart `json:"cold"`
	Warm     Summary     `json:"warm"`
	Standby  Standby     `json:"standby"`
	Process  Process     `json:"process"`
	Churn    Churn       `json:"churn"`
	Calls    []Calls     `json:"calls"`
	PowerOff PowerOff    `json:"powerOff"`
	// Timeline is one job's life, from the cold-start runs.
	Timeline Trace `json:"timeline"`
	// Guests are the real-guest scenarios' timings (make test-guest),
	// reported next to the simulated cold start.
	Guests []GuestTimings `json:"guests,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	NProc    int    `json:"nproc"`
	Model    string `json:"model"`
	MemTotal int64  `json:"memTotal"`
	// Load1 is the 1-minute load average when the run ended: other work
	// on a shared machine shows here.
	Load1 float64 `json:"load1"`
}

// ReadMachine describes this machine from /proc.
func ReadMachine() Machine {
	m := Machine{NProc: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		m.Model = ParseCPUModel(b)
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				m.MemTotal = n << 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			m.Load1, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	return m
}

// ParseCPUModel returns the first "model name" of /proc/cpuinfo.
func ParseCPUModel(cpuinfo []byte) string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// Overhead is claim created -> clone request sent, for the operator and
// for the bare minimum: a plain client that sees the same claim through
// a watch, makes one write to it and sends the same clone request.
type Overhead struct {
	Claims   int     `json:"claims"`
	Clusters int     `json:"clusters"`
	Operator Summary `json:"operator"`
	Bare     Summary `json:"bare"`
}

// ColdStart is one job served by a fresh VM: job queued -> runner online,
// and what the simulators took for the same VM.
type ColdStart struct {
	Total time.Duration `json:"total"`
	// Clone, Configure and Start are the Proxmox simulator's task
	// latencies for the VM's clone, its configuration tasks (config
	// write, ISO upload, disk resize: those the operator issued) and its
	// start; Boot is the guest's boot until it runs cloud-init and the
	// agent (the simulator's guestStart); Registration is that moment, or
	// the operator's write of the runner credential into the running VM
	// when that came later, -> runner online on the GitHub simulator.
	Clone        time.Duration `json:"clone"`
	Configure    time.Duration `json:"configure"`
	Start        time.Duration `json:"start"`
	Boot         time.Duration `json:"boot"`
	Registration time.Duration `json:"registration"`
}

// Physical is the least a cold start can take: every hypervisor task on
// the VM's path, its boot and its registration, one after the other.
func (c ColdStart) Physical() time.Duration {
	return c.Clone + c.Configure + c.Start + c.Boot + c.Registration
}

// StandbyStart is one job served by a VM of the standby tier: job queued
// -> runner online, and what the simulators took for the same VM.
type StandbyStart struct {
	Total time.Duration `json:"total"`
	// Resume is the Proxmox simulator's resume task for the VM (its fixed
	// part plus its part per GiB of the VM's memory read back); Placement
	// is what the hypervisor takes to write the runner credential through
	// the guest agent (zero where the simulator models no time for it);
	// Registration is the resume's end, or the operator's write of the
	// credential when that came later, -> runner online on the GitHub
	// simulator: the guest's own time.
	Resume       time.Duration `json:"resume"`
	Placement    time.Duration `json:"placement"`
	Registration time.Duration `json:"registration"`
	// ToResume (job queued -> resume request) and ToCredential (the
	// resume's end -> credential written) are the operator's waits on
	// the job's path, which a miss is read from.
	ToResume     time.Duration `json:"toResume"`
	ToCredential time.Duration `json:"toCredential"`
}

// Physical is the least a standby start can take: the resume, the
// credential's placement and the registration, one after the other.
func (s StandbyStart) Physical() time.Duration {
	return s.Resume + s.Placement + s.Registration
}

// IdleCost is what one VM waiting for a job holds on its hypervisor,
// read from the hypervisor's state: host memory, its disks and the
// volume of its saved memory (a VM suspended to disk).
type IdleCost struct {
	Memory int64 `json:"memory"`
	Disk   int64 `json:"disk"`
	State  int64 `json:"state"`
}

// Standby is the standby tier's figures: jobs served one at a time, each
// by a VM of a full tier of Size, and the idle cost of one of its VMs
// next to a warm VM's.
type Standby struct {
	Size   int            `json:"size"`
	Starts []StandbyStart `json:"starts"`
	Idle   IdleCost       `json:"idle"`
	Warm   IdleCost       `json:"warm"`
}

// Totals are the starts' queued -> runner online times.
func (s Standby) Totals() Summary {
	ds := make([]time.Duration, len(s.Starts))
	for i, st := range s.Starts {
		ds[i] = st.Total
	}
	return Summarize(ds)
}

// OperatorWaits are the medians of the starts' ToResume and ToCredential.
func (s Standby) OperatorWaits() (toResume, toCredential time.Duration) {
	a, b := make([]time.Duration, len(s.Starts)), make([]time.Duration, len(s.Starts))
	for i, st := range s.Starts {
		a[i], b[i] = st.ToResume, st.ToCredential
	}
	return Percentile(a, 50), Percentile(b, 50)
}

// Ratios are the median and the worst of the starts' ratios to their
// physical minimum.
func (s Standby) Ratios() (median, worst float64) {
	rs := make([]float64, len(s.Starts))
	for i, st := range s.Starts {
		rs[i] = Ratio(st.Total, st.Physical())
	}
	return MedianWorst(rs)
}

// Process is the operator process's resources.
type Process struct {
	// Idle is measured with the load claims running and nothing changing.
	Idle Sample `json:"idle"`
	// Churn is measured during the churn run, with the load claims still
	// there.
	Churn  Sample        `json:"churn"`
	Growth []GrowthPoint `json:"growth"`
}

// Sample is the process's RSS at the end of a window and its CPU share
// over it.
type Sample struct {
	Claims   int           `json:"claims"`
	Window   time.Duration `json:"window"`
	RSS      int64         `json:"rss"`
	HWM      int64         `json:"hwm"`
	CPUShare float64       `json:"cpuShare"`
}

// GrowthPoint is the idle operator at one size.
type GrowthPoint struct {
	Sample
	Clusters int `json:"clusters"`
	// Polls is how many cluster polls the window holds (clusters ×
	// window / poll interval); CPUPerPoll the CPU time over them.
	Polls      int           `json:"polls"`
	CPUPerPoll time.Duration `json:"cpuPerPoll"`
	// KubeCallsPerMin and ProxmoxCallsPerMin are the operator's requests over the
	// window, per minute.
	KubeCallsPerMin    float64 `json:"kubeCallsPerMin"`
	ProxmoxCallsPerMin float64 `json:"proxmoxCallsPerMin"`
}

// Churn is the end-to-end throughput with zero simulated latency.
type Churn struct {
	Jobs     int           `json:"jobs"`
	Duration time.Duration `json:"duration"`
	// MaxReplicas is the pool's ceiling during the run; InFlight is how
	// many of its VMs were in flight on average.
	MaxReplicas int     `json:"maxReplicas"`
	InFlight    float64 `json:"inFlight"`
	// Bottleneck names what limited the run, with its evidence.
	Bottleneck string `json:"bottleneck"`
}

// PerMinute is the churn's claims per minute.
func (c Churn) PerMinute() float64 { return PerMinute(c.Jobs, c.Duration) }

// Calls is one kind of API call, per job lifecycle.
type Calls struct {
	API    string  `json:"api"`  // Proxmox, GitHub or Kubernetes
	Call   string  `json:"call"` // method and path pattern (or verb)
	PerJob float64 `json:"perJob"`
	Target float64 `json:"target"`
	Reason string  `json:"reason"`
}

// PowerOff is power-off -> destroyed from the controller package's
// BenchmarkOperator1000Claims (Proxmox's 10 s status refresh).
type PowerOff struct {
	HintedP99  time.Duration `json:"hintedP99"`
	ListingP99 time.Duration `json:"listingP99"`
	AllP99     time.Duration `json:"allP99"`
	// Line is the benchmark's output line.
	Line string `json:"line"`
}

// ParsePowerOff reads the power-off figures from a go test -bench output.
func ParsePowerOff(out []byte) (PowerOff, error) {
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "BenchmarkOperator1000Claims") {
			continue
		}
		f := strings.Fields(line)
		p := PowerOff{Line: strings.TrimSpace(line)}
		for i := 1; i+1 < len(f); i++ {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			d := time.Duration(v * float64(time.Second))
			switch f[i+1] {
			case "poweroff-hinted-p99-s":
				p.HintedP99 = d
			case "poweroff-listing-p99-s":
				p.ListingP99 = d
			case "poweroff-p99-s":
				p.AllP99 = d
			}
		}
		if p.HintedP99 == 0 || p.AllP99 == 0 {
			return PowerOff{}, fmt.Errorf("benchmark line %q has no poweroff-hinted-p99-s or poweroff-p99-s", line)
		}
		return p, nil
	}
	return PowerOff{}, fmt.Errorf("no BenchmarkOperator1000Claims line in the output")
}
