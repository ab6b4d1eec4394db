// Package proxmox implements provider.Provider for Proxmox VE on
// github.com/luthermonson/go-proxmox and the raw API, one step per call:
// place, clone with the ownership marker, upload the NoCloud ISO, configure
// and then resize or start, wait for the guest agent's addresses, eject and
// delete the ISO.
//
// # Never block
//
// Nothing here waits for a Proxmox task. A call that starts one returns its
// UPID in the Progress; the next call reads the task's status once and
// moves on. go-proxmox's Task.Wait is not used: it sleeps ignoring the
// context and counts "WARNINGS: N" (a success) as a failure.
//
// # Creating a VM, one hypervisor operation per EnsureVM call
//
//	place      pick a VM id and a node, reserve them in-process (no API write)
//	clone      POST .../qemu/{template}/clone with the signed ownership marker
//	upload     POST .../storage/{iso}/upload of the NoCloud ISO
//	configure  PUT .../qemu/{vmid}/config: cores, memory, net0, ISO, tags,
//	           followed in the same call by resize or start
//	resize     PUT .../qemu/{vmid}/resize, only when the disk must grow
//	start      POST .../status/start
//	boot       poll the guest agent until it reports addresses
//	eject      PUT .../config <slot>=none,media=cdrom, followed in the same
//	           call by DELETE .../storage/{iso}/content/{volid}; Running
//
// A step that needs no answer before the next (a synchronous config update,
// the ISO's deletion after its eject) is not a call of its own: each round
// trip through the caller is a status write on the API server and a wait for
// its watch event (docs/performance.md, calls per job). The ISO deletion's
// task is followed by DeleteVM, before the VM goes.
//
// After a restart (a Progress without a task) the step is read back from the
// hypervisor; see derive in ensure.go. Within one process, a VM placed and
// not cloned yet is cloned without reading its id back first.
//
// # Ownership
//
// The clone call writes the ownership block into the description, for the
// new VM id, so the VM is marked from its first moment. Every later write,
// and every destructive call, first re-reads the config and verifies the
// block for the caller's owner (claim UID); a VM that does not verify is
// never modified.
package proxmox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	proxmox "github.com/luthermonson/go-proxmox"
	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/cloneslots"
	"github.com/hyperfleet/hyperfleet/pkg/provider/pace"
)

// inflight is a task this process started for an owner's VM.
type inflight struct {
	owner string
	task  provider.Task
}

// Limits of the Proxmox VM id space.
const (
	minVMID = 100
	maxVMID = 999999999
)

// Defaults and in-process timings.
const (
	defaultRequestTimeout = 30 * time.Second
	// viewTTL is how long a /cluster/resources read serves placement. The
	// controllers' poll (ListVMs, every 5 s by default) refreshes it;
	// Proxmox itself refreshes that listing only every 10 s, so an older
	// view loses nothing, and reservations and "already exists" retries
	// cover what it cannot show yet.
	viewTTL = 10 * time.Second
	// templateTTL is how long a template's config is cached.
	templateTTL = 5 * time.Minute
	// reservationTTL drops a placement nobody has called about for long.
	reservationTTL = 30 * time.Minute
	// blockedTTL is how long a VM id found taken by someone else is
	// skipped even if a listing misses it.
	blockedTTL = 10 * time.Minute
	// queueTTL forgets a queued VM that stopped asking for a clone slot,
	// and a slot held at placement whose clone request has not come.
	queueTTL = 30 * time.Second
)

// Provider is a provider.Provider for one Proxmox VE cluster. It is safe for
// concurrent use.
type Provider struct {
	cfg provider.ClusterConfig
	// signer is bound to the HypervisorCluster's name; it names the
	// install (tags, ISO names). Blocks are written and verified with
	// bound, which adds the Proxmox cluster's own name (see marker).
	signer   *ownership.Signer
	bound    atomic.Pointer[ownership.Signer]
	obs      provider.Observer
	clock    clock.PassiveClock
	log      logr.Logger
	api      *api
	insecure bool
	// isoStorage receives the cloud-init ISOs (ClusterSettings).
	isoStorage string
	// wake tells the caller about queued VMs that may go on (Deps.Wake).
	wake func(provider.Owner)
	// slots are the clone slots (ClonesPerNode, ClonesPerStorage), each
	// counted against its node and its storages' keys (storageKey); they
	// have their own lock.
	slots *cloneslots.Slots
	// pace knows how long each kind of task typically takes here, for
	// when to look at one again (pkg/provider/pace).
	pace pace.Tasks

	// groups are the firewall security groups of isolation policies
	// known whole (firewall.go); they have their own lock, held across
	// the calls that build one.
	groups firewallGroups

	// mu guards the in-process state below. It is never held during an
	// API call.
	mu sync.Mutex
	// leased are the VMs' leased addresses already in their ipfilter
	// IPSet, by "<vmid>/<addresses>" (allowLeased).
	leased map[string]bool
	// view is the latest /cluster/resources read used for placement;
	// listed are the ids of the latest VM listing, taken at listedAt; freed
	// are ids whose VM this process saw deleted, and when.
	view     *clusterView
	listed   map[int]bool
	listedAt time.Time
	freed    map[int]time.Time
	// templates caches template configs by id.
	templates map[int]*templateInfo
	// reservations are in-flight placements by owner UID; reservedIDs
	// indexes them by VM id.
	reservations map[string]*reservation
	reservedIDs  map[int]string
	// reservedMem sums the reservations' memory per node.
	reservedMem map[string]int64
	// reservedDisk sums, per storage (storageKey), the disk space of full
	// clones placed but not yet running: the storage's usage does not
	// show them until their copy is written.
	reservedDisk map[string]int64
	// devices are the PCI mappings and the devices this install's VMs
	// hold (devices.go).
	devices deviceState
	// swept is when expired reservations were last dropped.
	swept time.Time
	// blocked are VM ids found taken by VMs this install does not own.
	blocked map[int]time.Time
	// cursor is where the next VM id search starts.
	cursor int
	// atCap are the owners refused a placement by cfg.MaxMachines, by UID;
	// they are woken (Deps.Wake) when one of this install's VMs is deleted.
	atCap map[string]provider.Owner
	// backoff is the retry state after lock timeouts, by VM id.
	backoff map[int]*backoffState
	// inflight are the tasks this process started, by VM id, until it sees
	// them finish.
	inflight map[int]inflight
	// isoGone are VM ids whose ISO this process has deleted.
	isoGone map[int]bool
	// pveMajor is the cluster's Proxmox VE major version, read at
	// pveMajorAt (majorVersion).
	pveMajor   int
	pveMajorAt time.Time
	// mediaTasks are the deletions of stray cloud-init ISOs this process
	// started, by volume id, until it sees the file gone.
	mediaTasks map[string]provider.Task
}

var _ provider.Provider = (*Provider)(nil)

// Factory builds Proxmox providers.
var Factory = provider.FactoryFunc(func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
	p, err := New(cfg, deps)
	if err != nil {
		return nil, err
	}
	return p, nil
})

// New validates cfg and returns a Provider. It makes no API call; Probe
// checks the connection and the credentials.
func New(cfg provider.ClusterConfig, deps provider.Deps) (*Provider, error) {
	wrap := func(err error) error {
		return provider.Errorf(provider.ClassConfiguration, "InvalidConfiguration", "hypervisor cluster %q: %w", cfg.Name, err)
	}
	if deps.Signer == nil {
		return nil, fmt.Errorf("hypervisor cluster %q: deps.Signer is required", cfg.Name)
	}
	base, err := url.Parse(strings.TrimRight(cfg.Endpoint, "/"))
	// Plain http is refused: every request carries the API token or the
	// ticket (docs/security.md). No test world needs it (the simulators
	// serve TLS), so there is no option to allow it.
	if err != nil || base.Scheme != "https" || base.Host == "" {
		return nil, wrap(fmt.Errorf("endpoint %q must be an https:// URL with a host, such as https://pve.example.com:8006/api2/json", cfg.Endpoint))
	}
	if base.Path == "" {
		base.Path = "/api2/json"
	}
	switch {
	case cfg.TokenID != "":
		if !strings.Contains(cfg.TokenID, "!") || !strings.Contains(cfg.TokenID, "@") {
			return nil, wrap(fmt.Errorf("credentials.tokenID %q must look like user@realm!tokenname", cfg.TokenID))
		}
		if cfg.TokenSecret == "" {
			return nil, wrap(errors.New("credentials.tokenSecret is empty"))
		}
	case cfg.Username != "":
		if cfg.Password == "" {
			return nil, wrap(errors.New("credentials.password is empty"))
		}
	default:
		return nil, wrap(errors.New("credentials: set tokenID and tokenSecret, or username and password"))
	}
	tc, insecure, err := tlsConfig(cfg)
	if err != nil {
		return nil, wrap(err)
	}
	clk := deps.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	clientCert, err := clientCertificate(cfg, clk.Now())
	if err != nil {
		return nil, err
	}
	if clientCert != nil {
		tc.GetClientCertificate = presentAlways(clientCert)
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = defaultRequestTimeout
	}
	if cfg.VMIDStart == 0 && cfg.VMIDEnd == 0 {
		cfg.VMIDStart, cfg.VMIDEnd = minVMID, maxVMID
	}
	if cfg.VMIDStart < minVMID || cfg.VMIDEnd > maxVMID || cfg.VMIDStart > cfg.VMIDEnd {
		return nil, wrap(fmt.Errorf("vmidRange %d-%d must lie within %d-%d with start <= end", cfg.VMIDStart, cfg.VMIDEnd, minVMID, maxVMID))
	}
	settings, err := clusterSettings(cfg)
	if err != nil {
		return nil, wrap(err)
	}
	for _, t := range cfg.Tags {
		if !tagRE.MatchString(strings.ToLower(t)) {
			return nil, wrap(fmt.Errorf("tags: %q is not a legal Proxmox tag (letters, digits, _ - + . only)", t))
		}
	}
	cfg.Nodes = append([]string(nil), cfg.Nodes...)
	cfg.Tags = append([]string(nil), cfg.Tags...)
	cfg.CABundle = append([]byte(nil), cfg.CABundle...)
	cfg.ClientCertificate = append([]byte(nil), cfg.ClientCertificate...)
	cfg.ClientKey = append([]byte(nil), cfg.ClientKey...)

	obs := deps.Observer
	if obs == nil {
		obs = provider.NopObserver{}
	}
	// pveproxy speaks HTTP/1.1 and closes the connection after errors;
	// keep a few idle connections per cluster for the polling.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	tr.ForceAttemptHTTP2 = false
	tr.MaxIdleConnsPerHost = 8
	inst := &instrumented{next: tr, basePath: base.Path, obs: obs}
	auth := &authenticator{next: inst, loginURL: base.String() + "/access/ticket", endpoint: base, clock: clk}
	if cfg.TokenID != "" {
		auth.token = cfg.TokenID + "=" + cfg.TokenSecret
	} else {
		auth.username, auth.password = cfg.Username, cfg.Password
	}
	hc := &http.Client{Transport: auth, CheckRedirect: refuseRedirect}
	// go-proxmox gets no credentials: the authenticator adds them, so that
	// ticket renewal follows the injected clock and the cloud-init upload
	// (done without go-proxmox, whose upload ignores the context) is
	// authenticated the same way.
	px := proxmox.NewClient(base.String(), proxmox.WithHTTPClient(hc), proxmox.WithUserAgent("hyperfleet"))
	slots := cloneslots.New(cloneslots.Config{PerNode: cfg.ClonesPerNode, PerStorage: cfg.ClonesPerStorage,
		Lapse: queueTTL, Now: clk.Now, Wake: deps.Wake, Observe: obs.CloneQueue})
	return &Provider{
		cfg: cfg, isoStorage: settings.ISOStorage, signer: deps.Signer.ForCluster(ownership.ClusterIdentity{Name: cfg.Name}), obs: obs, clock: clk, log: deps.Log, insecure: insecure, wake: deps.Wake, slots: slots,
		api:          &api{px: px, http: hc, baseURL: base.String(), basePath: base.Path, timeout: cfg.RequestTimeout},
		templates:    map[int]*templateInfo{},
		reservations: map[string]*reservation{},
		reservedIDs:  map[int]string{},
		reservedMem:  map[string]int64{},
		reservedDisk: map[string]int64{},
		blocked:      map[int]time.Time{},
		freed:        map[int]time.Time{},
		atCap:        map[string]provider.Owner{},
		cursor:       cfg.VMIDStart,
		backoff:      map[int]*backoffState{},
		inflight:     map[int]inflight{},
		isoGone:      map[int]bool{},
	}, nil
}

// marker returns the signer that writes and verifies ownership blocks on
// this cluster: bound to the HypervisorCluster's name and to the Proxmox
// cluster's own name, read once from /cluster/status. A block copied from
// a VM of another Proxmox cluster therefore never verifies here, even
// under the same HypervisorCluster name (docs/security.md).
func (p *Provider) marker(ctx context.Context) (*ownership.Signer, error) {
	if s := p.bound.Load(); s != nil {
		return s, nil
	}
	name, err := p.hypervisorName(ctx)
	if err != nil {
		return nil, err
	}
	p.bound.CompareAndSwap(nil, p.signer.ForCluster(ownership.ClusterIdentity{Name: p.cfg.Name, HypervisorName: name}))
	return p.bound.Load(), nil
}

// clusterStatusEntry is one entry of GET /cluster/status.
type clusterStatusEntry struct {
	Type  string `json:"type"`
	Name  string `json:"name"`
	Local int    `json:"local"`
}

// hypervisorName is the Proxmox cluster's name, or "node/<name>" for a
// standalone node (its /cluster/status has no cluster entry).
func (p *Provider) hypervisorName(ctx context.Context) (string, error) {
	var entries []clusterStatusEntry
	if err := p.api.call(ctx, http.MethodGet, "/cluster/status", nil, nil, &entries); err != nil {
		return "", fmt.Errorf("read the name of cluster %q (GET /cluster/status, which needs Sys.Audit on /; ownership markers are bound to it): %w", p.cfg.Name, err)
	}
	local := ""
	for _, e := range entries {
		switch {
		case e.Type == "cluster" && e.Name != "":
			return e.Name, nil
		case e.Type == "node" && (e.Local == 1 || len(entries) == 1):
			local = e.Name
		}
	}
	if local == "" {
		return "", provider.Errorf(provider.ClassTransient, "NoClusterName", "cluster %q: /cluster/status names neither a cluster nor the local node", p.cfg.Name)
	}
	return "node/" + local, nil
}

// allowed reports whether node may receive VMs.
func (p *Provider) allowed(node string) bool {
	if len(p.cfg.Nodes) == 0 {
		return true
	}
	for _, n := range p.cfg.Nodes {
		if n == node {
			return true
		}
	}
	return false
}
