// Package fake is an in-memory provider.Provider for tests: a small
// simulated hypervisor cluster (nodes, storages, templates, VMs, worker
// tasks, a guest agent) and, on top of it, provider logic that keeps the
// contract of package provider.
//
// The two halves are kept apart on purpose. The provider logic sees the
// simulated cluster only through API-like calls (read a VM's config, start a
// clone, poll a task, ...) that answer the way Proxmox VE does, so the fake
// behaves like a real provider under restarts, lost tasks, concurrent
// callers and taken VM ids, and every call can be counted and made to fail.
//
// # Time
//
// Everything that takes time runs on the clock passed in provider.Deps
// (tests pass a k8s.io/utils/clock/testing FakeClock and Step it). Nothing
// runs in the background: the simulated cluster catches up with the clock
// whenever it is called, in due order, so a test that steps the clock by a
// task's duration sees the task finished on its next call.
//
// # Proxmox semantics the fake mirrors
//
//   - A clone copies the template's tags; the ownership marker goes into the
//     description passed with the clone call, the ownership tags are set by
//     the first configuration call right after it.
//   - While a clone runs the new VM id exists as a placeholder locked
//     "clone" with no description, so nobody can prove whose it is yet.
//   - ListVMs reads one batch listing whose membership, locks and tags are
//     live but whose power state, name and template flag come from a status
//     sample taken every Options.RefreshInterval: a VM the sample has not
//     seen yet, or one on an offline node, shows PowerUnknown.
//   - VM ids are allocated in-process under a lock from the configured
//     range, skipping ids the cluster lists and ids reserved by this
//     instance; a new instance (Restart) has no reservations and can hand
//     out an id an earlier instance reserved. Whoever clones first gets it;
//     the other finds a VM it does not own at its id and is placed again.
//   - A clone to a taken id fails with "config file already exists".
//   - Destroying a running VM fails; the provider stops it first.
package fake

import (
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/internal/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Method names a provider.Provider method, for FailNext and Calls.
type Method string

// The Provider methods.
const (
	MethodProbe            Method = "Probe"
	MethodValidateTemplate Method = "ValidateTemplate"
	MethodEnsureVM         Method = "EnsureVM"
	MethodDeleteVM         Method = "DeleteVM"
	MethodListVMs          Method = "ListVMs"
	MethodGetVM            Method = "GetVM"
	MethodSetPower         Method = "SetPower"
	MethodRemoveCloudInit  Method = "RemoveCloudInitMedia"
)

// Op names one API-like call of the simulated cluster, for FailNextOp and
// OpCalls. Each mirrors one Proxmox VE endpoint.
type Op string

// The API-like calls.
const (
	OpVersion        Op = "version"         // GET /version
	OpNodes          Op = "nodes"           // GET /nodes
	OpResources      Op = "resources"       // GET /cluster/resources?type=vm
	OpPools          Op = "pools"           // GET /pools
	OpConfig         Op = "config"          // GET /nodes/{node}/qemu/{vmid}/config
	OpStatus         Op = "status"          // GET /nodes/{node}/qemu/{vmid}/status/current
	OpClone          Op = "clone"           // POST /nodes/{node}/qemu/{vmid}/clone
	OpUpdateConfig   Op = "update-config"   // POST (async) or PUT (sync) /nodes/{node}/qemu/{vmid}/config
	OpResize         Op = "resize"          // PUT /nodes/{node}/qemu/{vmid}/resize
	OpStart          Op = "start"           // POST /nodes/{node}/qemu/{vmid}/status/start
	OpStop           Op = "stop"            // POST /nodes/{node}/qemu/{vmid}/status/stop
	OpShutdown       Op = "shutdown"        // POST /nodes/{node}/qemu/{vmid}/status/shutdown
	OpDestroy        Op = "destroy"         // DELETE /nodes/{node}/qemu/{vmid}
	OpTaskStatus     Op = "task-status"     // GET /nodes/{node}/tasks/{upid}/status
	OpAgent          Op = "agent"           // GET /nodes/{node}/qemu/{vmid}/agent/network-get-interfaces
	OpStorageStatus  Op = "storage-status"  // GET /nodes/{node}/storage/{storage}/status
	OpStorageContent Op = "storage-content" // GET /nodes/{node}/storage/{storage}/content
	OpUpload         Op = "upload"          // POST /nodes/{node}/storage/{storage}/upload
	OpDeleteVolume   Op = "delete-volume"   // DELETE /nodes/{node}/storage/{storage}/content/{volume}
)

// endpoints gives each Op the HTTP method and path template reported to
// provider.Observer.APICall.
var endpoints = map[Op][2]string{
	OpVersion:        {"GET", "/version"},
	OpNodes:          {"GET", "/nodes"},
	OpResources:      {"GET", "/cluster/resources"},
	OpPools:          {"GET", "/pools"},
	OpConfig:         {"GET", "/nodes/{node}/qemu/{vmid}/config"},
	OpStatus:         {"GET", "/nodes/{node}/qemu/{vmid}/status/current"},
	OpClone:          {"POST", "/nodes/{node}/qemu/{vmid}/clone"},
	OpUpdateConfig:   {"POST", "/nodes/{node}/qemu/{vmid}/config"},
	OpResize:         {"PUT", "/nodes/{node}/qemu/{vmid}/resize"},
	OpStart:          {"POST", "/nodes/{node}/qemu/{vmid}/status/start"},
	OpStop:           {"POST", "/nodes/{node}/qemu/{vmid}/status/stop"},
	OpShutdown:       {"POST", "/nodes/{node}/qemu/{vmid}/status/shutdown"},
	OpDestroy:        {"DELETE", "/nodes/{node}/qemu/{vmid}"},
	OpTaskStatus:     {"GET", "/nodes/{node}/tasks/{upid}/status"},
	OpAgent:          {"GET", "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces"},
	OpStorageStatus:  {"GET", "/nodes/{node}/storage/{storage}/status"},
	OpStorageContent: {"GET", "/nodes/{node}/storage/{storage}/content"},
	OpUpload:         {"POST", "/nodes/{node}/storage/{storage}/upload"},
	OpDeleteVolume:   {"DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"},
}

// Node is one simulated hypervisor node.
type Node struct {
	Name string
	CPUs int64
	// MemoryBytes is the node's memory; BaseMemoryUsedBytes is what the
	// host uses without any VM running.
	MemoryBytes         int64
	BaseMemoryUsedBytes int64
	Offline             bool
}

// Storage is one simulated storage.
type Storage struct {
	ID string
	// Type is a Proxmox storage type: dir, nfs, cifs, cephfs, btrfs,
	// glusterfs (file-based), lvmthin, zfspool, rbd, lvm. Every type but lvm
	// supports linked clones.
	Type string
	// Content lists what the storage holds: images, iso, ...
	Content []string
	// Shared storages are reachable from every node with one set of
	// volumes; others exist separately on each node.
	Shared bool
	// Nodes restricts the storage to these nodes; empty means all.
	Nodes         []string
	CapacityBytes int64
}

// Template is one simulated VM template.
type Template struct {
	VMID        int
	Node        string
	Name        string
	Storage     string
	DiskBytes   int64
	Cores       int
	MemoryBytes int64
	// NoAgent leaves the guest agent unconfigured: clones boot but never
	// report addresses.
	NoAgent     bool
	Tags        []string
	Description string
	// NetModel and Bridge describe net0; defaults virtio and vmbr0.
	NetModel string
	Bridge   string
}

// Durations are how long the simulated cluster's tasks take.
type Durations struct {
	// Clone is a linked clone, and the base of a full clone, which takes
	// FullClonePerGiB more for every GiB of disk.
	Clone           time.Duration
	FullClonePerGiB time.Duration
	Configure       time.Duration
	Resize          time.Duration
	Upload          time.Duration
	Start           time.Duration
	// Boot is the time from a finished start task until the guest agent
	// answers.
	Boot         time.Duration
	Stop         time.Duration
	Shutdown     time.Duration
	Destroy      time.Duration
	DeleteVolume time.Duration
}

// Options shape the simulated cluster. Start from DefaultOptions: New uses
// the values as given, zero durations included.
type Options struct {
	Version   string
	Nodes     []Node
	Storages  []Storage
	Templates []Template
	Pools     []string
	Durations Durations
	// RefreshInterval is how often the status sample behind ListVMs is
	// taken; zero or negative samples on every listing.
	RefreshInterval time.Duration
	// PollInterval is the RetryAfter the provider asks for while it waits
	// for a task, a clone slot or the guest.
	PollInterval time.Duration
	// RetryBackoff is the RetryAfter after a task failed in a way a retry
	// can fix (a lock, a timeout).
	RetryBackoff time.Duration
	// ReservationTTL drops an in-process placement nobody called EnsureVM
	// or DeleteVM for in that long.
	ReservationTTL time.Duration
}

// DefaultOptions mirror the Proxmox simulator's default cluster: node pve1
// (16 CPUs, 64 GiB), storages local (dir, iso) and local-lvm (lvmthin),
// template 9000 debian-12-ci (32 GiB, 2 cores, 2 GiB, guest agent) and its
// task latencies.
func DefaultOptions() Options {
	return Options{
		Version: "9.0.11",
		Nodes:   []Node{{Name: "pve1", CPUs: 16, MemoryBytes: 64 << 30, BaseMemoryUsedBytes: 2 << 30}},
		Storages: []Storage{
			{ID: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "snippets", "import"}, CapacityBytes: 100 << 30},
			{ID: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, CapacityBytes: 500 << 30},
		},
		Templates: []Template{{
			VMID: 9000, Node: "pve1", Name: "debian-12-ci", Storage: "local-lvm", DiskBytes: 32 << 30,
			Cores: 2, MemoryBytes: 2 << 30, Tags: []string{"template"},
		}},
		Durations: Durations{
			Clone: 5 * time.Second, FullClonePerGiB: time.Second, Configure: 200 * time.Millisecond,
			Resize: time.Second, Upload: 200 * time.Millisecond, Start: time.Second, Boot: 20 * time.Second,
			Stop: 500 * time.Millisecond, Shutdown: 5 * time.Second, Destroy: time.Second,
			DeleteVolume: 100 * time.Millisecond,
		},
		RefreshInterval: 10 * time.Second,
		PollInterval:    time.Second,
		RetryBackoff:    5 * time.Second,
		ReservationTTL:  30 * time.Minute,
	}
}

// Provider is the fake provider. Besides the provider.Provider methods it
// has test controls (GuestPowerOff, AddForeignVM, FailNext, ...) that act on
// the simulated cluster it shares with every instance made by Restart or
// Connect.
type Provider struct {
	hv     *hypervisor
	cfg    provider.ClusterConfig
	signer *ownership.Signer
	obs    provider.Observer
	clock  clock.PassiveClock
	log    logr.Logger
	user   string

	// mu guards the in-process state below, which a restart loses. It is
	// taken before the cluster's lock, never after.
	mu sync.Mutex
	// reservations are placements by owner UID: a VM id and the memory
	// promised on a node for VMs not yet running.
	reservations map[string]*reservation
	// queued are owners waiting for a clone slot.
	queued map[string]bool
	// cloning maps VM ids this instance cloned to the clone's target
	// storage, for the per-storage clone limit.
	cloning map[int]string
}

type reservation struct {
	vmid   int
	node   string
	memory int64
	at     time.Time
}

var _ provider.Provider = (*Provider)(nil)

// New returns a Provider on a new simulated cluster built from opts.
// deps.Signer is required; a nil deps.Clock means the real clock.
func New(cfg provider.ClusterConfig, deps provider.Deps, opts Options) (*Provider, error) {
	c := deps.Clock
	if c == nil {
		c = clock.RealClock{}
	}
	hv, err := newHypervisor(c, opts)
	if err != nil {
		return nil, err
	}
	return connect(hv, cfg, deps)
}

// Connect returns another Provider on the same simulated cluster with its
// own configuration and in-process state, like a second operator install
// or a replica. deps.Clock is ignored: the cluster keeps the clock it was
// built with.
func (p *Provider) Connect(cfg provider.ClusterConfig, deps provider.Deps) (*Provider, error) {
	return connect(p.hv, cfg, deps)
}

// Restart returns a new Provider with p's configuration on the same
// simulated cluster and nothing of p's in-process state, as after an
// operator restart.
func (p *Provider) Restart() *Provider {
	np, err := connect(p.hv, p.cfg, provider.Deps{Signer: p.signer, Observer: p.obs, Log: p.log})
	if err != nil {
		// p was built from the same values, so this cannot happen.
		panic(err)
	}
	return np
}

func connect(hv *hypervisor, cfg provider.ClusterConfig, deps provider.Deps) (*Provider, error) {
	if deps.Signer == nil {
		return nil, fmt.Errorf("fake provider %q: deps.Signer is required", cfg.Name)
	}
	if cfg.VMIDStart < minVMID || cfg.VMIDEnd > maxVMID || cfg.VMIDEnd < cfg.VMIDStart {
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidVMIDRange",
			"fake provider %q: VM id range %d-%d must lie within %d-%d with start <= end", cfg.Name, cfg.VMIDStart, cfg.VMIDEnd, minVMID, maxVMID)
	}
	obs := deps.Observer
	if obs == nil {
		obs = provider.NopObserver{}
	}
	user := "root@pam"
	switch {
	case cfg.TokenID != "":
		user = cfg.TokenID
	case cfg.Username != "":
		user = cfg.Username
	}
	cfg.Nodes = append([]string(nil), cfg.Nodes...)
	cfg.Tags = append([]string(nil), cfg.Tags...)
	return &Provider{
		hv: hv, cfg: cfg, signer: deps.Signer.ForCluster(ownership.ClusterIdentity{Name: cfg.Name}), obs: obs, clock: hv.clock, log: deps.Log, user: user,
		reservations: map[string]*reservation{}, queued: map[string]bool{}, cloning: map[int]string{},
	}, nil
}

// session starts serving one Provider method: the API-like calls it makes
// are counted for m.
func (p *Provider) session(m Method) *session {
	return &session{hv: p.hv, obs: p.obs, method: m, user: p.user}
}
