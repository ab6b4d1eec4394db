// Package fake is a small, hypervisor-neutral, in-memory provider.Provider
// for fast tests of the code that uses providers (controllers, the
// sweeper, the manager). Its behaviour is the contract of package provider
// and nothing more: it runs the contract suite (pkg/provider/providertest)
// like every real provider, so a test that passes on it relies on nothing
// a real provider does not promise. Hypervisor-specific behaviour (task
// ids, locks, storages, ISO files) is tested against the real provider on
// its simulator instead.
//
// A Cluster is the hypervisor: a map of VMs and of cloud-init media under
// one mutex, with test controls. Providers made by Cluster.NewProvider
// share it and keep only their placements in-process, so a new Provider on
// the same Cluster is an operator after a restart.
//
// Every operation (clone, writing cloud-init media, configuring, starting,
// stopping, destroying) takes Options.OperationTime on the cluster's clock
// and a started guest reports its address after Options.BootTime. Nothing
// runs in the background: a call first finishes whatever fell due, so a
// test that steps a fake clock sees the effect on its next call.
package fake

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// Options shape a Cluster.
type Options struct {
	// Nodes are the cluster's nodes. MemoryUsedBytes is what a node uses
	// with no VM running; Allowed and ReservedMemoryBytes are ignored (each
	// Provider reports its own).
	Nodes []provider.NodeInfo
	// Templates are what VMs are cloned from; the storages they name are
	// the cluster's storages, the possible full-clone targets.
	Templates []provider.TemplateInfo
	// OperationTime is how long every operation takes; BootTime is how long
	// a started guest takes to report its address, ResumeTime how long a
	// resumed one takes (its guest agent answers again; zero: at once).
	OperationTime, BootTime, ResumeTime time.Duration
}

// DefaultOptions are one node and one template, id 9000, that allows
// linked clones.
func DefaultOptions() Options {
	return Options{
		Nodes: []provider.NodeInfo{{Name: "node-1", Online: true, CPUs: 16, MemoryBytes: 64 << 30, MemoryUsedBytes: 2 << 30, StorageBytes: 1 << 40}},
		Templates: []provider.TemplateInfo{{ID: 9000, Name: "ci-template", Node: "node-1", Storages: []string{"disks"}, DiskBytes: 16 << 30,
			Cores: 2, MemoryBytes: 2 << 30, LinkedCloneSupported: true, GuestFiles: true}},
		OperationTime: time.Second, BootTime: 10 * time.Second,
	}
}

// Cluster is the in-memory hypervisor that Providers share.
type Cluster struct {
	clock clock.PassiveClock
	opts  Options

	// mu guards everything below and every Provider's reservations.
	mu    sync.Mutex
	vms   map[int]*vm
	media map[string]*medium
	// delivered is the cloud-init each guest read at its last start.
	delivered map[int]provider.CloudInit
	// tasks numbers operations, for unique task ids.
	tasks int
	// destroyErr, when set, fails every destroy (FailDestroys).
	destroyErr error
}

// vm is one VM or template.
type vm struct {
	id                      int
	node, name, description string
	tags                    []string
	template                *provider.TemplateInfo // nil for a VM
	storage                 string                 // its disk's, for clone slots
	memory                  int64
	mac                     string
	op                      *operation // in flight, nil when none
	// started says it has been started at least once.
	configured, started, running bool
	// since is when it last started running, guestUpAt when its guest
	// reports an address from then on.
	since, guestUpAt time.Time
	attached         string // the medium attached to it
	// native is the hypervisor's own cloud-init of a VM configured from
	// a spec with Native, nil otherwise.
	native *provider.NativeCloudInit
	// guestAgent says its guest has a guest channel (its template's
	// GuestFiles); guestFiles are the files written into the running
	// guest, gone when it stops (they stand for files in a tmpfs).
	guestAgent bool
	guestFiles map[string][]byte
	// suspended says it is suspended to disk; saved is its guest's
	// memory at rest meanwhile (the files of its tmpfs), given back to
	// the guest by the resume.
	suspended bool
	saved     map[string][]byte
	// tpm says it has a TPM 2.0: its template's, or one its
	// configuration added (VMSpec.TPM).
	tpm bool
	// address is what its guest reports once up: empty for the address
	// its id gives (addressOf), else what SetGuestAddress set.
	address string
}

// operation is one operation in flight on a VM; finish applies its effect
// once it is due.
type operation struct {
	task   provider.Task
	until  time.Time
	finish func(at time.Time)
}

// medium is one cloud-init medium at rest.
type medium struct {
	id, node, digest string
	vmid             int
	data             provider.CloudInit
}

// NewCluster returns a cluster built from opts on clk (nil means the real
// clock).
func NewCluster(clk clock.PassiveClock, opts Options) (*Cluster, error) {
	if clk == nil {
		clk = clock.RealClock{}
	}
	if len(opts.Nodes) == 0 {
		return nil, errors.New("fake cluster: no nodes")
	}
	c := &Cluster{clock: clk, opts: opts, vms: map[int]*vm{}, media: map[string]*medium{}, delivered: map[int]provider.CloudInit{}}
	for _, t := range opts.Templates {
		if t.ID <= 0 || c.vms[t.ID] != nil || !c.hasNode(t.Node) || len(t.Storages) == 0 {
			return nil, fmt.Errorf("fake cluster: template %d: needs a unique id, a known node and a storage", t.ID)
		}
		c.vms[t.ID] = &vm{id: t.ID, node: t.Node, name: t.Name, template: &t, storage: t.Storages[0], memory: t.MemoryBytes}
	}
	return c, nil
}

func (c *Cluster) hasNode(name string) bool {
	return slices.ContainsFunc(c.opts.Nodes, func(n provider.NodeInfo) bool { return n.Name == name })
}

// lock takes the cluster's lock and finishes every operation that is due
// (no operation's effect depends on another's); the caller defers the
// returned unlock.
func (c *Cluster) lock() func() {
	c.mu.Lock()
	now := c.clock.Now()
	for _, v := range c.vms {
		if op := v.op; op != nil && !op.until.After(now) {
			v.op = nil
			op.finish(op.until)
		}
	}
	return c.mu.Unlock
}

// startLocked starts an operation on v and returns its task.
func (c *Cluster) startLocked(v *vm, name string, finish func(at time.Time)) *provider.Task {
	c.tasks++
	now := c.clock.Now()
	v.op = &operation{task: provider.Task{ID: fmt.Sprintf("fake-%d-%s-%d", v.id, name, c.tasks), Operation: name, StartTime: now},
		until: now.Add(c.opts.OperationTime), finish: finish}
	task := v.op.task
	return &task
}

// powerOnLocked starts v; once running, its guest reads the cloud-init of
// the medium attached to it.
func (c *Cluster) powerOnLocked(v *vm) *provider.Task {
	return c.startLocked(v, "start", func(at time.Time) {
		v.started, v.running, v.since, v.guestUpAt = true, true, at, at.Add(c.opts.BootTime)
		if m := c.media[v.attached]; m != nil {
			c.delivered[v.id] = m.data
		}
	})
}

func (c *Cluster) powerOffLocked(v *vm, name string) *provider.Task {
	return c.startLocked(v, name, func(time.Time) { v.running, v.guestFiles = false, nil })
}

// suspendLocked saves v's running guest to disk and stops it.
func (c *Cluster) suspendLocked(v *vm) *provider.Task {
	return c.startLocked(v, "suspend", func(time.Time) {
		v.running, v.suspended, v.saved, v.guestFiles = false, true, v.guestFiles, nil
	})
}

// resumeLocked starts suspended v from its saved guest, whose agent
// answers after Options.ResumeTime; the saved state is gone then.
func (c *Cluster) resumeLocked(v *vm) *provider.Task {
	return c.startLocked(v, "resume", func(at time.Time) {
		v.running, v.since, v.guestUpAt = true, at, at.Add(c.opts.ResumeTime)
		v.suspended, v.guestFiles, v.saved = false, v.saved, nil
	})
}

// inFlightLocked returns the task in flight on v and how long it still
// takes.
func (c *Cluster) inFlightLocked(v *vm) (*provider.Task, time.Duration) {
	task := v.op.task
	return &task, v.op.until.Sub(c.clock.Now())
}

// sortedIDsLocked returns the ids of every VM and template, ascending.
func (c *Cluster) sortedIDsLocked() []int {
	return slices.Sorted(maps.Keys(c.vms))
}

// Provider is one operator's connection to a Cluster. Deps.Clock,
// Observer, Log and Wake are not used: time is the cluster's.
type Provider struct {
	c      *Cluster
	cfg    provider.ClusterConfig
	signer *ownership.Signer
	// reservations are the placements of VMs this instance is creating,
	// by owner UID (guarded by c.mu). A restart loses them.
	reservations map[string]reservation
}

type reservation struct {
	vmid   int
	node   string
	memory int64
}

var _ provider.Provider = (*Provider)(nil)

// NewProvider connects a new Provider, with none of any other's
// in-process state, to c. It binds deps.Signer to the cluster cfg.Name.
func (c *Cluster) NewProvider(cfg provider.ClusterConfig, deps provider.Deps) (*Provider, error) {
	if deps.Signer == nil {
		return nil, fmt.Errorf("fake provider %q: deps.Signer is required", cfg.Name)
	}
	if cfg.VMIDStart < 1 || cfg.VMIDEnd < cfg.VMIDStart {
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidVMIDRange",
			"fake provider %q: VM id range %d-%d must start at 1 or above and not end before it starts", cfg.Name, cfg.VMIDStart, cfg.VMIDEnd)
	}
	cfg.Nodes, cfg.Tags = slices.Clone(cfg.Nodes), slices.Clone(cfg.Tags)
	return &Provider{c: c, cfg: cfg, signer: deps.Signer.ForCluster(ownership.ClusterIdentity{Name: cfg.Name}),
		reservations: map[string]reservation{}}, nil
}

// ownedLocked verifies v's ownership marker for owner.
func (p *Provider) ownedLocked(v *vm, owner provider.Owner) error {
	rec, err := p.signer.Verify(v.description, v.id)
	if err == nil && rec.UID != owner.UID {
		err = fmt.Errorf("it belongs to claim %s/%s (uid %s)", rec.Namespace, rec.Name, rec.UID)
	}
	if err != nil {
		return provider.Errorf(provider.ClassPermanent, "NotOwned", "%w: VM %d, for claim %s/%s: %w", provider.ErrNotOwned, v.id, owner.Namespace, owner.Name, err)
	}
	return nil
}

// TemplateRef is the fake's own naming of a template
// (provider.TemplateSource.Settings): by its number (the template VM's
// id), or with ID zero by its name, and a full clone's target storage.
// The fake reads any kind's settings through their record, so a source a
// real kind read (a Proxmox template id) names the same template here.
type TemplateRef struct {
	ID            int
	Name, Storage string
}

var _ provider.SourceSettings = TemplateRef{}

// Record implements provider.SourceSettings.
func (r TemplateRef) Record() provider.SourceRecord {
	return provider.SourceRecord{Number: r.ID, Name: r.Name, Storage: r.Storage}
}

// FromRecord implements provider.SourceSettings.
func (TemplateRef) FromRecord(rec provider.SourceRecord) provider.SourceSettings {
	return TemplateRef{ID: rec.Number, Name: rec.Name, Storage: rec.Storage}
}
