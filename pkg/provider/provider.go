// Package provider is HyperFleet's hypervisor-neutral contract: the Provider
// interface the controllers use to create, observe and destroy VMs, its
// types (VMSpec, Progress, ClusterConfig) and its sentinel errors with their
// classes (pkg/errclass), with no hypervisor library type leaking through. A
// hypervisor is an implementation of it (pkg/provider/proxmox) registered by
// kind.
//
// # Never block
//
// No method waits for a hypervisor task. A method that starts one returns it
// inside a Progress; the caller keeps the Progress and calls again later,
// passing it back. The caller persists where the VM is (ID, Node and
// Building, in the MachineClaim's status) before the next call, but not
// necessarily the task:
// the task lives in the caller's memory, and a restart loses it. Every method
// is idempotent: calling it again with the same inputs and the last Progress
// kept, or with the persisted one whose Task is nil, is always safe,
// including after an operator restart that lost everything not persisted. A
// Progress without its task makes the provider read where the VM stands and
// go on from there (a task still running is waited for, never repeated).
//
// # Ownership
//
// A Provider only ever modifies or destroys VMs whose ownership marker (see
// pkg/ownership) verifies for the Owner the caller names. A VM that does
// not verify is reported with ErrNotOwned and left alone.
//
// # Errors
//
// Methods return errors that wrap the sentinel errors below where one applies
// and that carry a Class (see Classify) telling the caller how to react.
package provider

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

// Provider is one connection to one hypervisor cluster. Implementations are
// safe for concurrent use.
type Provider interface {
	// Probe connects, checks the credentials and reports the cluster's
	// version, nodes and capacity. It is cheap enough to call every poll
	// interval.
	Probe(ctx context.Context) (*ClusterInfo, error)

	// ValidateTemplate checks that source names an existing template, that
	// the requested clone mode is possible on its storage and that the
	// full-clone target storage exists. Errors are ClassConfiguration when
	// the user must change the spec.
	ValidateTemplate(ctx context.Context, source TemplateSource) (*TemplateInfo, error)

	// EnsureVM advances the VM of spec.Owner by at most one hypervisor
	// operation and reports where it stands. prev is the Progress the
	// caller kept from the previous call (zero on the first call; its Task
	// nil after a restart). The returned Progress's ID and Node must be
	// persisted before the next call; its Task is kept in memory. When
	// the result's Phase is PhaseRunning the VM is up, its addresses are
	// known and its cloud-init ISO has been removed (under spec.Native,
	// the hypervisor's own cloud-init drive detached: it holds no secret,
	// and its absence tells a VM that has run from one never started).
	//
	// A hypervisor task that failed for a reason worth retrying (a lock
	// timeout, a busy storage) is not an error: the result carries Task
	// nil, a RetryAfter backoff and a Message saying what is retried. A
	// failure no retry can fix returns an error wrapping ErrTaskFailed
	// with ClassPermanent, the same on every later call.
	EnsureVM(ctx context.Context, spec *VMSpec, prev Progress) (*EnsureResult, error)

	// DeleteVM advances the deletion of the VM prev points at by at most one
	// hypervisor operation: stop it if it runs, destroy it with its disks
	// (and, when it is suspended, its saved state), delete its cloud-init
	// ISO. It returns Done once nothing of the VM is
	// left, and only after the hypervisor confirmed the VM's absence (an
	// error about something else that is missing, such as a storage or a
	// volume, is an error, never Done). A VM whose ownership does not
	// verify for owner is never touched: DeleteVM returns ErrNotOwned. That
	// VM may still be the owner's, with a damaged marker, so the caller
	// must not release what the VM may use (see docs/security.md,
	// "Absence and release"). A VM that is already gone is Done.
	DeleteVM(ctx context.Context, owner Owner, prev Progress) (*DeleteResult, error)

	// RemoveCloudInitMedia advances, by at most one hypervisor operation,
	// the removal of the cloud-init data of the owner's VM at prev: it
	// detaches the media from the VM and deletes it from storage, and
	// leaves the VM itself (its disks, its power state) as it is. It
	// returns Done once no cloud-init media of the VM is left; a VM that
	// is gone, or was never created, is Done once its media is. It waits
	// for a task in flight in prev. A VM built from a spec with Native
	// has no medium of the provider's: Done at once. A VM whose ownership does not verify
	// for owner is never touched: ErrNotOwned. The cloud-init data holds
	// the VM's single-use credential: a VM kept after its run (a failed
	// VM kept for debugging) must not keep it on storage. Call it only for
	// a VM that EnsureVM will not drive again.
	RemoveCloudInitMedia(ctx context.Context, owner Owner, prev Progress) (*DeleteResult, error)

	// DisownVM releases the owner's VM at ref from this install's
	// management without deleting it (a platform admin keeps it, for
	// forensics or debugging): in one hypervisor write (two for a VM
	// suspended to disk whose saved state holds its own copy of the
	// definition, as libvirt's managed save does: not Done after the
	// first) it removes this install's tags, replaces the ownership block with a plain note of
	// whose VM it was (ownership.Signer.ReleasedDescription), and renames
	// a VM that still carries the install's clone name. Everything else
	// stays as it is: power state, disks, network, other tags and text.
	// Afterwards the VM is foreign to this install: ListVMs shows it
	// neither OperatorTagged nor InstallNamed (the orphan sweep passes it
	// by), GetVM returns it with Owner nil, and every call that modifies
	// or destroys a VM refuses it with ErrNotOwned. Call
	// RemoveCloudInitMedia first: the VM's media are the install's and go
	// no other way once it is foreign.
	//
	// It is idempotent: a VM this call already released for owner is Done
	// with Removed empty. A VM whose ownership marker does not verify for
	// owner (and that no release for owner left) is never touched:
	// ErrNotOwned. A VM the hypervisor says does not exist is ErrNotFound.
	// A VM that is locked (a task in flight) is not Done: call again after
	// RetryAfter. A VM suspended to disk whose hypervisor changes nothing of
	// a suspended VM's definition (Proxmox VE) is refused, ClassPermanent
	// with reason Suspended: resume it (or delete it) first.
	DisownVM(ctx context.Context, owner Owner, ref VMRef) (*DisownResult, error)

	// ListVMs returns every VM of the cluster from one batch call. It
	// proves no ownership: a VM's OperatorTagged only says it carries this
	// install's tag. Use GetVM to verify.
	ListVMs(ctx context.Context) ([]VMSummary, error)

	// CheckRef reports whether ref is a VM this provider could have
	// created under its cluster's configuration: an ID of its own scheme
	// inside the range the cluster allots (for Proxmox a VM id in
	// vmidRange) on a node placement may use. It makes no call; it lets a
	// caller refuse a reference it read from somewhere a tenant can write
	// before acting on it. The error is ClassConfiguration and says what
	// is outside.
	CheckRef(ref VMRef) error

	// GetVM reads one VM and verifies its ownership marker. It returns
	// ErrNotFound only if the hypervisor says the VM itself does not exist.
	// A VM whose marker does not
	// verify is returned with Owner nil and OwnershipError set.
	GetVM(ctx context.Context, ref VMRef) (*VM, error)

	// SetPower asks for a power state change on an owned VM and returns the
	// hypervisor task, or nil when the VM is already in that state. A
	// suspended VM counts as not running: PowerOff and PowerShutdown leave
	// it (and its saved state) as it is, PowerOn resumes it like
	// PowerResume.
	SetPower(ctx context.Context, owner Owner, ref VMRef, action PowerAction) (*Task, error)

	// PlaceGuestFile writes file into the running guest of the owner's VM
	// at ref through the hypervisor's guest channel (for Proxmox the QEMU
	// guest agent), replacing a file of that path. It is how a secret
	// reaches a VM without resting on any storage: the cloud-init medium
	// and the disk never hold it (docs/security.md, "Nothing replayable at
	// rest"). The VM's ownership marker is verified first, so a VM id
	// reused by another VM is never written to (ErrNotOwned). It makes one
	// write and waits for no task; writing the same file again is
	// harmless.
	//
	// The guest decides the file's mode (QEMU's guest agent creates new
	// files 0666 and keeps the mode of an existing one): file.Path must lie
	// in a directory that only its reader can enter. A VM that is not
	// running, whose guest channel does not answer yet, or whose guest has
	// no such directory yet is ErrGuestNotReady (ClassTransient): call
	// again later. A VM without a guest channel is ClassConfiguration
	// (reason NoGuestAgent), a file larger than MaxGuestFileBytes or not at
	// an absolute path ClassConfiguration (reason InvalidGuestFile), a VM
	// that does not exist ErrNotFound.
	PlaceGuestFile(ctx context.Context, owner Owner, ref VMRef, file GuestFile) error

	// ListCloudInitMedia lists, on every online node, the cloud-init media
	// whose names say this install wrote them (for Proxmox the NoCloud ISO
	// files hf-<operator id>-<vmid>-<owner digest>.iso on the ISO
	// storage). A listed medium may well be in use: the orphan sweep
	// decides, from the claims, which ones are stray.
	ListCloudInitMedia(ctx context.Context) ([]CloudInitMedium, error)

	// DeleteCloudInitMedium advances the deletion of one listed medium by
	// at most one hypervisor operation and returns Done once it is gone.
	// It re-checks first: a medium whose VM id is being cloned, or holds a
	// VM whose ownership marker verifies for an owner with the medium's
	// OwnerDigest, or that a VM has attached, is that VM's and goes with
	// it: DeleteCloudInitMedium returns ErrInUse and deletes nothing. A
	// medium whose name is not this install's is never touched (ErrNotOwned).
	DeleteCloudInitMedium(ctx context.Context, m CloudInitMedium) (*DeleteResult, error)
}

// GuestFile is a file PlaceGuestFile writes into a running guest.
type GuestFile struct {
	// Path is the file's absolute path in the guest.
	Path string
	// Content is what the file holds, at most MaxGuestFileBytes.
	Content []byte
}

// MaxGuestFileBytes bounds GuestFile.Content: what every provider can
// write in one call (Proxmox's agent/file-write takes 61,440 characters,
// which base64 makes of 45 KiB).
const MaxGuestFileBytes = 32 << 10

// CheckGuestFile returns the ClassConfiguration error PlaceGuestFile
// returns for a file no provider writes, nil for a file it may write.
func CheckGuestFile(f GuestFile) error {
	switch {
	case len(f.Path) < 2 || f.Path[0] != '/' || strings.ContainsRune(f.Path, 0) || path.Clean(f.Path) != f.Path:
		return Errorf(ClassConfiguration, "InvalidGuestFile", "guest file path %q is not a clean absolute path", f.Path)
	case len(f.Content) > MaxGuestFileBytes:
		return Errorf(ClassConfiguration, "InvalidGuestFile", "guest file %s holds %d bytes; at most %d can be written into a guest", f.Path, len(f.Content), MaxGuestFileBytes)
	}
	return nil
}

// CloudInitMedium is one cloud-init medium (for Proxmox a NoCloud ISO
// file) named by this install's scheme.
type CloudInitMedium struct {
	// ID is the hypervisor's id of the medium (for Proxmox the volume id,
	// "<storage>:iso/<file>").
	ID string
	// Node is the node it was listed on (files of node-local storages
	// exist per node).
	Node string
	// VM is the VM it was written for.
	VM ID
	// OwnerDigest is OwnerDigest of the UID of the claim it was written
	// for.
	OwnerDigest string
}

// OwnerDigest is the short digest of an owner's UID that names of per-VM
// artifacts carry (12 hex characters of its SHA-256): enough to tell the
// claims of one install apart, and it keeps the UID itself out of names.
func OwnerDigest(uid string) string {
	sum := sha256.Sum256([]byte(uid))
	return hex.EncodeToString(sum[:6])
}

// ClusterInfo is what Probe reports.
type ClusterInfo struct {
	// Version is the hypervisor's version string, such as "9.1.4".
	Version string
	// Nodes lists every node of the cluster, allowed for placement or not.
	Nodes []NodeInfo
	// InsecureTLS is true when the connection skips certificate
	// verification (an explicit opt-in that status must flag).
	InsecureTLS bool
	// AvailableStorageBytes is the free space for VM disks on the online
	// allowed nodes (shared storage counted once), minus what VMs being
	// created are promised; placement refuses a VM whose disk does not
	// fit on its storage.
	AvailableStorageBytes int64
	// IsolationProblem, for a cluster whose config is Isolated, says why
	// the hypervisor would not enforce the VMs' isolation (for Proxmox VE,
	// a datacenter firewall that is off) and how to fix it; empty when it
	// enforces it.
	IsolationProblem string
}

// NodeInfo describes one hypervisor node.
type NodeInfo struct {
	Name   string
	Online bool
	// Allowed is false for nodes outside the cluster's placement list.
	Allowed bool
	// CPUs is the node's logical CPU count.
	CPUs int64
	// MemoryBytes and MemoryUsedBytes are the node's total and used memory.
	MemoryBytes     int64
	MemoryUsedBytes int64
	// ReservedMemoryBytes is memory promised to VMs this process is still
	// creating on the node and that the node does not count yet.
	ReservedMemoryBytes int64
	// StorageBytes and StorageUsedBytes total the node's local storages.
	StorageBytes     int64
	StorageUsedBytes int64
}

// FreeMemoryBytes is the node's memory minus what is used or reserved.
func (n NodeInfo) FreeMemoryBytes() int64 {
	return n.MemoryBytes - n.MemoryUsedBytes - n.ReservedMemoryBytes
}

// TemplateSource names the hypervisor template a VM is cloned from.
type TemplateSource struct {
	// Linked selects a linked clone (copy-on-write) instead of a full one.
	Linked bool
	// Native, when set, is the hypervisor's own cloud-init the template's
	// VMs will use (VMSpec.Native): ValidateTemplate checks on the
	// template's node that its files exist where a VM can read them and
	// that its Storage can hold the seed. EnsureVM ignores it.
	Native *NativeFiles
	// TPM, when set, is the TPM the template's VMs need (VMSpec.TPM):
	// with Add false ValidateTemplate refuses a template that has no TPM
	// 2.0 of its own. EnsureVM ignores it.
	TPM *VMTPM
	// Hardware, when set, is the hardware the template's VMs get
	// (VMSpec.Hardware): ValidateTemplate refuses what the hypervisor
	// would not give them (a CPU model or flag its version lacks, an
	// extra disk's storage missing, a device mapping it does not have),
	// so that no VM is cloned for it. EnsureVM ignores it.
	Hardware *Hardware
	// Settings is the hypervisor kind's own naming of the template and of
	// its clones' place (for Proxmox a proxmox.TemplateRef: the template's
	// VM id or name, a full clone's storage and format, a resource pool),
	// read from its section of the template's source (source.<kind>) by
	// the kind's registration (Kind.ReadSource); opaque to shared code.
	// It is a SourceSettings, so that a signed record can hold it.
	Settings any
}

// SourceRecord is a kind's naming of a template as the signed placement
// record holds it (pkg/ownership.Placement: the number, the name and the
// tags as its opaque Template, TemplateRef; the others as fields of their
// own): a number, a name, tags selecting one template per node, a full
// clone's storage and format, a pool, each meaning what the kind says and
// empty where it has none.
type SourceRecord struct {
	Number                      int
	Name, Storage, Format, Pool string
	// Tags select the template by the tags it carries instead of a number
	// or a name: lower-case, sorted, each at most once, made of letters,
	// digits and _ - + . (no ',' or ':', which the reference uses).
	Tags []string
}

// tagsRefPrefix starts the reference of a record naming its template by
// tags. A number never holds ':' and a "<number>/<name>" reference starts
// with a number, so no other record gives a string with this prefix.
const tagsRefPrefix = "tags:"

// TemplateRef is the template rec names, its Number and Name or its Tags
// as the kind recorded them, in one string: the template reference of a
// claim's placement record (pkg/ownership.Placement.Template), which stores
// and signs it without reading it. Empty when rec names no template,
// "tags:<tag>,<tag>..." when it names one by tags, else the number alone
// when it has no name, else "<number>/<name>" (a name may hold "/", a
// number never does): each Number, Name and Tags gives one string.
func (r SourceRecord) TemplateRef() string {
	switch {
	case len(r.Tags) > 0:
		return tagsRefPrefix + strings.Join(r.Tags, ",")
	case r.Name != "":
		return strconv.Itoa(r.Number) + "/" + r.Name
	case r.Number != 0:
		return strconv.Itoa(r.Number)
	}
	return ""
}

// WithTemplateRef is rec naming the template ref names, ref being what
// TemplateRef returned; an error for any other string, so that a template
// is read back only as it was recorded.
func (r SourceRecord) WithTemplateRef(ref string) (SourceRecord, error) {
	out := r
	out.Number, out.Name, out.Tags = 0, "", nil
	if list, ok := strings.CutPrefix(ref, tagsRefPrefix); ok {
		tags, err := parseRefTags(list)
		if err != nil {
			return r, fmt.Errorf("template reference %q: %w", ref, err)
		}
		out.Tags = tags
		return out, nil
	}
	number, name, _ := strings.Cut(ref, "/")
	out.Name = name
	if number != "" {
		n, err := strconv.Atoi(number)
		if err != nil {
			return r, fmt.Errorf("template reference %q: its number: %w", ref, err)
		}
		out.Number = n
	}
	if out.TemplateRef() != ref {
		return r, fmt.Errorf("template reference %q is not one a SourceRecord gives (%q)", ref, out.TemplateRef())
	}
	return out, nil
}

// parseRefTags reads the tags of a "tags:" reference: at least one, each
// a valid tag, in the order and form TemplateRef writes them (lower-case,
// sorted, no repeats), so that one selection has one reference.
func parseRefTags(list string) ([]string, error) {
	tags := strings.Split(list, ",")
	for i, t := range tags {
		if !validRefTag(t) {
			return nil, fmt.Errorf("tag %q is not a lower-case tag (letters, digits and _ - + .)", t)
		}
		if i > 0 && tags[i-1] >= t {
			return nil, fmt.Errorf("tags are not sorted without repeats")
		}
	}
	return tags, nil
}

// validRefTag reports whether t is a tag a selector may record: as the
// API's pattern ^[a-zA-Z0-9_][-a-zA-Z0-9_+.]*$ allows, lower-cased.
func validRefTag(t string) bool {
	if t == "" || t[0] == '-' || t[0] == '+' || t[0] == '.' {
		return false
	}
	for _, c := range t {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '-', c == '+', c == '.':
		default:
			return false
		}
	}
	return true
}

// SourceSettings is what a kind's TemplateSource.Settings implement: a
// claim's placement record holds a source (RecordSource) and rebuilds it
// (SourceFromRecord) without shared code reading the kind's fields.
type SourceSettings interface {
	// Record is the settings as a placement record holds them.
	Record() SourceRecord
	// FromRecord is the settings a record holds, of the receiver's type.
	FromRecord(SourceRecord) SourceSettings
}

// RecordSource is src's Settings as a placement record holds them; zero
// when its Settings are not a SourceSettings.
func RecordSource(src TemplateSource) SourceRecord {
	if s, ok := src.Settings.(SourceSettings); ok {
		return s.Record()
	}
	return SourceRecord{}
}

// SourceFromRecord is the Settings rec holds, of the kind (the type) of
// like, the Settings of the source rec was recorded from; like itself
// when it is not a SourceSettings.
func SourceFromRecord(like any, rec SourceRecord) any {
	if s, ok := like.(SourceSettings); ok {
		return s.FromRecord(rec)
	}
	return like
}

// NativeFiles is what ValidateTemplate checks of a native cloud-init: the
// NativeCloudInit fields that name things on the hypervisor.
type NativeFiles struct {
	VendorData, UserData, Storage string
}

// TemplateInfo is what ValidateTemplate learned about a template.
type TemplateInfo struct {
	ID   int
	Name string
	Node string
	// Storages are the storages holding the template's disks.
	Storages []string
	// DiskBytes is the size of the template's boot disk.
	DiskBytes int64
	// Cores and MemoryBytes are the template's CPU cores and memory, what
	// a VM keeps when its spec leaves them zero.
	Cores       int
	MemoryBytes int64
	// LinkedCloneSupported says whether the storages allow linked clones.
	LinkedCloneSupported bool
	// GuestFiles says the template's VMs have a guest channel, so that
	// PlaceGuestFile can write into them (for Proxmox: the QEMU guest
	// agent is enabled, agent: 1).
	GuestFiles bool
	// TPM says the template has a TPM 2.0 its clones inherit (for Proxmox
	// a tpmstate0 of version v2.0).
	TPM bool
	// Nodes are, for a source selecting one template per node (for
	// Proxmox source.proxmox.templateSelector), the nodes holding a copy,
	// sorted; ID, Name and Node are then the first one's, every copy
	// having been checked alike. Empty for a source naming one template.
	Nodes []string
}

// Owner identifies who a VM belongs to. It is written into the VM's signed
// ownership marker when the VM is created and checked before every
// destructive call.
type Owner struct {
	// Namespace, Name and UID identify the MachineClaim.
	Namespace string
	Name      string
	UID       string
	// Pool is the claim's RunnerPool, empty when none.
	Pool string
	// CreatedAt is the claim's creation time (stable across retries, so a
	// re-signed marker is identical).
	CreatedAt time.Time
}

// CheckSpecOwner is the first check of an EnsureVM: there is a spec and it
// names its owner's UID, which the VM's ownership record is keyed by. A
// failure is a ClassConfiguration error, reason InvalidSpec.
func CheckSpecOwner(spec *VMSpec) error {
	if spec == nil || spec.Owner.UID == "" {
		return Errorf(ClassConfiguration, "InvalidSpec", "EnsureVM needs a VM spec with an owner UID")
	}
	return nil
}

// VMSpec is everything that shapes one VM.
type VMSpec struct {
	Owner Owner
	// Name is the VM's name on the hypervisor once it is configured, and its
	// hostname (a DNS label). Until then a clone carries the install's keyed
	// name (ownership.Signer.VMName; see VMSummary.InstallNamed).
	Name string
	// Description is free text placed above the ownership marker.
	Description string
	Source      TemplateSource
	// CPUCores, MemoryBytes: zero keeps the template's value.
	CPUCores    int
	MemoryBytes int64
	// DiskBytes grows the boot disk to this size; zero or smaller than the
	// template's disk keeps the template's size.
	DiskBytes int64
	Network   NetworkSpec
	// CloudInit is rendered when the provider delivers it to the VM (once
	// the clone exists), not before: a claim that waits for a clone slot
	// holds no single-use credential yet. A CloudInit value renders itself.
	CloudInit CloudInitSource
	// Native, when set, delivers the VM's cloud-init through the
	// hypervisor's own cloud-init instead (for Proxmox its cloud-init
	// drive, generated from the VM's config): CloudInit is then never
	// rendered, the provider writes no medium of its own, and what a VM
	// needs beyond these fields reaches it through PlaceGuestFile.
	Native *NativeCloudInit
	// Tags are extra tags for the VM besides the ownership tags; they must
	// already be legal for the hypervisor.
	Tags []string
	// MemoryHint is the memory the VM will need, used to reserve capacity
	// when placing it (MemoryBytes, or the template's memory when zero).
	MemoryHint int64
	// TPM, when set, says the VM needs a TPM 2.0 (its workload identity is
	// attested with it); nil: the VM gets whatever TPM its template has.
	TPM *VMTPM
	// SuspendsToDisk says the VM will be suspended to disk (a standby VM,
	// SetPower PowerSuspend): placement counts its saved memory against
	// the storage the hypervisor writes it to, as it counts the VM's
	// disks, so that a VM is not built where its suspend cannot succeed.
	SuspendsToDisk bool
	// Isolation, when set, is the network policy the hypervisor holds the
	// VM's first interface to (see Isolation); nil leaves its traffic
	// alone. A provider that cannot enforce it refuses the VM
	// (ClassConfiguration, reason IsolationUnsupported) rather than build
	// it open.
	Isolation *Isolation
	// Hardware, when set, is the VM's CPU model and flags, its
	// passed-through devices and extra disks (see Hardware); nil keeps the
	// template's CPU and adds nothing. Placement counts its devices and
	// disks as capacity.
	Hardware *Hardware
}

// VMTPM is the TPM a VM needs.
type VMTPM struct {
	// Add attaches a fresh virtual TPM 2.0 while the VM is configured,
	// before its first start, so that its endorsement key is the VM's own
	// (for Proxmox a new tpmstate0 volume). False: the template must have
	// one already; ValidateTemplate checks it (TemplateSource.TPM).
	Add bool
}

// NetworkSpec is the VM's first network interface.
type NetworkSpec struct {
	// Bridge is the hypervisor bridge; empty means the cluster default.
	Bridge string
	// VLAN tags the interface; zero means untagged.
	VLAN int
	// Model is the NIC model (for Proxmox virtio, e1000, vmxnet3).
	Model string
	// MACAddress is set on the interface when not empty (lower-case,
	// colon-separated). HyperFleet derives it from the claim so that
	// network-config can match the interface before the VM exists.
	MACAddress string
}

// NativeCloudInit is what a hypervisor's own cloud-init builds a VM's seed
// from: the VM's name as host name, its first interface's addressing, its
// resolver, a user with public keys, and files placed on the hypervisor by
// its administrators. Whoever may read the VM's configuration reads these
// (for Proxmox anyone with VM.Audit): no secret and nothing per VM but the
// address belongs here.
type NativeCloudInit struct {
	// IPv4 is "dhcp", an address with its prefix length ("192.0.2.10/24"),
	// or empty for none; Gateway4 goes with an address.
	IPv4     string
	Gateway4 string
	// IPv6 is "dhcp", "auto" (SLAAC), an address with its prefix length,
	// or empty for none; Gateway6 goes with an address.
	IPv6     string
	Gateway6 string
	// Nameservers are IP addresses; SearchDomains DNS names. The first
	// search domain completes the host name to the FQDN; a hypervisor may
	// take only that one (Proxmox does).
	Nameservers   []string
	SearchDomains []string
	// User is the guest user to create, empty for the image's default
	// user; SSHAuthorizedKeys are OpenSSH public keys it accepts.
	User              string
	SSHAuthorizedKeys []string
	// VendorData and UserData name files on the hypervisor that become
	// the seed's vendor-data and replace its generated user-data whole
	// (for Proxmox snippet volumes, "<storage>:snippets/<file>"); empty
	// for none.
	VendorData string
	UserData   string
	// Storage is where the hypervisor keeps the VM's seed; empty: the
	// storage of its boot disk.
	Storage string
}

// CloudInit is the rendered NoCloud data delivered to the VM.
type CloudInit struct {
	UserData      []byte
	MetaData      []byte
	NetworkConfig []byte
}

// Render implements CloudInitSource: the data is already rendered.
func (c CloudInit) Render(context.Context) (CloudInit, error) { return c, nil }

// CloudInitSource renders a VM's cloud-init. Providers call Render only
// when they are about to deliver the data, at most once per delivery, and
// return its error unchanged (wrapped), so the caller's error class holds.
type CloudInitSource interface {
	Render(ctx context.Context) (CloudInit, error)
}

// Phase is where a VM stands in its creation.
type Phase string

const (
	// PhasePlaced: an id and a node are reserved; nothing exists yet.
	PhasePlaced Phase = "Placed"
	// PhaseQueued: waiting for a free clone slot on the node or storage, a
	// retry after a failed clone, or the end of a clone at the reserved id
	// that this Progress does not name and that Building does not claim (a
	// lost Progress's own clone, or another claim's after a restart forgot
	// the reservation; then the claim starts over at PhasePlaced).
	PhaseQueued Phase = "Queued"
	// PhaseCloning: the clone task runs.
	PhaseCloning Phase = "Cloning"
	// PhaseConfiguring: resources, network, disk and cloud-init are applied.
	PhaseConfiguring Phase = "Configuring"
	// PhaseStarting: the start task runs.
	PhaseStarting Phase = "Starting"
	// PhaseBooting: the VM runs; waiting for its guest agent.
	PhaseBooting Phase = "Booting"
	// PhaseRunning: the guest is up, addresses are known, the cloud-init
	// ISO is gone.
	PhaseRunning Phase = "Running"
	// PhaseStopped: the VM exists and is powered off after having run; the
	// workload inside is finished.
	PhaseStopped Phase = "Stopped"
	// PhaseSuspended: the VM ran and is suspended to disk (SetPower
	// PowerSuspend). EnsureVM leaves it so, with no hypervisor write and
	// no task in the progress; its RetryAfter only paces a caller that
	// polls (nothing changes until SetPower PowerResume);
	// after SetPower PowerResume it reports PhaseBooting until the guest
	// agent answers again, then PhaseRunning with the addresses read after
	// the resume.
	PhaseSuspended Phase = "Suspended"
)

// ID names one VM on its hypervisor cluster. Only the provider that wrote
// it reads it; to everything else it is an opaque string, like Cluster
// API's providerID: "<kind>://<what the provider needs to find the VM>".
// The Proxmox provider writes "proxmox://<vmid>" (pkg/provider/proxmox,
// FormatID). The empty ID names no VM. Callers store it
// (status.vmRef.providerID), compare it and key maps by it, never parse it.
type ID string

// Compare orders IDs for stable listings and messages: shorter first,
// then by their text, so that IDs of one scheme whose tails are numbers
// (proxmox://99, proxmox://100) sort by number. It never says which VM is
// older or more important.
func (id ID) Compare(other ID) int {
	return cmp.Or(cmp.Compare(len(id), len(other)), strings.Compare(string(id), string(other)))
}

// IntIDs is the ID scheme of a hypervisor that numbers its VMs: a prefix
// and the VM's positive decimal number, nothing else ("proxmox://1234").
type IntIDs struct {
	// Prefix starts every ID, such as "proxmox://".
	Prefix string
	// Hypervisor names the hypervisor in errors.
	Hypervisor string
}

// Format is the ID of VM number n.
func (s IntIDs) Format(n int) ID { return ID(s.Prefix + strconv.Itoa(n)) }

// Parse returns the number of an ID Format wrote; anything else (another
// scheme, a damaged or padded number) is ClassPermanent, reason
// InvalidVMID: no retry makes it name one of this hypervisor's VMs.
func (s IntIDs) Parse(id ID) (int, error) {
	digits, ok := strings.CutPrefix(string(id), s.Prefix)
	n, err := strconv.Atoi(digits)
	if !ok || err != nil || n <= 0 || s.Format(n) != id {
		return 0, Errorf(ClassPermanent, "InvalidVMID", "%q is not a %s VM id (%s<n>)", string(id), s.Hypervisor, s.Prefix)
	}
	return n, nil
}

// ParseOptional is Parse, but the empty ID (a Progress that reserves
// nothing) is zero.
func (s IntIDs) ParseOptional(id ID) (int, error) {
	if id == "" {
		return 0, nil
	}
	return s.Parse(id)
}

// CheckInRange is the check of a VMRef's id (CheckRef): Format wrote it,
// and its number lies in [start, end], the cluster's VM id range. A
// failure is a ClassConfiguration error, reason InvalidVMRef.
func (s IntIDs) CheckInRange(id ID, start, end int) error {
	n, err := s.Parse(id)
	switch {
	case err != nil:
		return Errorf(ClassConfiguration, "InvalidVMRef", "%q is not a %s VM id", string(id), s.Hypervisor)
	case n < start || n > end:
		return Errorf(ClassConfiguration, "InvalidVMRef", "VM id %d is outside the cluster's range %d-%d", n, start, end)
	}
	return nil
}

// ParseEnsure makes the first checks of an EnsureVM (CheckSpecOwner) and
// returns the number of the VM prev reserved, zero when it reserves none.
func (s IntIDs) ParseEnsure(spec *VMSpec, prev Progress) (int, error) {
	if err := CheckSpecOwner(spec); err != nil {
		return 0, err
	}
	return s.ParseOptional(prev.ID)
}

// ParseDeletion starts a DeleteVM or RemoveCloudInitMedia from prev: the
// number of its VM (zero when it reserves none), and the result that goes
// on from where prev says the VM is.
func (s IntIDs) ParseDeletion(prev Progress) (int, *DeleteResult, error) {
	n, err := s.ParseOptional(prev.ID)
	if err != nil {
		return 0, nil, err
	}
	return n, &DeleteResult{Progress: Progress{ID: prev.ID, Node: prev.Node}}, nil
}

// Progress is the state a caller persists between calls. Every field is
// plain data so it fits into an object's status.
type Progress struct {
	// ID and Node locate the VM (or its reservation). An empty ID means
	// nothing is reserved.
	ID ID
	// Node is the hypervisor node the VM was last seen on, a hint the
	// provider may ignore and correct; empty when unknown.
	Node string
	// Building says the VM at ID is this owner's own build: the provider
	// reported PhaseCloning or a later phase for it, or the owner stored
	// its reservation of ID before its clone request (a MachineClaim's
	// one status write before it; the provider does not hand a reserved
	// id to another owner while it runs). Whatever holds the id
	// is then the owner's, a clone in progress included, so a provider
	// that lost the task of a clone in flight (an operator restart) goes
	// on at PhaseCloning; without Building it cannot tell the owner's clone
	// from another's until the clone ends, and waits at PhaseQueued.
	// Providers set it; the caller persists it with ID and Node.
	Building bool
	// Task is the hypervisor task in flight, nil when none.
	Task *Task
}

// VMRef locates a VM.
func (p Progress) VMRef() VMRef { return VMRef{ID: p.ID, Node: p.Node} }

// Task is a hypervisor task to persist and poll.
type Task struct {
	// ID is the hypervisor's task id (for Proxmox the UPID).
	ID string
	// Operation is what the task does, such as "clone" or "start".
	Operation string
	// StartTime is when the task was started.
	StartTime time.Time
}

// EnsureResult is what EnsureVM reports.
type EnsureResult struct {
	Progress Progress
	Phase    Phase
	// Addresses are the guest's IP addresses once known (no loopback or
	// link-local addresses).
	Addresses []string
	// MACAddress is the first interface's MAC once known.
	MACAddress string
	// RetryAfter says when calling again is useful. Zero with PhaseRunning,
	// PhaseStopped or PhaseSuspended (the resting phases) means no further
	// call is needed; zero otherwise means "call again now".
	RetryAfter time.Duration
	// Message says what happens in words, for conditions and events.
	Message string
	// Waits, at PhasePlaced, is why the clone would not start if it were
	// requested now (no clone slot free on the node or storage): the
	// Message a PhaseQueued result would carry; empty when it would
	// start. A hint, not a promise: the caller records its reservation
	// with what it will show while the VM waits (one status write
	// instead of two in a burst), and the clone request decides. At
	// PhaseQueued it is set, to the Message, when the clone waits for a
	// slot (capacity, not a failure or a lock): a wait the caller may
	// show as a step of the build.
	Waits string
}

// DeleteResult is what DeleteVM reports.
type DeleteResult struct {
	Progress Progress
	// Done is true once the VM and its cloud-init ISO are gone.
	Done bool
	// RetryAfter says when calling again is useful.
	RetryAfter time.Duration
	Message    string
}

// DisownResult is what DisownVM reports.
type DisownResult struct {
	// Done is true once the VM is released.
	Done bool
	// RetryAfter says when calling again is useful while not Done.
	RetryAfter time.Duration
	// Removed names what this call removed from the VM, in words (the
	// tags, the ownership block, the clone name); empty when an earlier
	// call had released it.
	Removed []string
	Message string
}

// VMRef locates a VM on the cluster.
type VMRef struct {
	ID ID
	// Node may be empty or stale; the provider then looks the VM up.
	Node string
}

// PowerState is a VM's power state as the hypervisor reports it.
type PowerState string

const (
	PowerRunning PowerState = "running"
	PowerStopped PowerState = "stopped"
	PowerPaused  PowerState = "paused"
	// PowerSuspended: suspended to disk (SetPower PowerSuspend): the
	// guest's memory is saved on the hypervisor's storage and no process
	// runs, so the VM holds no host memory; PowerResume brings the guest
	// back where it was.
	PowerSuspended PowerState = "suspended"
	// PowerUnknown: the hypervisor has no current sample (Proxmox reports
	// "unknown" until its status refresh has seen the VM).
	PowerUnknown PowerState = "unknown"
)

// PowerAction is a requested power change.
type PowerAction string

const (
	PowerOn       PowerAction = "on"
	PowerOff      PowerAction = "off"      // hard stop
	PowerShutdown PowerAction = "shutdown" // ask the guest
	// PowerSuspend saves a running guest's memory to the hypervisor's
	// storage and stops the VM (Proxmox VE: status/suspend with todisk;
	// libvirt: managedsave). A VM already suspended is left as it is (no
	// task); a VM that does not run has no state to save: an error
	// (ClassPermanent, reason NotRunning).
	PowerSuspend PowerAction = "suspend"
	// PowerResume starts a suspended VM from its saved state, which the
	// hypervisor then deletes (Proxmox VE: status/resume; libvirt:
	// starting a domain with a managed save image). A running VM is left
	// as it is (no task). A stopped VM with no saved state is not booted
	// in its place: an error (ClassPermanent, reason NotSuspended), since
	// a caller resuming wants the guest it suspended, not a new boot.
	PowerResume PowerAction = "resume"
)

// VMSummary is one VM as the batch listing shows it.
type VMSummary struct {
	ID    ID
	Node  string
	Name  string
	Power PowerState
	// Template is true for templates (never HyperFleet's VMs).
	Template bool
	// Lock is the hypervisor's config lock, such as "clone", empty if none.
	Lock string
	Tags []string
	// OperatorTagged says the VM carries this install's tag: a candidate
	// for ownership, not a proof.
	OperatorTagged bool
	// InstallNamed says the VM's name is the one this install gives a
	// clone of this VM id until it is configured (ownership.Signer.VMName,
	// keyed by the install's secret): the VM was cloned by this install
	// and has not been configured, so it carries no tag yet. The orphan
	// sweep uses it to find clones whose configuration never happened.
	InstallNamed bool
	// Uptime is how long the VM has run, zero when stopped.
	Uptime time.Duration
}

// VM is one VM read in full, with its ownership checked.
type VM struct {
	VMSummary
	// Owner is the verified owner; nil when the marker does not verify.
	Owner *Owner
	// OwnershipError says why the marker does not verify.
	OwnershipError error
	// CreatedAt is the creation time written in the verified marker.
	CreatedAt time.Time
	// TPM says the VM has a TPM 2.0 (for Proxmox a tpmstate0 of version
	// v2.0), so a claim that attests with one can refuse a VM without.
	TPM bool
}

// SetOwnership records in vm what verifying its ownership marker returned
// (ownership.Signer.Verify): the owner and creation time of the record,
// or err as the reason the marker does not verify. A marker that does not
// verify is part of the VM read, not a failure to read it.
func (vm *VM) SetOwnership(rec ownership.Record, err error) {
	if err != nil {
		vm.OwnershipError = err
		return
	}
	vm.Owner = &Owner{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID, Pool: rec.Pool, CreatedAt: rec.CreatedAt}
	vm.CreatedAt = rec.CreatedAt
}

// Observer receives measurements from a provider; metrics implement it.
// Every method must be cheap and safe for concurrent use.
type Observer interface {
	// APICall reports one hypervisor API call: for an HTTP API, endpoint
	// is the path template (e.g. "/nodes/{node}/qemu/{vmid}/clone") and
	// code the HTTP status; for an RPC API, method the protocol, endpoint
	// the procedure and code 200 for a reply, 500 for an error reply.
	// Code is 0 when no response arrived.
	APICall(method, endpoint string, code int, duration time.Duration)
	// CloneQueue reports how many VMs wait for a clone slot.
	CloneQueue(waiting int)
}

// NopObserver discards measurements.
type NopObserver struct{}

// APICall implements Observer.
func (NopObserver) APICall(string, string, int, time.Duration) {}

// CloneQueue implements Observer.
func (NopObserver) CloneQueue(int) {}

// RenderCloudInit renders spec's cloud-init, treating an unset source as
// empty data.
func RenderCloudInit(ctx context.Context, spec *VMSpec) (CloudInit, error) {
	if spec.CloudInit == nil {
		return CloudInit{}, nil
	}
	return spec.CloudInit.Render(ctx)
}
