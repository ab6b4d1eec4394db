// Package libvirt is HyperFleet's provider.Provider for plain KVM/QEMU
// hosts managed by libvirt, in pure Go: it speaks libvirt's RPC protocol
// with github.com/digitalocean/go-libvirt (no cgo, no libvirt client
// library) and writes every XML document with libvirt.org/go/libvirtxml.
//
// # Configuration
//
// ClusterConfig.Settings is a *ClusterSettings (the hosts, their
// transports, the storage pools and network, memory kept free per host);
// TemplateSource.Settings is a *TemplateRef (the template domain). A
// template is an inactive domain, defined on every host that may run its
// clones (or only on TemplateRef.Host), whose one disk is a volume of a
// storage pool; a clone copies its XML and puts its seed into the
// template's first CD-ROM slot (the bus the guest's kernel knows), or a
// new CD-ROM when it has none. A TemplateRef rebuilt from a record
// (provider.SourceSettings; the contract suite's Harness.Source too) may
// name the template by its ID instead (the first 31 bits of the domain's
// UUID, what ValidateTemplate reports as its ID). A full clone
// (TemplateSource.Linked false, or ClusterSettings.FullCopies) is written
// to TemplateRef.Storage when set, else to the volume pool.
//
// # IDs and names
//
// IDs are provider.IntIDs "libvirt://<n>" over the cluster's VM id range.
// The number lives in the domain's <metadata> (element vm of namespace
// MetadataNamespace, attribute id), together with the signed ownership
// block (pkg/ownership), the install's tags and the VM's spec name. A
// domain this install creates is named ownership.Signer.VMName(n) for its
// whole life: the keyed name is unique per install and VM id, so two
// installs sharing a host never collide, and defining it is an atomic claim
// of the id on the host (libvirt refuses a second domain of that name).
// libvirt renames only inactive domains, so the spec name is the domain's
// <title> instead, which virsh list --title shows; VMSummary.Name is the
// title once the VM is configured, the keyed name before (InstallNamed).
//
// # EnsureVM and tasks
//
// libvirt's calls are synchronous: a write is done when it returns. Each
// EnsureVM call makes at most one write and reports it as a Task (an id
// naming host, VM and operation) only so that the caller sees what was
// done; the next call reads where the VM stands from libvirt, never from
// the task. The steps:
//
//   - Placed: a VM id and a host reserved in-process (memory from
//     NodeGetFreeMemory minus the host's reservation and minus memory
//     promised to VMs this process is creating; MaxMachines), with a free
//     device of each mapping the VM's hardware asks for (devices.go).
//   - Queued: no clone slot on the host (ClonesPerNode) or its pool
//     (ClonesPerStorage), or the id is held
//     by a clone this Progress does not claim.
//   - Cloning: the domain is defined from the template's XML (new name,
//     UUID, MAC, the marker, its disk pointing at the overlay to be, the
//     VM's hardware: CPU, host devices, extra disks; hardware.go), then
//     the disk is created: a qcow2 overlay whose backing store is the
//     template's volume (StorageVolCreateXML), or a full copy
//     (StorageVolCreateXMLFrom, run in the background: it takes as long as
//     the copy). A clone holds its host's slot until the owner's next call
//     sees its disk; the queued owners a slot is then free for are woken
//     (Deps.Wake), first come first served (pkg/provider/cloneslots).
//     The extra disks are created next, one a call.
//   - Configuring: the NoCloud ISO is created and uploaded as a volume of
//     the media pool (StorageVolCreateXML and StorageVolUpload), then the
//     domain is defined again with its memory, cores, MAC, network, tags,
//     title, the ISO as a CD-ROM and a TPM when asked for.
//   - Starting: DomainCreate. Booting: the guest agent's addresses
//     (DomainInterfaceAddresses, source agent).
//   - Running: the ISO is ejected and its volume deleted (it held the
//     VM's single-use credential), one call each.
//
// A VM that has run and is shut off is Stopped: the provider knows it
// from libvirt's shut-off reason (anything but "unknown" means the domain
// ran since libvirtd started) and from the lifecycle events it follows on
// every host (ConnectDomainEventCallbackRegisterAny), which also wake the
// owner of a VM being built when it stops. A shut-off domain with a
// managed save image is Suspended instead, with no write (see Power).
//
// # Ownership
//
// Every destructive call (destroy, undefine, volume deletion, guest-file
// write, power change, disown) reads the domain's XML and verifies the
// block for the VM id first. DisownVM replaces the block by the release
// note, drops the install's tags and gives an unconfigured clone the
// title "disowned-<n>"; the domain keeps its name (libvirt renames only
// inactive domains) and its id, so it stays addressable and blocks the id.
//
// # Power
//
// SetPower's calls return once libvirt has the request. A shutdown asks
// the guest agent, else presses the ACPI power button; a guest still
// booting hears neither (QEMU drops a press the guest has not enabled
// yet), so such a shutdown is kept and issued again when libvirt reports
// the guest's agent connected (shutdown.go).
//
// PowerSuspend is a managed save (DomainManagedSave): the guest's memory
// goes to an image libvirtd keeps for the domain, which is then shut off;
// PowerResume (or PowerOn) starts it, and libvirt restores the guest from
// the image and deletes it. Both run in the background, their length
// growing with the guest's memory (suspend.go). A shut-off domain with
// such an image reads as suspended in GetVM and ListVMs (one listing per
// host of the domains that have one), holds no host memory (placement
// reads the host's free memory), and its image is the first thing
// DeleteVM removes; the stop event of a save is not a power-off.
//
// # Network isolation
//
// A VMSpec.Isolation becomes a network filter (nwfilter.go) named
// hf-<operator id>-<rules digest>, defined on the host before the domain
// refers to it and shared by every VM of the install with the same rules.
// It references libvirt's clean-traffic (the VM sends only from its MAC
// and its addresses, ARP included; any other address or MAC loses its
// traffic), with the addresses learnt from the VM's DHCP leases
// (CTRL_IP_LEARNING dhcp) or given as its static IP parameters, and then
// holds its stateful rules: replies to accepted connections, the VM's
// DHCP when it uses DHCP, the egress rules (direction out) and ingress
// rules (direction in) in order, each accepting a connection's first
// packet or dropping, then drop. clean-traffic passes IPv4 and ARP only:
// such a VM has no IPv6 at all. The filterref goes on the domain's one
// interface, which must be on a libvirt network or a bridge; a user-mode
// interface, a second interface or static addresses beside DHCP are
// refused (ClassConfiguration, reason IsolationUnsupported) before the
// clone. The rules hold traffic between VMs and from a VM to the host;
// the host's own processes still reach a VM (libvirt filters the bridged
// and host-bound paths only). A deletion undefines the install's filters
// no domain or filter on the host references any more. Probe of a
// cluster whose config is Isolated names a host without clean-traffic
// (ClusterInfo.IsolationProblem). The host needs
// libvirt's nwfilter driver (Debian 12: in libvirt-daemon), its filters
// (libvirt-daemon-config-nwfilter), ebtables and iptables (iptables),
// libpcap for DHCP snooping, and the br_netfilter module loaded (its
// bridge-nf-call-iptables is on by default), or no iptables rule sees
// bridged traffic.
//
// # Hosts that do not answer
//
// Probe reports a host that does not answer as an offline node;
// placement and ListVMs leave it out (ListVMs fails only when no host
// answers); a VM is "not found" only when the host its Progress names, or
// every host, answered without it.
//
// # Errors
//
// libvirt errors are classified by code (errors.go): VIR_ERR_NO_DOMAIN is
// ErrNotFound, a lost connection ErrUnreachable, a pool without room a
// ClassResource error naming the pool.
package libvirt

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/cloneslots"
)

// ClusterSettings is the libvirt part of a cluster's configuration
// (ClusterConfig.Settings).
type ClusterSettings struct {
	// Hosts are the libvirt hosts VMs are placed on; at least one.
	Hosts []Host
	// VolumePool is the storage pool that receives the VMs' disks
	// (overlays and full copies).
	VolumePool string
	// MediaPool is the storage pool that receives the cloud-init ISOs;
	// empty means VolumePool.
	MediaPool string
	// Network is the libvirt network of a VM's first interface when its
	// spec names no bridge; empty keeps the template's interface source.
	Network string
	// FullCopies makes every clone a full copy of the template's disk
	// instead of a qcow2 overlay on it.
	FullCopies bool
	// Devices are the host PCI devices VMs may ask for by mapping
	// (provider.Hardware.Devices), each passed through to one VM at a
	// time (devices.go).
	Devices []Device
	// SSHPrivateKey (PEM) authenticates qemu+ssh hosts; SSHKnownHosts
	// (known_hosts lines) verifies their host keys and is required with
	// it.
	SSHPrivateKey []byte
	SSHKnownHosts []byte
}

// Host is one libvirt host.
type Host struct {
	// Name is the host's name in placement, NodeInfo and Progress.Node.
	Name string
	// URI is how to reach its libvirtd: qemu+tls://host[:port]/system
	// (ClusterConfig.CABundle, ClientCertificate, ClientKey),
	// qemu+ssh://user@host[:port]/system (ClusterSettings.SSHPrivateKey)
	// or qemu:///system?socket=/path for a local socket.
	URI string
	// ReservedMemoryBytes is memory placement keeps free on the host for
	// its own use.
	ReservedMemoryBytes int64
}

// TemplateRef names the template of a VM source (TemplateSource.Settings).
type TemplateRef struct {
	// Domain is the template domain's name.
	Domain string
	// Host, when set, is the only host holding it; empty means every host
	// that defines a domain of that name.
	Host string

	// Storage is a full clone's target pool; empty: the volume pool.
	Storage string

	// id names the template by templateID instead, for a neutral
	// TemplateSource that gives only an ID.
	id int
}

// Record implements provider.SourceSettings. Host has no place in the
// placement record: a rebuilt source takes it from the template as it is.
func (r *TemplateRef) Record() provider.SourceRecord {
	return provider.SourceRecord{Number: r.id, Name: r.Domain, Storage: r.Storage}
}

// FromRecord implements provider.SourceSettings.
func (r *TemplateRef) FromRecord(rec provider.SourceRecord) provider.SourceSettings {
	return &TemplateRef{Domain: rec.Name, Host: r.Host, Storage: rec.Storage, id: rec.Number}
}

// String names the template in messages.
func (r *TemplateRef) String() string {
	if r.Domain != "" {
		return r.Domain
	}
	return fmt.Sprintf("with id %d", r.id)
}

// MetadataNamespace is the XML namespace of the <metadata> element that
// carries a VM's id, ownership block, tags and spec name.
const MetadataNamespace = "https://hyperfleet.io/xmlns/libvirt/vm/1"

// ids is the scheme of the provider IDs this provider writes.
var ids = provider.IntIDs{Prefix: "libvirt://", Hypervisor: "libvirt"}

// FormatID is the provider ID of VM number n.
func FormatID(n int) provider.ID { return ids.Format(n) }

// ParseID returns the VM number of id; the empty ID is zero.
func ParseID(id provider.ID) (int, error) { return ids.ParseOptional(id) }

// Factory builds libvirt Providers (a provider.FactoryFunc).
var Factory provider.FactoryFunc = func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	return New(cfg, deps)
}

// Provider is one HyperFleet install's connection to a set of libvirt
// hosts.
type Provider struct {
	cfg      provider.ClusterConfig
	settings ClusterSettings
	signer   *ownership.Signer
	clock    clock.PassiveClock
	log      logr.Logger
	obs      provider.Observer
	wake     func(provider.Owner)
	hosts    []*host
	// slots are the clone slots (ClonesPerNode, ClonesPerStorage), each
	// counted against its host and its pool (poolKey); they have their
	// own lock.
	slots *cloneslots.Slots

	// mu guards the in-process state below; never held during a call
	// that waits on a guest.
	mu sync.Mutex
	// reservations are placements of VMs this process is creating, by
	// owner UID.
	reservations map[string]*reservation
	// copies are the full copies of a template's disk this process
	// started, by VM id, until the VM's clone slot is released.
	copies map[int]*fullCopy
	// ran are domains (host/name) seen stopped after running, from
	// lifecycle events.
	ran map[string]bool
	// builders are owners of VMs being built, by host/name, woken when
	// their domain stops.
	builders map[string]provider.Owner
	// shutdowns are domains (host/name) whose shutdown waits for their
	// guest agent to connect (shutdown.go).
	shutdowns map[string]bool
	// powerJobs are managed saves and restores running in the
	// background, or failed and not yet reported, by host/name
	// (suspend.go).
	powerJobs map[string]*powerJob
	// filters are the network filters of VMs this process is building,
	// by owner UID, which the sweep leaves alone (nwfilter.go).
	filters map[string]string
	// tasks numbers the tasks this process reports.
	tasks int
}

// reservation is one placement this process holds.
type reservation struct {
	vmid   int
	host   string
	memory int64
	// devices are the PCI addresses of the host's devices the VM is to
	// get (devices.go).
	devices []string
	// diskWritten: this process took the VM's disk as written (disk.go).
	diskWritten bool
}

// fullCopy is a full copy of a template's disk running in the background
// (startCopy): libvirt's call returns only when the copy is written.
type fullCopy struct {
	// done is closed when the copy ends; err is its result.
	done chan struct{}
	err  error
}

var _ provider.Provider = (*Provider)(nil)

// New checks cfg and returns a Provider; it connects to the hosts on
// first use.
func New(cfg provider.ClusterConfig, deps provider.Deps) (*Provider, error) {
	settings, ok := cfg.Settings.(*ClusterSettings)
	if !ok || settings == nil {
		return nil, provider.Errorf(provider.ClassConfiguration, "InvalidSettings",
			"HypervisorCluster %q: spec.libvirt is missing (settings of type %T, want *libvirt.ClusterSettings)", cfg.Name, cfg.Settings)
	}
	if deps.Signer == nil {
		return nil, fmt.Errorf("libvirt provider %q: deps.Signer is required", cfg.Name)
	}
	if err := checkSettings(cfg, settings); err != nil {
		return nil, err
	}
	s := *settings
	s.Hosts = slices.Clone(settings.Hosts)
	s.Devices = slices.Clone(settings.Devices)
	if s.MediaPool == "" {
		s.MediaPool = s.VolumePool
	}
	clk := deps.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	obs := deps.Observer
	if obs == nil {
		obs = provider.NopObserver{}
	}
	p := &Provider{
		cfg: cfg, settings: s, signer: deps.Signer.ForCluster(ownership.ClusterIdentity{Name: cfg.Name}),
		clock: clk, log: deps.Log, obs: obs, wake: deps.Wake,
		slots: cloneslots.New(cloneslots.Config{PerNode: cfg.ClonesPerNode, PerStorage: cfg.ClonesPerStorage,
			Lapse: holdLimit, StaleAfter: cloneHoldLimit, Now: clk.Now, Wake: deps.Wake, Observe: obs.CloneQueue}),
		reservations: map[string]*reservation{}, copies: map[int]*fullCopy{},
		ran: map[string]bool{}, builders: map[string]provider.Owner{}, shutdowns: map[string]bool{}, powerJobs: map[string]*powerJob{},
		filters: map[string]string{},
	}
	for _, h := range s.Hosts {
		dial, err := dialerFor(h, cfg, &s)
		if err != nil {
			return nil, err
		}
		// Each call is bounded by RequestTimeout and measured (watchdog.go).
		dial = watchDialer{Dialer: dial, timeout: cmp.Or(cfg.RequestTimeout, defaultRequestTimeout), obs: obs}
		p.hosts = append(p.hosts, &host{Host: h, dial: dial, p: p})
	}
	return p, nil
}

// checkSettings refuses a configuration no call could work with, naming
// the field to fix.
func checkSettings(cfg provider.ClusterConfig, s *ClusterSettings) error {
	bad := func(field, format string, args ...any) error {
		return provider.Errorf(provider.ClassConfiguration, "InvalidSettings", "HypervisorCluster %q: spec.libvirt.%s: %s", cfg.Name, field, fmt.Sprintf(format, args...))
	}
	if len(s.Hosts) == 0 {
		return bad("hosts", "at least one host is required")
	}
	seen := map[string]bool{}
	for _, h := range s.Hosts {
		if h.Name == "" || seen[h.Name] {
			return bad("hosts", "host name %q is empty or repeated", h.Name)
		}
		seen[h.Name] = true
		if h.ReservedMemoryBytes < 0 {
			return bad("hosts", "host %s reserves negative memory", h.Name)
		}
	}
	if s.VolumePool == "" {
		return bad("volumePool", "a storage pool for the VMs' disks is required")
	}
	if err := checkDevices(s.Devices, s.Hosts); err != nil {
		return bad("devices", "%v", err)
	}
	if cfg.VMIDStart < 1 || cfg.VMIDEnd < cfg.VMIDStart {
		return provider.Errorf(provider.ClassConfiguration, "InvalidVMIDRange",
			"HypervisorCluster %q: VM id range %d-%d must start at 1 or above and not end before it starts", cfg.Name, cfg.VMIDStart, cfg.VMIDEnd)
	}
	return nil
}

// templateRef returns the template source names: its TemplateRef, by
// domain name or else by ID (templateID); a ClassConfiguration error
// naming the field when it names none.
func templateRef(source provider.TemplateSource) (*TemplateRef, error) {
	ref, ok := source.Settings.(*TemplateRef)
	switch {
	case ok && ref != nil && (ref.Domain != "" || ref.id > 0):
		return ref, nil
	case source.Settings != nil && !ok:
		return nil, provider.Errorf(provider.ClassConfiguration, "TemplateUnset",
			"source.libvirt: settings of type %T, want *libvirt.TemplateRef", source.Settings)
	}
	return nil, provider.Errorf(provider.ClassConfiguration, "TemplateUnset", "source.libvirt.domain: the VM's source names no libvirt template domain")
}

// hostNamed returns the configured host called name, nil if none.
func (p *Provider) hostNamed(name string) *host {
	for _, h := range p.hosts {
		if h.Name == name {
			return h
		}
	}
	return nil
}

// allowed says whether placement may use host name.
func (p *Provider) allowed(name string) bool {
	return len(p.cfg.Nodes) == 0 || slices.Contains(p.cfg.Nodes, name)
}

// task numbers a task for an operation this call did on vmid.
func (p *Provider) task(h *host, vmid int, op string) *provider.Task {
	p.mu.Lock()
	p.tasks++
	n := p.tasks
	p.mu.Unlock()
	now := p.clock.Now()
	return &provider.Task{ID: fmt.Sprintf("%s/%d/%s/%d-%d", h.Name, vmid, op, now.UnixNano(), n), Operation: op, StartTime: now}
}
