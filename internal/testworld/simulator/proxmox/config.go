package proxmoxsim

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Config describes the simulated cluster. It is read from YAML or JSON by
// LoadConfig; field names are the lowerCamel JSON names shown in the README.
type Config struct {
	// ClusterName is reported by /cluster/status.
	ClusterName string `json:"clusterName,omitempty"`
	// Nodes of the cluster. At least one is required.
	Nodes []NodeConfig `json:"nodes"`
	// Storages, with the nodes they are available on.
	Storages []StorageConfig `json:"storages"`
	// Templates are VMs (usually templates) that exist at start-up.
	Templates []TemplateConfig `json:"templates,omitempty"`
	// Users with their passwords, API tokens and privileges.
	Users []UserConfig `json:"users,omitempty"`
	// Pools that exist at start-up.
	Pools []PoolConfig `json:"pools,omitempty"`
	// Latency of the simulated hypervisor work (task durations).
	Latency Latency `json:"latency,omitempty"`
	// Faults injected per endpoint class.
	Faults Faults `json:"faults,omitempty"`
	// Guest configures the guest hook and the addresses the agent reports.
	Guest GuestConfig `json:"guest,omitempty"`
	// AuthFailureDelay delays every 401, as pveproxy does (3s).
	AuthFailureDelay Duration `json:"authFailureDelay,omitempty"`
	// StorageLockTimeout is how long a clone waits for a storage lock (10s).
	StorageLockTimeout Duration `json:"storageLockTimeout,omitempty"`
	// RefreshInterval is the pvestatd sampling period behind
	// /cluster/resources status and stats (10s). Zero samples on every read.
	RefreshInterval Duration `json:"refreshInterval,omitempty"`
	// TicketLifetime is the validity of authentication tickets (2h).
	TicketLifetime Duration `json:"ticketLifetime,omitempty"`
	// Seed makes fault injection and generated MACs reproducible.
	Seed int64 `json:"seed,omitempty"`
	// PVEVersion is the Proxmox VE major version simulated, 8 or 9 (0
	// means 9): it picks the column of pkg/provider/proxmox/privileges
	// whose checks the API enforces, the privileges that exist and the
	// version /version reports.
	PVEVersion int `json:"pveVersion,omitempty"`
}

// NodeConfig is one cluster node.
type NodeConfig struct {
	Name string `json:"name"`
	// CPUs is the number of logical CPUs (maxcpu).
	CPUs int `json:"cpus,omitempty"`
	// Memory is the node's RAM, e.g. "64G".
	Memory ByteSize `json:"memory,omitempty"`
	// MemoryUsed is RAM used by the host itself before any VM runs.
	MemoryUsed ByteSize `json:"memoryUsed,omitempty"`
	// Disk is the root file system size.
	Disk ByteSize `json:"disk,omitempty"`
	// IP is reported by /cluster/status.
	IP string `json:"ip,omitempty"`
	// Offline starts the node unreachable.
	Offline bool `json:"offline,omitempty"`
}

// StorageConfig is one storage definition (storage.cfg entry).
type StorageConfig struct {
	ID string `json:"id"`
	// Type is the plugin type: dir, nfs, cifs, cephfs, btrfs, glusterfs
	// (file based), lvm (thick), lvmthin, zfspool, rbd.
	Type string `json:"type"`
	// Content types, e.g. [images, iso, vztmpl, snippets, import, backup].
	Content []string `json:"content"`
	// Shared storages are one pool visible from every node.
	Shared bool `json:"shared,omitempty"`
	// Capacity is the total size, e.g. "500G".
	Capacity ByteSize `json:"capacity,omitempty"`
	// Nodes restricts the storage to these nodes; empty means all nodes.
	Nodes []string `json:"nodes,omitempty"`
	// Path is the mount point of file-based storages.
	Path string `json:"path,omitempty"`
	// Disabled storages are skipped by the clone and upload paths.
	Disabled bool `json:"disabled,omitempty"`
}

// TemplateConfig is a VM present at start-up.
type TemplateConfig struct {
	VMID int    `json:"vmid"`
	Node string `json:"node"`
	Name string `json:"name"`
	// Storage holds the boot disk (scsi0).
	Storage string `json:"storage"`
	// DiskSize of scsi0, e.g. "32G".
	DiskSize ByteSize `json:"diskSize,omitempty"`
	// Format of the disk on file-based storages (qcow2, raw, vmdk).
	Format      string `json:"format,omitempty"`
	Cores       int    `json:"cores,omitempty"`
	MemoryMiB   int    `json:"memoryMiB,omitempty"`
	Tags        string `json:"tags,omitempty"`
	Description string `json:"description,omitempty"`
	// Agent enables the QEMU guest agent (agent: 1).
	Agent bool `json:"agent,omitempty"`
	// CloudInitStorage, when set, adds ide2: <storage>:cloudinit.
	CloudInitStorage string `json:"cloudInitStorage,omitempty"`
	// NotTemplate makes this a plain VM instead of a template.
	NotTemplate bool `json:"notTemplate,omitempty"`
	// TPMVersion, when set (v2.0 or v1.2), adds tpmstate0 of that version
	// on Storage: an empty 4 MiB state, as if added by qm set --tpmstate0
	// and never started since.
	TPMVersion string `json:"tpmVersion,omitempty"`
	// Extra config keys, written verbatim.
	Config map[string]string `json:"config,omitempty"`
	// GuestImage makes the template a real guest: its clones boot in QEMU
	// (see GuestImage).
	GuestImage *GuestImage `json:"guestImage,omitempty"`
}

// UserConfig is a Proxmox user with optional API tokens.
type UserConfig struct {
	// ID is user@realm.
	ID       string `json:"id"`
	Password string `json:"password,omitempty"`
	// Disabled users cannot log in and their tokens fail.
	Disabled bool `json:"disabled,omitempty"`
	// Expire is a Unix time after which the user is expired (0 = never).
	Expire int64 `json:"expire,omitempty"`
	// Privileges granted to the user (root@pam always has all).
	Privileges Privileges    `json:"privileges,omitempty"`
	Tokens     []TokenConfig `json:"tokens,omitempty"`
}

// TokenConfig is an API token of a user.
type TokenConfig struct {
	// ID is the token name (the part after '!').
	ID     string `json:"id"`
	Secret string `json:"secret"`
	// Expire is a Unix time after which the token is rejected (0 = never).
	Expire int64 `json:"expire,omitempty"`
	// Privsep (default true, as in Proxmox) limits the token to Privileges
	// intersected with the user's; false makes it inherit the user's.
	Privsep *bool `json:"privsep,omitempty"`
	// Privileges of a privilege-separated token.
	Privileges Privileges `json:"privileges,omitempty"`
}

// PoolConfig is a resource pool.
type PoolConfig struct {
	ID      string `json:"id"`
	Comment string `json:"comment,omitempty"`
}

// Latency models how long the hypervisor takes for each kind of work. All
// of it is measured on the simulator's Clock, inside tasks.
type Latency struct {
	// CloneBase is the fixed cost of a clone's disk phase.
	CloneBase Duration `json:"cloneBase,omitempty"`
	// ClonePerGiB is added per GiB of disk for full clones.
	ClonePerGiB Duration `json:"clonePerGiB,omitempty"`
	// ClonePlaceholder is the delay before the new VM's "lock: clone"
	// placeholder config appears.
	ClonePlaceholder Duration `json:"clonePlaceholder,omitempty"`
	Config           Duration `json:"config,omitempty"`
	Resize           Duration `json:"resize,omitempty"`
	Start            Duration `json:"start,omitempty"`
	// Boot is the time from a finished start task until the guest agent
	// answers.
	Boot Duration `json:"boot,omitempty"`
	// GuestStart is the time from a finished start task until the guest
	// program (what stands for cloud-init and the agent in a process
	// guest) runs: a real guest runs them only once it has booted. Zero
	// runs it at once.
	GuestStart Duration `json:"guestStart,omitempty"`
	Stop       Duration `json:"stop,omitempty"`
	Shutdown   Duration `json:"shutdown,omitempty"`
	Destroy    Duration `json:"destroy,omitempty"`
	Upload     Duration `json:"upload,omitempty"`
	// Suspend is the fixed cost of a suspend to disk (allocating the
	// state volume, the config writes, QEMU's quit); SuspendPerGiB is
	// added per GiB of the VM's memory, which savevm writes to that
	// volume.
	Suspend       Duration `json:"suspend,omitempty"`
	SuspendPerGiB Duration `json:"suspendPerGiB,omitempty"`
	// Resume is the fixed cost of resuming a VM suspended to disk (QEMU
	// started with the saved state); ResumePerGiB is added per GiB of
	// memory read back.
	Resume       Duration `json:"resume,omitempty"`
	ResumePerGiB Duration `json:"resumePerGiB,omitempty"`
	// API is latency added to every HTTP response, on the simulator's clock.
	API Duration `json:"api,omitempty"`
}

// ByteSize is a size in bytes that also reads "32G", "512M", "1T" or a
// plain number from configuration files.
type ByteSize int64

// UnmarshalJSON accepts a number of bytes or a string with a K/M/G/T suffix.
func (b *ByteSize) UnmarshalJSON(data []byte) error {
	var n int64
	if err := json.Unmarshal(data, &n); err == nil {
		*b = ByteSize(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("size must be a number or a string like \"32G\": %w", err)
	}
	v, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = ByteSize(v)
	return nil
}

var byteSizeRE = regexp.MustCompile(`^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?$`)

func parseByteSize(s string) (int64, error) {
	m := byteSizeRE.FindStringSubmatch(strings.ToUpper(strings.TrimSpace(s)))
	if m == nil {
		return 0, fmt.Errorf("invalid size %q: use a number of bytes or a suffix K, M, G or T", s)
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, err)
	}
	mult := map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m[2]]
	return int64(f * mult), nil
}

// Duration is a time.Duration that reads "5s"/"100ms" strings or a number
// of seconds from configuration files.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes the duration as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON accepts "1m30s" style strings or a number of seconds.
func (d *Duration) UnmarshalJSON(data []byte) error {
	var f float64
	if err := json.Unmarshal(data, &f); err == nil {
		*d = Duration(f * float64(time.Second))
		return nil
	}
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("duration must be a string like \"5s\" or a number of seconds: %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: %w", s, err)
	}
	*d = Duration(v)
	return nil
}

// DefaultConfig returns a one-node cluster with the timings of a real
// Proxmox VE installation: 3s 401 delay, 2h tickets and the realistic
// timing preset (10s status refresh, 10s storage lock wait, a clone/boot
// latency model close to a small LVM-thin host; see Preset). Tests usually
// start from it and zero the delays.
func DefaultConfig() Config {
	c := Config{
		ClusterName: "hyperfleet-sim",
		Nodes: []NodeConfig{{
			Name: "pve1", CPUs: 16, Memory: 64 << 30, MemoryUsed: 2 << 30, Disk: 100 << 30, IP: "192.0.2.11",
		}},
		Storages: []StorageConfig{
			{ID: "local", Type: "dir", Content: []string{"iso", "vztmpl", "backup", "snippets", "import"}, Capacity: 100 << 30, Path: "/var/lib/vz"},
			{ID: "local-lvm", Type: "lvmthin", Content: []string{"images", "rootdir"}, Capacity: 500 << 30},
		},
		Templates: []TemplateConfig{{
			VMID: 9000, Node: "pve1", Name: "debian-12-ci", Storage: "local-lvm", DiskSize: 32 << 30,
			Cores: 2, MemoryMiB: 2048, Agent: true, CloudInitStorage: "local-lvm", Tags: "template",
		}},
		Users: []UserConfig{{
			ID: "root@pam", Password: "root",
			Tokens: []TokenConfig{{ID: "sim", Secret: "00000000-0000-0000-0000-000000000000", Privsep: boolPtr(false)}},
		}},
		Guest:            GuestConfig{AddressRange: "10.99.0.10-10.99.0.250", Prefix: 24},
		AuthFailureDelay: Duration(3 * time.Second),
		TicketLifetime:   Duration(2 * time.Hour),
		Seed:             1,
	}
	c.ApplyTimings(presets[PresetRealistic])
	return c
}

func boolPtr(b bool) *bool { return &b }

// LoadConfig reads a YAML or JSON file. Top-level fields it sets replace
// those of DefaultConfig (lists are replaced, not merged), so a file that
// only sets latency keeps the default node, storages and users.
func LoadConfig(path string) (Config, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read simulator config %s: %w", path, err)
	}
	cfg := DefaultConfig()
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("parse simulator config %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("simulator config %s: %w", path, err)
	}
	return cfg, nil
}

var storageTypes = map[string]bool{
	"dir": true, "nfs": true, "cifs": true, "cephfs": true, "btrfs": true, "glusterfs": true,
	"lvm": true, "lvmthin": true, "zfspool": true, "rbd": true,
}

// Validate reports the first inconsistency in the configuration.
func (c *Config) Validate() error {
	if len(c.Nodes) == 0 {
		return fmt.Errorf("at least one node is required")
	}
	nodes := map[string]bool{}
	for _, n := range c.Nodes {
		if !dnsNameRE.MatchString(n.Name) {
			return fmt.Errorf("node name %q is not a DNS name", n.Name)
		}
		if nodes[n.Name] {
			return fmt.Errorf("node %q is defined twice", n.Name)
		}
		nodes[n.Name] = true
	}
	storages := map[string]StorageConfig{}
	for _, s := range c.Storages {
		if !storageIDRE.MatchString(s.ID) {
			return fmt.Errorf("storage id %q is invalid", s.ID)
		}
		if !storageTypes[s.Type] {
			return fmt.Errorf("storage %q: unknown type %q", s.ID, s.Type)
		}
		if _, dup := storages[s.ID]; dup {
			return fmt.Errorf("storage %q is defined twice", s.ID)
		}
		for _, n := range s.Nodes {
			if !nodes[n] {
				return fmt.Errorf("storage %q names unknown node %q", s.ID, n)
			}
		}
		storages[s.ID] = s
	}
	vmids := map[int]bool{}
	for _, t := range c.Templates {
		if t.VMID < minVMID || t.VMID > maxVMID {
			return fmt.Errorf("template %d: vmid out of range %d..%d", t.VMID, minVMID, maxVMID)
		}
		if vmids[t.VMID] {
			return fmt.Errorf("template %d is defined twice", t.VMID)
		}
		vmids[t.VMID] = true
		if !nodes[t.Node] {
			return fmt.Errorf("template %d: unknown node %q", t.VMID, t.Node)
		}
		if _, ok := storages[t.Storage]; !ok {
			return fmt.Errorf("template %d: unknown storage %q", t.VMID, t.Storage)
		}
		if t.CloudInitStorage != "" {
			if _, ok := storages[t.CloudInitStorage]; !ok {
				return fmt.Errorf("template %d: unknown cloud-init storage %q", t.VMID, t.CloudInitStorage)
			}
		}
		if t.TPMVersion != "" && t.TPMVersion != tpmV12 && t.TPMVersion != tpmV20 {
			return fmt.Errorf("template %d: tpmVersion %q is not v1.2 or v2.0", t.VMID, t.TPMVersion)
		}
		if t.Name != "" && !dnsNameRE.MatchString(t.Name) {
			return fmt.Errorf("template %d: name %q is not a DNS name", t.VMID, t.Name)
		}
		if t.GuestImage != nil {
			if err := t.GuestImage.validate(); err != nil {
				return fmt.Errorf("template %d: %w", t.VMID, err)
			}
		}
	}
	if c.PVEVersion != 0 && c.PVEVersion != 8 && c.PVEVersion != 9 {
		return fmt.Errorf("pveVersion %d: the simulator models Proxmox VE 8 and 9", c.PVEVersion)
	}
	for _, u := range c.Users {
		if !userIDRE.MatchString(u.ID) {
			return fmt.Errorf("user id %q must be user@realm", u.ID)
		}
		for _, t := range u.Tokens {
			if !tokenNameRE.MatchString(t.ID) {
				return fmt.Errorf("user %s: invalid token id %q", u.ID, t.ID)
			}
		}
	}
	if _, _, err := parseAddressRange(c.Guest.AddressRange); c.Guest.AddressRange != "" && err != nil {
		return fmt.Errorf("guest.addressRange: %w", err)
	}
	return c.Faults.validate()
}
