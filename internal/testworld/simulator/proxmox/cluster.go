package proxmoxsim

import (
	"crypto/sha256"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Versions reported by /version and node status (a PVE 9 installation, the
// release the reference was read from).
const (
	pveVersion  = "9.0.11"
	pveRelease  = "9.0"
	pve8Version = "8.4.14"
	pve8Release = "8.4"
	pveRepoID   = "3bf5476b8a4699e2"
	kernelVer   = "Linux 6.14.11-4-pve #1 SMP PREEMPT_DYNAMIC PMX 6.14.11-4 (2025-10-10T08:04Z)"
)

type node struct {
	name        string
	cpus        int
	memTotal    int64
	memBase     int64
	disk        int64
	ip          string
	online      bool
	bootTime    time.Time
	fingerprint string
}

func (s *Simulator) initNodes(now time.Time) {
	for i, nc := range s.cfg.Nodes {
		n := &node{
			name: nc.Name, cpus: nc.CPUs, memTotal: int64(nc.Memory), memBase: int64(nc.MemoryUsed),
			disk: int64(nc.Disk), ip: nc.IP, online: !nc.Offline,
			// Nodes have been up for a while: a day plus a little per node.
			bootTime:    now.Add(-24*time.Hour - time.Duration(i)*time.Hour),
			fingerprint: fakeFingerprint(nc.Name),
		}
		if n.cpus == 0 {
			n.cpus = 8
		}
		if n.memTotal == 0 {
			n.memTotal = 32 << 30
		}
		if n.disk == 0 {
			n.disk = 100 << 30
		}
		if n.ip == "" {
			n.ip = fmt.Sprintf("192.0.2.%d", 11+i)
		}
		s.nodes[n.name] = n
		s.nodeOrder = append(s.nodeOrder, n.name)
	}
}

// fakeFingerprint gives each node a stable SHA-256 style fingerprint until
// SetFingerprint installs the one of the certificate actually served.
func fakeFingerprint(name string) string {
	return FormatFingerprint(sha256.Sum256([]byte("pve-ssl:" + name)))
}

// FormatFingerprint renders a SHA-256 digest as Proxmox shows it:
// upper-case hex pairs joined by colons.
func FormatFingerprint(sum [32]byte) string {
	parts := make([]string, len(sum))
	for i, b := range sum {
		parts[i] = fmt.Sprintf("%02X", b)
	}
	return strings.Join(parts, ":")
}

// SetFingerprint sets the ssl_fingerprint GET /nodes reports for every node
// (the standalone binary serves all nodes with one certificate).
func (s *Simulator) SetFingerprint(fp string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.nodes {
		n.fingerprint = fp
	}
}

// SetNodeOnline marks a node reachable or not. Requests routed to an
// offline node fail with 595, as pveproxy's proxying does.
func (s *Simulator) SetNodeOnline(name string, online bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.nodes[name]
	if n == nil {
		return fmt.Errorf("unknown node %q", name)
	}
	n.online = online
	return nil
}

// nodeReachableLocked reproduces what pveproxy does when it must proxy a
// request to another node.
func (s *Simulator) nodeReachableLocked(name string) error {
	n := s.nodes[name]
	if n == nil {
		return serverError("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", name, name)
	}
	if !n.online {
		s.countFaultLocked(FaultOffline, "node")
		return &apiError{code: 595, msg: "No route to host\n"}
	}
	return nil
}

// memUsedLocked is host memory plus the memory of every running VM.
func (s *Simulator) memUsedLocked(n *node) int64 {
	used := n.memBase
	for _, v := range s.vms {
		if v.node == n.name && v.running {
			used += v.memoryBytes()
		}
	}
	return used
}

// handleVersion is GET /version.
func (s *Simulator) handleVersion(*apiRequest) (any, error) {
	version, release := s.versionStrings()
	return map[string]any{"version": version, "release": release, "repoid": pveRepoID}, nil
}

// handleNodes is GET /nodes.
func (s *Simulator) handleNodes(q *apiRequest) (any, error) {
	s.maybeSampleLocked()
	out := []map[string]any{}
	for _, name := range s.nodeOrder {
		n := s.nodes[name]
		e := map[string]any{"node": n.name, "id": "node/" + n.name, "type": "node", "ssl_fingerprint": n.fingerprint}
		if !n.online {
			e["status"] = "offline"
			out = append(out, e)
			continue
		}
		e["status"] = "online"
		if s.allowedLocked(q, "node", map[string]string{"node": n.name}) {
			for k, v := range s.sample.nodeStats(n) {
				e[k] = v
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// handleNodeStatus is GET /nodes/{node}/status: live values.
func (s *Simulator) handleNodeStatus(q *apiRequest) (any, error) {
	n := s.nodes[q.vars["node"]]
	now := s.clock.Now()
	used := s.memUsedLocked(n)
	rootUsed := n.disk / 10
	return map[string]any{
		"cpu":  0.02,
		"wait": 0.0,
		"idle": 0,
		"cpuinfo": map[string]any{
			"model": "Simulated CPU @ 2.40GHz", "cores": n.cpus / 2, "cpus": n.cpus, "sockets": 1,
			"mhz": "2400.000", "hvm": "1", "flags": "fpu vme de pse tsc msr pae mce", "user_hz": 100,
		},
		"memory":         map[string]any{"total": n.memTotal, "used": used, "free": n.memTotal - used, "available": n.memTotal - used},
		"swap":           map[string]any{"total": 8 << 30, "used": 0, "free": 8 << 30},
		"rootfs":         map[string]any{"total": n.disk, "used": rootUsed, "free": n.disk - rootUsed, "avail": n.disk - rootUsed},
		"ksm":            map[string]any{"shared": 0},
		"loadavg":        []string{"0.12", "0.10", "0.08"},
		"uptime":         int64(now.Sub(n.bootTime).Seconds()),
		"kversion":       kernelVer,
		"pveversion":     "pve-manager/" + s.versionString() + "/" + pveRepoID,
		"boot-info":      map[string]any{"mode": "efi", "secureboot": 0},
		"current-kernel": map[string]any{"sysname": "Linux", "release": "6.14.11-4-pve", "machine": "x86_64", "version": "#1 SMP PREEMPT_DYNAMIC PMX 6.14.11-4 (2025-10-10T08:04Z)"},
	}, nil
}

// handleClusterStatus is GET /cluster/status. A standalone node (no
// clusterName) lists only itself, with no "cluster" entry, as on PVE.
func (s *Simulator) handleClusterStatus(*apiRequest) (any, error) {
	out := []map[string]any{}
	if s.cfg.ClusterName != "" {
		out = append(out, map[string]any{
			"type": "cluster", "id": "cluster", "name": s.cfg.ClusterName, "nodes": len(s.nodeOrder), "quorate": 1, "version": len(s.nodeOrder) + 1,
		})
	}
	for i, name := range s.nodeOrder {
		n := s.nodes[name]
		out = append(out, map[string]any{
			"type": "node", "id": "node/" + n.name, "name": n.name, "nodeid": i + 1, "ip": n.ip,
			"online": boolInt(n.online), "local": boolInt(i == 0), "level": "",
		})
	}
	return out, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

var resourcesSchema = sch(param{name: "type", kind: kString, optional: true, enum: []string{"vm", "storage", "node", "sdn"}})

// handleResources is GET /cluster/resources. Membership, lock, tags and
// pool are live (they come from the cluster file system); status, name and
// usage come from the last sample, as pvestatd's broadcast data does.
func (s *Simulator) handleResources(q *apiRequest) (any, error) {
	s.maybeSampleLocked()
	typ := q.str("type")
	out := []any{}
	if typ == "" || typ == "vm" {
		for _, id := range s.sortedVMIDsLocked() {
			v := s.vms[id]
			if !s.allowedLocked(q, "vm", map[string]string{"vmid": strconv.Itoa(id)}) {
				continue
			}
			out = append(out, s.vmResource(v))
		}
	}
	if typ == "" || typ == "storage" {
		for _, name := range s.nodeOrder {
			for _, sid := range s.storeOrder {
				st := s.storages[sid]
				if !st.availableOn(name) || !s.allowedLocked(q, "storage", map[string]string{"storage": sid}) {
					continue
				}
				status := "available"
				if !s.nodes[name].online {
					status = "unknown"
				}
				out = append(out, map[string]any{
					"id": "storage/" + name + "/" + sid, "storage": sid, "node": name, "type": "storage",
					"status": status, "plugintype": st.typ, "content": st.contentString(), "shared": boolInt(st.shared),
					"disk": s.storageUsedLocked(st, name), "maxdisk": st.capacity,
				})
			}
		}
	}
	if typ == "" || typ == "node" {
		for _, name := range s.nodeOrder {
			n := s.nodes[name]
			// Every node is listed; its statistics only with Sys.Audit on
			// it (pve-manager Cluster.pm resources, extract_node_stats).
			audit := s.allowedLocked(q, "node", map[string]string{"node": name})
			e := map[string]any{"id": "node/" + name, "node": name, "type": "node", "level": ""}
			if !n.online {
				e["status"] = "offline"
			} else {
				e["status"] = "online"
				for k, v := range s.sample.nodeStats(n) {
					if audit {
						e[k] = v
					}
				}
			}
			out = append(out, e)
		}
	}
	return out, nil
}

// vmStats are the sampled fields of a /cluster/resources VM entry; they are
// absent while the VM has no sample (status "unknown").
type vmStats struct {
	Template  int     `json:"template"`
	Uptime    int64   `json:"uptime"`
	MaxCPU    int     `json:"maxcpu"`
	CPU       float64 `json:"cpu"`
	MaxMem    int64   `json:"maxmem"`
	Mem       int64   `json:"mem"`
	MaxDisk   int64   `json:"maxdisk"`
	Disk      int64   `json:"disk"`
	NetIn     int64   `json:"netin"`
	NetOut    int64   `json:"netout"`
	DiskRead  int64   `json:"diskread"`
	DiskWrite int64   `json:"diskwrite"`
}

// vmResourceEntry is one VM of /cluster/resources. A struct rather than a
// map keeps encoding 5,000 entries cheap (no per-entry key sorting).
type vmResourceEntry struct {
	ID     string `json:"id"`
	VMID   int    `json:"vmid"`
	Node   string `json:"node"`
	Type   string `json:"type"`
	Status string `json:"status"`
	Name   string `json:"name,omitempty"`
	*vmStats
	Lock string `json:"lock,omitempty"`
	Tags string `json:"tags,omitempty"`
	Pool string `json:"pool,omitempty"`
}

func (s *Simulator) vmResource(v *vm) vmResourceEntry {
	e := vmResourceEntry{ID: "qemu/" + strconv.Itoa(v.vmid), VMID: v.vmid, Node: v.node, Type: "qemu", Status: "unknown"}
	if smp, ok := s.sample.vms[v.vmid]; ok && s.nodes[v.node].online {
		e.Status = smp.status
		e.Name = smp.name
		e.vmStats = &vmStats{
			Template: boolInt(smp.template), Uptime: smp.uptime, MaxCPU: smp.maxcpu, CPU: smp.cpu,
			MaxMem: smp.maxmem, Mem: smp.mem, MaxDisk: smp.maxdisk,
		}
	}
	e.Lock = v.conf["lock"]
	e.Tags = v.conf["tags"]
	e.Pool = s.poolOfLocked(v.vmid)
	return e
}

// resourceSample is one pvestatd round.
type resourceSample struct {
	at    time.Time
	vms   map[int]vmSample
	nodes map[string]map[string]any
}

type vmSample struct {
	name     string
	status   string
	template bool
	uptime   int64
	maxcpu   int
	cpu      float64
	maxmem   int64
	mem      int64
	maxdisk  int64
}

func (rs *resourceSample) nodeStats(n *node) map[string]any {
	if rs == nil {
		return nil
	}
	return rs.nodes[n.name]
}

// takeSampleLocked records status and usage of every VM and node.
func (s *Simulator) takeSampleLocked(now time.Time) {
	rs := &resourceSample{at: now, vms: make(map[int]vmSample, len(s.vms)), nodes: map[string]map[string]any{}}
	for id, v := range s.vms {
		if v.conf["lock"] == "clone" || v.conf["lock"] == "destroyed" {
			// Placeholders have no full config yet; pvestatd skips them.
			continue
		}
		smp := vmSample{
			name: v.conf["name"], status: "stopped", template: v.isTemplate(),
			maxcpu: v.cores(), maxmem: v.memoryBytes(), maxdisk: v.bootDiskSize(),
		}
		if v.running {
			smp.status = "running"
			smp.uptime = int64(now.Sub(v.startedAt).Seconds())
			smp.cpu = 0.01 + float64(id%7)/100
			smp.mem = v.memoryBytes() / 3
		}
		rs.vms[id] = smp
	}
	for _, name := range s.nodeOrder {
		n := s.nodes[name]
		rs.nodes[name] = map[string]any{
			"cpu": 0.02, "maxcpu": n.cpus, "mem": s.memUsedLocked(n), "maxmem": n.memTotal,
			"disk": n.disk / 10, "maxdisk": n.disk, "uptime": int64(now.Sub(n.bootTime).Seconds()),
		}
	}
	s.sample = rs
}

// maybeSampleLocked samples on every read when no refresh interval is set.
func (s *Simulator) maybeSampleLocked() {
	if s.cfg.RefreshInterval <= 0 {
		s.takeSampleLocked(s.clock.Now())
	}
}

func (s *Simulator) scheduleRefreshLocked() {
	d := s.cfg.RefreshInterval.D()
	if d <= 0 {
		return
	}
	s.afterLocked(d, func(at time.Time) {
		s.takeSampleLocked(at)
		s.scheduleRefreshLocked()
	})
}

// RefreshResources takes a status sample now, as if pvestatd had just run.
func (s *Simulator) RefreshResources() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runDueLocked()
	s.takeSampleLocked(s.clock.Now())
}

// handleNextID is GET /cluster/nextid. It reserves nothing: concurrent
// callers get the same answer.
func (s *Simulator) handleNextID(q *apiRequest) (any, error) {
	if q.has("vmid") {
		id := int(q.integer("vmid", 0))
		if _, taken := s.vms[id]; taken {
			return nil, paramError(map[string]string{"vmid": fmt.Sprintf("VM %d already exists", id)})
		}
		return strconv.Itoa(id), nil
	}
	for id := minVMID; id <= maxVMID; id++ {
		if _, taken := s.vms[id]; !taken {
			return strconv.Itoa(id), nil
		}
	}
	return nil, serverError("unable to get any free VMID in range [%d, %d]", minVMID, maxVMID)
}

type pool struct {
	id      string
	comment string
	members map[int]bool
}

func (s *Simulator) poolOfLocked(vmid int) string {
	for _, id := range sortedKeys(s.pools) {
		if s.pools[id].members[vmid] {
			return id
		}
	}
	return ""
}

// handlePools is GET /pools.
func (s *Simulator) handlePools(q *apiRequest) (any, error) {
	out := []map[string]any{}
	for _, id := range sortedKeys(s.pools) {
		p := s.pools[id]
		if q.has("poolid") && q.str("poolid") != id {
			continue
		}
		if !s.allowedLocked(q, "pool", map[string]string{"poolid": id}) {
			continue
		}
		e := map[string]any{"poolid": id}
		if p.comment != "" {
			e["comment"] = p.comment
		}
		if q.has("poolid") {
			e["members"] = s.poolMembersLocked(p)
		}
		out = append(out, e)
	}
	return out, nil
}

func (s *Simulator) poolMembersLocked(p *pool) []vmResourceEntry {
	members := []vmResourceEntry{}
	ids := []int{}
	for id := range p.members {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		if v := s.vms[id]; v != nil {
			members = append(members, s.vmResource(v))
		}
	}
	return members
}

// handleGetPool is GET /pools/{poolid}.
func (s *Simulator) handleGetPool(q *apiRequest) (any, error) {
	p := s.pools[q.vars["poolid"]]
	if p == nil {
		return nil, serverError("pool '%s' does not exist", q.vars["poolid"])
	}
	out := map[string]any{"members": s.poolMembersLocked(p)}
	if p.comment != "" {
		out["comment"] = p.comment
	}
	return out, nil
}

// handleCreatePool is POST /pools.
func (s *Simulator) handleCreatePool(q *apiRequest) (any, error) {
	id := q.str("poolid")
	if _, ok := s.pools[id]; ok {
		return nil, serverError("pool '%s' already exists", id)
	}
	s.pools[id] = &pool{id: id, comment: q.str("comment"), members: map[int]bool{}}
	return nil, nil
}
