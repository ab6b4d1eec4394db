package fake

import (
	"container/heap"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

const (
	minVMID = 100
	maxVMID = 999999999

	// maxDescription is Proxmox's description limit.
	maxDescription = 8192
)

var (
	// tagRE is Proxmox's tag syntax, matched case-insensitively.
	tagRE = regexp.MustCompile(`^(?i)[a-z0-9_][a-z0-9_\-+.]*$`)
	// dnsNameRE is Proxmox's dns-name format.
	dnsNameRE = regexp.MustCompile(`^(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]*[a-zA-Z0-9])\.)*(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9\-]*[A-Za-z0-9])$`)
	// fileNameRE is what Proxmox keeps of an uploaded file's name.
	fileNameRE = regexp.MustCompile(`[^a-zA-Z0-9_.\-]`)
)

// hypervisor is the simulated cluster every Provider instance made by
// Restart or Connect shares. All fields are guarded by mu.
type hypervisor struct {
	mu    sync.Mutex
	clock clock.PassiveClock
	o     Options

	nodes      map[string]*hvNode
	nodeOrder  []string
	storages   map[string]*Storage
	storeOrder []string
	pools      map[string]bool
	vms        map[int]*hvVM
	tasks      map[string]*hvTask
	volumes    map[string]*hvVolume
	events     eventHeap
	seq        uint64
	pid        int
	macSeq     int

	sample     map[int]vmSample
	nextSample time.Time

	addrNext int
	addrByVM map[int]int
	addrUsed map[int]bool

	delivered map[int]provider.CloudInit

	calls      map[Method]int
	opCalls    map[Op]int
	failMethod map[Method][]error
	failOp     map[Op][]error
	failTask   map[Op][]string
}

type hvNode struct {
	Node
	bootTime time.Time
}

type hvNet struct {
	model  string
	mac    string // as stored: upper-case
	bridge string
	vlan   int
}

// hvVM is one VM's config and run state. cdrom is the drive the provider
// attaches its cloud-init ISO to ("" = no such drive, "none" = empty drive,
// else a volume id); templates never have it.
type hvVM struct {
	vmid        int
	node        string
	name        string
	template    bool
	lock        string
	description string
	tags        []string
	cores       int
	memory      int64
	disk        int64
	diskStorage string
	linked      bool
	agent       bool
	net         hvNet
	cdrom       string
	pool        string

	running   bool
	startedAt time.Time
	agentUp   bool
	bootGen   int
}

type hvTask struct {
	upid    string
	node    string
	running bool
	exit    string
}

type hvVolume struct {
	storage string
	scope   string // node for local storages, "" for shared
	volid   string
	payload provider.CloudInit
}

type vmSample struct {
	name     string
	running  bool
	template bool
	uptime   time.Duration
}

// event is a timed effect: a task's end, a guest agent coming up.
type event struct {
	at  time.Time
	seq uint64
	fn  func(at time.Time)
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// apiError is an error as the Proxmox API reports it: an HTTP status and a
// message.
type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.code, e.msg) }

func serverErr(format string, args ...any) *apiError {
	return &apiError{code: 500, msg: fmt.Sprintf(format, args...)}
}

func paramErr(param, msg string) *apiError {
	return &apiError{code: 400, msg: fmt.Sprintf("Parameter verification failed. (%s: %s)", param, msg)}
}

func noConfig(node string, vmid int) *apiError {
	return serverErr("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", node, vmid)
}

func newHypervisor(c clock.PassiveClock, o Options) (*hypervisor, error) {
	now := c.Now()
	h := &hypervisor{
		clock: c, o: o,
		nodes: map[string]*hvNode{}, storages: map[string]*Storage{}, pools: map[string]bool{},
		vms: map[int]*hvVM{}, tasks: map[string]*hvTask{}, volumes: map[string]*hvVolume{},
		addrByVM: map[int]int{}, addrUsed: map[int]bool{}, delivered: map[int]provider.CloudInit{},
		calls: map[Method]int{}, opCalls: map[Op]int{}, failMethod: map[Method][]error{}, failOp: map[Op][]error{}, failTask: map[Op][]string{},
	}
	if len(o.Nodes) == 0 {
		return nil, fmt.Errorf("fake cluster: at least one node is needed")
	}
	for _, n := range o.Nodes {
		if !dnsNameRE.MatchString(n.Name) || strings.Contains(n.Name, ".") {
			return nil, fmt.Errorf("fake cluster: node name %q is not a valid node name", n.Name)
		}
		if h.nodes[n.Name] != nil {
			return nil, fmt.Errorf("fake cluster: node %q appears twice", n.Name)
		}
		h.nodes[n.Name] = &hvNode{Node: n, bootTime: now.Add(-24 * time.Hour)}
		h.nodeOrder = append(h.nodeOrder, n.Name)
	}
	for _, s := range o.Storages {
		if h.storages[s.ID] != nil {
			return nil, fmt.Errorf("fake cluster: storage %q appears twice", s.ID)
		}
		s.Content = append([]string(nil), s.Content...)
		s.Nodes = append([]string(nil), s.Nodes...)
		h.storages[s.ID] = &s
		h.storeOrder = append(h.storeOrder, s.ID)
	}
	for _, p := range o.Pools {
		h.pools[p] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range o.Templates {
		if err := h.addTemplateLocked(t); err != nil {
			return nil, err
		}
	}
	h.takeSampleLocked(now)
	return h, nil
}

// settleLocked applies every event due by now, in order, and takes the
// status samples that fell due in between.
func (h *hypervisor) settleLocked() {
	now := h.clock.Now()
	refresh := h.o.RefreshInterval
	for {
		var next *event
		if len(h.events) > 0 {
			next = h.events[0]
		}
		if refresh > 0 && !h.nextSample.After(now) && (next == nil || next.at.After(h.nextSample)) {
			// Nothing happens between this boundary and the next event
			// (or now): only the last such boundary's sample matters.
			limit := now
			if next != nil && next.at.Before(limit) {
				limit = next.at
			}
			at := h.nextSample.Add(limit.Sub(h.nextSample) / refresh * refresh)
			if next != nil && !at.Before(next.at) {
				at = at.Add(-refresh)
			}
			h.takeSampleLocked(at)
			continue
		}
		if next == nil || next.at.After(now) {
			break
		}
		heap.Pop(&h.events)
		next.fn(next.at)
	}
	if refresh <= 0 {
		h.takeSampleLocked(now)
	}
}

func (h *hypervisor) takeSampleLocked(at time.Time) {
	s := make(map[int]vmSample, len(h.vms))
	for id, v := range h.vms {
		if v.lock == "clone" || v.lock == "destroyed" {
			continue // placeholders have no full config; the sampler skips them
		}
		smp := vmSample{name: v.name, running: v.running, template: v.template}
		if v.running {
			smp.uptime = at.Sub(v.startedAt).Truncate(time.Second)
		}
		s[id] = smp
	}
	h.sample = s
	if h.o.RefreshInterval > 0 {
		h.nextSample = at.Add(h.o.RefreshInterval)
	}
}

// afterLocked schedules fn d from now.
func (h *hypervisor) afterLocked(d time.Duration, fn func(at time.Time)) {
	h.atLocked(h.clock.Now().Add(d), fn)
}

// atLocked schedules fn at a point in time; effects of an event that
// schedule more run relative to the event's own time, not to now.
func (h *hypervisor) atLocked(at time.Time, fn func(at time.Time)) {
	h.seq++
	heap.Push(&h.events, &event{at: at, seq: h.seq, fn: fn})
}

// newTaskLocked starts a worker task and returns its UPID, formatted as
// Proxmox does (trailing colon included).
func (h *hypervisor) newTaskLocked(node, typ, id, user string) *hvTask {
	now := h.clock.Now()
	h.pid++
	n := h.nodes[node]
	pstart := int64(now.Sub(n.bootTime)/(10*time.Millisecond)) + int64(h.pid)
	t := &hvTask{node: node, running: true}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", node, h.pid, pstart, now.Unix(), typ, id, user)
	h.tasks[t.upid] = t
	return t
}

// runTaskLocked starts a worker task that ends d from now by running work
// (its error is the task's exit status), or, when a failure is queued for
// op, by running undo and failing with the queued exit status.
func (h *hypervisor) runTaskLocked(op Op, node, typ, id, user string, d time.Duration, work func(at time.Time) error, undo func()) string {
	t := h.newTaskLocked(node, typ, id, user)
	if exit, failed := popFail(h.failTask, op); failed {
		h.afterLocked(d, func(time.Time) {
			if undo != nil {
				undo()
			}
			t.finish(errors.New(exit))
		})
		return t.upid
	}
	h.afterLocked(d, func(at time.Time) { t.finish(work(at)) })
	return t.upid
}

func (t *hvTask) finish(err error) {
	if !t.running {
		return
	}
	t.running = false
	if err != nil {
		t.exit = err.Error()
		return
	}
	t.exit = "OK"
}

func (h *hypervisor) addTemplateLocked(t Template) error {
	if t.VMID < minVMID || t.VMID > maxVMID {
		return fmt.Errorf("fake cluster: template id %d out of range", t.VMID)
	}
	if h.vms[t.VMID] != nil {
		return fmt.Errorf("fake cluster: VM %d already exists", t.VMID)
	}
	if h.nodes[t.Node] == nil {
		return fmt.Errorf("fake cluster: template %d: no node %q", t.VMID, t.Node)
	}
	st := h.storages[t.Storage]
	if st == nil || !st.has("images") || !st.availableOn(t.Node) {
		return fmt.Errorf("fake cluster: template %d: storage %q does not hold images on node %q", t.VMID, t.Storage, t.Node)
	}
	if t.Name != "" && !dnsNameRE.MatchString(t.Name) {
		return fmt.Errorf("fake cluster: template %d: name %q is not a DNS name", t.VMID, t.Name)
	}
	tags, err := normalizeTags(t.Tags)
	if err != nil {
		return fmt.Errorf("fake cluster: template %d: %w", t.VMID, err)
	}
	model, bridge := t.NetModel, t.Bridge
	if model == "" {
		model = "virtio"
	}
	if bridge == "" {
		bridge = "vmbr0"
	}
	cores, mem := t.Cores, t.MemoryBytes
	if cores == 0 {
		cores = 1
	}
	if mem == 0 {
		mem = 512 << 20
	}
	h.vms[t.VMID] = &hvVM{
		vmid: t.VMID, node: t.Node, name: t.Name, template: true, description: t.Description, tags: tags,
		cores: cores, memory: mem, disk: t.DiskBytes, diskStorage: t.Storage, agent: !t.NoAgent,
		net: hvNet{model: model, mac: h.newMACLocked(), bridge: bridge},
	}
	return nil
}

func (h *hypervisor) newMACLocked() string {
	h.macSeq++
	return fmt.Sprintf("BC:24:11:%02X:%02X:%02X", h.macSeq>>16&0xff, h.macSeq>>8&0xff, h.macSeq&0xff)
}

// allocateAddressLocked gives a VM a guest IPv4 address for its life, from
// 10.99.0.10-250 like the Proxmox simulator; "" when the range is used up.
func (h *hypervisor) allocateAddressLocked(vmid int) string {
	if a, ok := h.addrByVM[vmid]; ok {
		return addrString(a)
	}
	for i := 0; i < 241; i++ {
		a := 10 + (h.addrNext+i)%241
		if !h.addrUsed[a] {
			h.addrUsed[a] = true
			h.addrByVM[vmid] = a
			h.addrNext = a - 10 + 1
			return addrString(a)
		}
	}
	return ""
}

func addrString(a int) string { return fmt.Sprintf("10.99.0.%d", a) }

func (h *hypervisor) releaseAddressLocked(vmid int) {
	if a, ok := h.addrByVM[vmid]; ok {
		delete(h.addrUsed, a)
		delete(h.addrByVM, vmid)
	}
}

func (h *hypervisor) memUsedLocked(n *hvNode) int64 {
	used := n.BaseMemoryUsedBytes
	for _, v := range h.vms {
		if v.node == n.Name && v.running {
			used += v.memory
		}
	}
	return used
}

func (h *hypervisor) powerOffLocked(v *hvVM) {
	v.running, v.agentUp = false, false
	v.bootGen++
}

func (h *hypervisor) sortedVMIDsLocked() []int {
	ids := make([]int, 0, len(h.vms))
	for id := range h.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

func (s *Storage) has(content string) bool {
	for _, c := range s.Content {
		if c == content {
			return true
		}
	}
	return false
}

func (s *Storage) availableOn(node string) bool {
	if len(s.Nodes) == 0 {
		return true
	}
	for _, n := range s.Nodes {
		if n == node {
			return true
		}
	}
	return false
}

func (s *Storage) fileBased() bool {
	switch s.Type {
	case "dir", "nfs", "cifs", "cephfs", "btrfs", "glusterfs":
		return true
	}
	return false
}

func (s *Storage) linkedClones() bool { return s.Type != "lvm" }

func (s *Storage) scope(node string) string {
	if s.Shared {
		return ""
	}
	return node
}

func volumeKey(scope, volid string) string { return scope + "/" + volid }

// normalizeTags validates tags and returns them the way Proxmox stores
// them: lower-cased, sorted, de-duplicated.
func normalizeTags(tags []string) ([]string, error) {
	seen := map[string]bool{}
	out := []string{}
	for _, t := range tags {
		t = strings.TrimSpace(t)
		if t == "" {
			continue
		}
		if !tagRE.MatchString(t) {
			return nil, fmt.Errorf("tag %q: invalid format - invalid characters in tag", t)
		}
		lt := strings.ToLower(t)
		if !seen[lt] {
			seen[lt] = true
			out = append(out, lt)
		}
	}
	sort.Strings(out)
	return out, nil
}
