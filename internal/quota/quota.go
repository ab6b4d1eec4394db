// Package quota is the namespace quotas of a HypervisorCluster
// (spec.tenancy[].limits; docs/operations.md "Quotas per namespace"): what
// a VM uses (Use), what a namespace uses on a cluster, and the Ledger that
// decides, under one lock, whether a claim may be placed without taking
// its namespace over a limit.
package quota

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Resource names one limited amount, as spec.tenancy[].limits spells it
// and as the metrics label it.
type Resource string

// The limited resources, in the order they are checked and reported.
const (
	Machines Resource = "machines"
	CPU      Resource = "cpu"
	Memory   Resource = "memory"
	Disk     Resource = "disk"
	Devices  Resource = "devices"
)

// Resources are every limited resource, in check order.
var Resources = []Resource{Machines, CPU, Memory, Disk, Devices}

// Use is what one VM, or a namespace's VMs together, take of each
// resource: memory and disk in bytes, the rest in units.
type Use map[Resource]int64

// Of is what a VM built from spec uses: one machine, its cores, memory
// and root disk as placed (zero when the template keeps its own), its
// extra disks and its devices.
func Of(spec *provider.VMSpec) Use {
	u := Use{Machines: 1, CPU: int64(spec.CPUCores), Memory: spec.MemoryBytes, Disk: max(spec.DiskBytes, 0)}
	if hw := spec.Hardware; hw != nil {
		u[Disk] += hw.ExtraDiskBytes()
		u[Devices] = int64(len(hw.Devices))
	}
	return u
}

// add adds o to u.
func (u Use) add(o Use) {
	for r, n := range o {
		u[r] += n
	}
}

// Rule is the limits of one tenancy rule and where they are set
// (spec.tenancy[i].limits), for messages.
type Rule struct {
	Field  string
	Limits *hfv1.TenantLimits
}

// limit returns the rule's limit on r, and whether it sets one.
func (r Rule) limit(res Resource) (int64, bool) {
	l := r.Limits
	if l == nil {
		return 0, false
	}
	i32 := func(p *int32) (int64, bool) {
		if p == nil {
			return 0, false
		}
		return int64(*p), true
	}
	q := func(p *resource.Quantity) (int64, bool) {
		if p == nil {
			return 0, false
		}
		return p.Value(), true
	}
	switch res {
	case Machines:
		return i32(l.Machines)
	case CPU:
		return i32(l.CPU)
	case Memory:
		return q(l.Memory)
	case Disk:
		return q(l.Disk)
	case Devices:
		return i32(l.Devices)
	}
	return 0, false
}

// Limited reports whether any of rules sets a limit.
func Limited(rules []Rule) bool {
	for _, r := range rules {
		for _, res := range Resources {
			if _, ok := r.limit(res); ok {
				return true
			}
		}
	}
	return false
}

// Exceeded is a refused placement: the first limit the claim's need would
// take its namespace's usage over.
type Exceeded struct {
	// Field is the limit's place in the cluster's spec, such as
	// spec.tenancy[1].limits.memory.
	Field     string
	Resource  Resource
	Cluster   string
	Namespace string
	Limit     int64
	Usage     int64
	Need      int64
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("placing the VM would take namespace %s over %s of HypervisorCluster %s: limit %s, in use %s, this VM needs %s; it is placed once a VM of the namespace on the cluster is destroyed",
		e.Namespace, e.Field, e.Cluster, Format(e.Resource, e.Limit), Format(e.Resource, e.Usage), Format(e.Resource, e.Need))
}

// Format writes n of res as spec.tenancy[].limits does: bytes as a binary
// quantity (256Gi), the rest as numbers.
func Format(res Resource, n int64) string {
	if res == Memory || res == Disk {
		return resource.NewQuantity(n, resource.BinarySI).String()
	}
	return fmt.Sprint(n)
}

// exceeded returns the first limit of rules that usage plus need goes
// over (every rule applies: the strictest wins), nil when none. A resource
// the claim does not need never refuses it, even when a lowered limit
// leaves the namespace over it: the VM takes the namespace no further.
func exceeded(rules []Rule, usage, need Use) *Exceeded {
	for _, res := range Resources {
		for _, r := range rules {
			limit, ok := r.limit(res)
			if ok && need[res] > 0 && usage[res]+need[res] > limit {
				return &Exceeded{Field: r.Field + "." + string(res), Resource: res, Limit: limit, Usage: usage[res], Need: need[res]}
			}
		}
	}
	return nil
}
