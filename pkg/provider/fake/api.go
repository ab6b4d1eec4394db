package fake

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// session serves one Provider method call: it counts the API-like calls
// the method makes and caches the batch listing for the call's duration.
type session struct {
	hv     *hypervisor
	obs    provider.Observer
	method Method
	user   string

	listing []resource
}

// do runs one API-like call: it brings the cluster up to date, counts the
// call, applies injected faults and node reachability, runs fn under the
// cluster's lock and reports the call to the Observer.
func (s *session) do(op Op, node string, fn func(h *hypervisor) error) error {
	h := s.hv
	h.mu.Lock()
	h.settleLocked()
	h.calls[s.method]++
	h.opCalls[op]++
	var err error
	if injected, ok := popFail(h.failOp, op); ok {
		err = injected
	} else if node != "" && h.nodes[node] == nil {
		err = serverErr("hostname lookup '%s' failed - failed to get address info for: %s: Name or service not known", node, node)
	} else if node != "" && h.nodes[node].Offline {
		err = &apiError{code: 595, msg: "No route to host"}
	} else {
		err = fn(h)
	}
	h.mu.Unlock()
	code := 200
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		code = ae.code
	case err != nil:
		code = 500
	}
	ep := endpoints[op]
	s.obs.APICall(ep[0], ep[1], code, 0)
	return err
}

// injected returns the error queued for the session's method, if any.
func (s *session) injected() error {
	h := s.hv
	h.mu.Lock()
	defer h.mu.Unlock()
	if injected, ok := popFail(h.failMethod, s.method); ok {
		return injected
	}
	return nil
}

func popFail[K comparable, V any](m map[K][]V, k K) (V, bool) {
	q := m[k]
	if len(q) == 0 {
		var zero V
		return zero, false
	}
	m[k] = q[1:]
	return q[0], true
}

// injectedError is a classified error wrapping the sentinel that fits the
// class best.
func injectedError(class provider.Class, what string) error {
	sentinel := provider.ErrUnreachable
	switch class {
	case provider.ClassConfiguration:
		sentinel = provider.ErrUnauthorized
	case provider.ClassResource:
		sentinel = provider.ErrNoCapacity
	case provider.ClassPermanent:
		sentinel = provider.ErrTaskFailed
	}
	return provider.Errorf(class, "Injected", "fake: injected %s failure of %s: %w", class, what, sentinel)
}

// resource is one VM entry of the batch listing.
type resource struct {
	vmid     int
	node     string
	name     string
	status   string // running, stopped or unknown (from the sample)
	template bool
	lock     string
	tags     []string
	pool     string
	uptime   time.Duration
}

// resources is GET /cluster/resources?type=vm, cached for the session.
func (s *session) resources() ([]resource, error) {
	if s.listing != nil {
		return s.listing, nil
	}
	var out []resource
	err := s.do(OpResources, "", func(h *hypervisor) error {
		out = []resource{}
		for _, id := range h.sortedVMIDsLocked() {
			v := h.vms[id]
			r := resource{vmid: id, node: v.node, status: "unknown", lock: v.lock, tags: append([]string(nil), v.tags...), pool: v.pool}
			if smp, ok := h.sample[id]; ok && !h.nodes[v.node].Offline {
				r.name, r.template, r.uptime = smp.name, smp.template, smp.uptime
				r.status = "stopped"
				if smp.running {
					r.status = "running"
				}
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.listing = out
	return out, nil
}

// forget drops the cached listing after a call that changed membership.
func (s *session) forget() { s.listing = nil }

func (s *session) version() (string, error) {
	var v string
	err := s.do(OpVersion, "", func(h *hypervisor) error {
		v = h.o.Version
		return nil
	})
	return v, err
}

type nodeStatus struct {
	name     string
	online   bool
	cpus     int64
	mem      int64
	memUsed  int64
	disk     int64
	diskUsed int64
}

func (s *session) nodes() ([]nodeStatus, error) {
	var out []nodeStatus
	err := s.do(OpNodes, "", func(h *hypervisor) error {
		for _, name := range h.nodeOrder {
			n := h.nodes[name]
			ns := nodeStatus{name: name, online: !n.Offline}
			if !n.Offline {
				ns.cpus, ns.mem, ns.memUsed = n.CPUs, n.MemoryBytes, h.memUsedLocked(n)
				for _, sid := range h.storeOrder {
					st := h.storages[sid]
					if st.availableOn(name) && !st.Shared {
						ns.disk += st.CapacityBytes
					}
				}
				for _, v := range h.vms {
					if v.node == name && !v.linked && h.storages[v.diskStorage] != nil && !h.storages[v.diskStorage].Shared {
						ns.diskUsed += v.disk
					}
				}
			}
			out = append(out, ns)
		}
		return nil
	})
	return out, err
}

func (s *session) pools() ([]string, error) {
	var out []string
	err := s.do(OpPools, "", func(h *hypervisor) error {
		for p := range h.pools {
			out = append(out, p)
		}
		return nil
	})
	return out, err
}

// vmConfig is what GET .../config tells about a VM.
type vmConfig struct {
	name        string
	template    bool
	lock        string
	description string
	tags        []string
	cores       int
	memory      int64
	disk        int64
	diskStorage string
	agent       bool
	net         hvNet
	cdrom       string
}

func (s *session) config(node string, vmid int) (vmConfig, error) {
	var c vmConfig
	err := s.do(OpConfig, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		if v.lock == "clone" {
			c = vmConfig{lock: "clone"} // the placeholder holds nothing else
			return nil
		}
		c = vmConfig{
			name: v.name, template: v.template, lock: v.lock, description: v.description,
			tags: append([]string(nil), v.tags...), cores: v.cores, memory: v.memory, disk: v.disk,
			diskStorage: v.diskStorage, agent: v.agent, net: v.net, cdrom: v.cdrom,
		}
		return nil
	})
	return c, err
}

type vmStatus struct {
	running bool
	uptime  time.Duration
}

func (s *session) status(node string, vmid int) (vmStatus, error) {
	var st vmStatus
	err := s.do(OpStatus, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		st.running = v.running
		if v.running {
			st.uptime = h.clock.Now().Sub(v.startedAt).Truncate(time.Second)
		}
		return nil
	})
	return st, err
}

type cloneParams struct {
	newid       int
	name        string
	description string
	pool        string
	full        bool
	storage     string
	format      string
	target      string
}

// clone is POST /nodes/{node}/qemu/{src}/clone. The synchronous checks are
// Proxmox's; the new id is taken at once by a placeholder locked "clone".
func (s *session) clone(node string, src int, p cloneParams) (string, error) {
	var upid string
	err := s.do(OpClone, node, func(h *hypervisor) error {
		if p.newid < minVMID || p.newid > maxVMID {
			return paramErr("newid", fmt.Sprintf("value must have a minimum value of %d", minVMID))
		}
		if p.name != "" && !dnsNameRE.MatchString(p.name) {
			return paramErr("name", "invalid format - value does not look like a valid DNS name")
		}
		if len(p.description) > maxDescription {
			return paramErr("description", fmt.Sprintf("value may only be %d characters long", maxDescription))
		}
		sv := h.vms[src]
		if sv == nil || sv.node != node {
			return noConfig(node, src)
		}
		target := node
		if p.target != "" {
			if h.nodes[p.target] == nil {
				return serverErr("no such cluster node '%s'", p.target)
			}
			target = p.target
		}
		srcStore := h.storages[sv.diskStorage]
		tstore := srcStore
		if p.full && p.storage != "" {
			tstore = h.storages[p.storage]
			if tstore == nil || !tstore.availableOn(target) {
				return serverErr("storage '%s' does not exist", p.storage)
			}
			if !tstore.has("images") {
				return serverErr("storage '%s' does not support vm images", p.storage)
			}
		}
		if p.pool != "" && !h.pools[p.pool] {
			return serverErr("pool '%s' does not exist", p.pool)
		}
		if sv.lock != "" {
			return serverErr("VM is locked (%s)", sv.lock)
		}
		if !p.full {
			if p.storage != "" {
				return serverErr("parameter 'storage' not allowed for linked clones")
			}
			if !sv.template || !srcStore.linkedClones() {
				return serverErr("Linked clone feature is not supported for '%s:base-%d-disk-0' (scsi0)", sv.diskStorage, src)
			}
		}
		if h.vms[p.newid] != nil {
			return serverErr("unable to create VM %d: config file already exists", p.newid)
		}
		if target != node && !tstore.Shared {
			return serverErr("can't clone VM to node '%s' (VM uses local storage)", target)
		}
		placeholder := &hvVM{vmid: p.newid, node: target, lock: "clone"}
		h.vms[p.newid] = placeholder
		d := h.o.Durations.Clone
		if p.full {
			d += time.Duration(float64(h.o.Durations.FullClonePerGiB) * float64(sv.disk) / float64(1<<30))
		}
		upid = h.runTaskLocked(OpClone, node, "qmclone", strconv.Itoa(src), s.user, d, func(time.Time) error {
			nv := h.vms[p.newid]
			if nv != placeholder || nv.lock != "clone" {
				return fmt.Errorf("clone failed: VM %d config vanished during clone", p.newid)
			}
			sv := h.vms[src]
			if sv == nil {
				delete(h.vms, p.newid)
				return fmt.Errorf("clone failed: source VM %d vanished", src)
			}
			*nv = hvVM{
				vmid: p.newid, node: target, name: p.name, description: sv.description,
				tags: append([]string(nil), sv.tags...), cores: sv.cores, memory: sv.memory, disk: sv.disk,
				diskStorage: tstore.ID, linked: !p.full, agent: sv.agent, pool: p.pool,
				net: hvNet{model: sv.net.model, mac: h.newMACLocked(), bridge: sv.net.bridge, vlan: sv.net.vlan},
			}
			if nv.name == "" && sv.name != "" {
				nv.name = "Copy-of-VM-" + sv.name
			}
			if p.description != "" {
				nv.description = p.description
			}
			return nil
		}, func() {
			// A failed clone leaves no VM behind.
			if h.vms[p.newid] == placeholder {
				delete(h.vms, p.newid)
			}
		})
		return nil
	})
	return upid, err
}

// configChange is a set of config keys to write; nil fields stay.
type configChange struct {
	name   *string
	cores  *int
	memory *int64
	net    *hvNet
	tags   []string // nil: unchanged
	cdrom  *string
}

func (c configChange) empty() bool {
	return c.name == nil && c.cores == nil && c.memory == nil && c.net == nil && c.tags == nil && c.cdrom == nil
}

// updateConfig is POST .../config (async: a task applies the change when
// it ends; returns its UPID) or PUT .../config (sync: applied at once,
// returns "").
func (s *session) updateConfig(node string, vmid int, c configChange, async bool) (string, error) {
	var upid string
	err := s.do(OpUpdateConfig, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		if c.tags != nil {
			if _, err := normalizeTags(c.tags); err != nil {
				return paramErr("tags", "invalid format - invalid characters in tag")
			}
		}
		if v.lock != "" {
			return serverErr("VM is locked (%s)", v.lock)
		}
		if c.cdrom != nil && *c.cdrom != "none" {
			st, vol := h.findVolumeLocked(*c.cdrom, node)
			if st == nil || vol == nil {
				return serverErr("volume '%s' does not exist", *c.cdrom)
			}
		}
		apply := func() error {
			if h.vms[vmid] != v {
				return noConfig(node, vmid)
			}
			if v.lock != "" {
				return fmt.Errorf("VM is locked (%s)", v.lock)
			}
			if c.name != nil {
				v.name = *c.name
			}
			if c.cores != nil {
				v.cores = *c.cores
			}
			if c.memory != nil {
				v.memory = *c.memory
			}
			if c.net != nil {
				v.net = *c.net
			}
			if c.tags != nil {
				v.tags, _ = normalizeTags(c.tags)
			}
			if c.cdrom != nil {
				v.cdrom = *c.cdrom
			}
			return nil
		}
		if !async {
			return apply()
		}
		upid = h.runTaskLocked(OpUpdateConfig, node, "qmconfig", strconv.Itoa(vmid), s.user, h.o.Durations.Configure,
			func(time.Time) error { return apply() }, nil)
		return nil
	})
	return upid, err
}

// resize is PUT .../resize with an absolute size; shrinking fails inside
// the task, as on PVE 8+.
func (s *session) resize(node string, vmid int, size int64) (string, error) {
	var upid string
	err := s.do(OpResize, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		if v.lock != "" {
			return serverErr("VM is locked (%s)", v.lock)
		}
		upid = h.runTaskLocked(OpResize, node, "resize", strconv.Itoa(vmid), s.user, h.o.Durations.Resize, func(time.Time) error {
			switch {
			case h.vms[vmid] != v:
				return noConfig(node, vmid)
			case size < v.disk:
				return errors.New("shrinking disks is not supported")
			}
			v.disk = size
			return nil
		}, nil)
		return nil
	})
	return upid, err
}

// power starts a qmstart, qmstop or qmshutdown task. Like Proxmox, only
// the config's existence is checked synchronously.
func (s *session) power(node string, vmid int, op Op) (string, error) {
	var upid string
	err := s.do(op, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		typ, d := "qmstart", h.o.Durations.Start
		switch op {
		case OpStop:
			typ, d = "qmstop", h.o.Durations.Stop
		case OpShutdown:
			typ, d = "qmshutdown", h.o.Durations.Shutdown
		}
		upid = h.runTaskLocked(op, node, typ, strconv.Itoa(vmid), s.user, d, func(at time.Time) error {
			switch {
			case h.vms[vmid] != v:
				return noConfig(node, vmid)
			case v.lock != "":
				return fmt.Errorf("VM is locked (%s)", v.lock)
			case op == OpStart:
				return h.startLocked(v, at)
			}
			h.powerOffLocked(v)
			return nil
		}, nil)
		return nil
	})
	return upid, err
}

func (h *hypervisor) startLocked(v *hvVM, at time.Time) error {
	if v.template {
		return errors.New("you can't start a vm if it's a template")
	}
	if v.running {
		return fmt.Errorf("VM %d already running", v.vmid)
	}
	n := h.nodes[v.node]
	if h.memUsedLocked(n)+v.memory > n.MemoryBytes {
		return errors.New("start failed: QEMU exited with code 1")
	}
	v.running, v.startedAt, v.agentUp = true, at, false
	v.bootGen++
	h.allocateAddressLocked(v.vmid)
	// The guest reads its NoCloud ISO while it boots.
	if v.cdrom != "" && v.cdrom != "none" {
		if _, vol := h.findVolumeLocked(v.cdrom, v.node); vol != nil {
			h.delivered[v.vmid] = copyCloudInit(vol.payload)
		}
	}
	if v.agent {
		gen := v.bootGen
		h.atLocked(at.Add(h.o.Durations.Boot), func(time.Time) {
			if v.running && v.bootGen == gen {
				v.agentUp = true
			}
		})
	}
	return nil
}

// destroy is DELETE /nodes/{node}/qemu/{vmid} with purge: the config
// becomes a "lock: destroyed" stub until the task removed the VM.
func (s *session) destroy(node string, vmid int) (string, error) {
	var upid string
	err := s.do(OpDestroy, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		if v == nil || v.node != node {
			return noConfig(node, vmid)
		}
		if v.running {
			return serverErr("VM %d is running - destroy failed", vmid)
		}
		if v.lock != "" {
			return serverErr("VM is locked (%s)", v.lock)
		}
		v.lock = "destroyed"
		upid = h.runTaskLocked(OpDestroy, node, "qmdestroy", strconv.Itoa(vmid), s.user, h.o.Durations.Destroy, func(time.Time) error {
			if h.vms[vmid] == v {
				delete(h.vms, vmid)
				h.releaseAddressLocked(vmid)
			}
			return nil
		}, func() {
			if h.vms[vmid] == v && v.lock == "destroyed" {
				v.lock = ""
			}
		})
		return nil
	})
	return upid, err
}

type taskStatus struct {
	running bool
	exit    string // "OK" or the error text once stopped
}

func (s *session) taskStatus(upid string) (taskStatus, error) {
	node := ""
	if parts := strings.Split(upid, ":"); len(parts) > 2 && parts[0] == "UPID" {
		node = parts[1]
	} else {
		return taskStatus{}, serverErr("unable to parse worker upid '%s'", upid)
	}
	var ts taskStatus
	err := s.do(OpTaskStatus, node, func(h *hypervisor) error {
		t := h.tasks[upid]
		if t == nil {
			return &apiError{code: 400, msg: "Parameter verification failed. (upid: no such task)"}
		}
		ts = taskStatus{running: t.running, exit: t.exit}
		return nil
	})
	return ts, err
}

type guestIface struct {
	name  string
	mac   string
	addrs []string
}

func (s *session) agentInterfaces(node string, vmid int) ([]guestIface, error) {
	var out []guestIface
	err := s.do(OpAgent, node, func(h *hypervisor) error {
		v := h.vms[vmid]
		switch {
		case v == nil || v.node != node:
			return noConfig(node, vmid)
		case !v.agent:
			return serverErr("No QEMU guest agent configured")
		case !v.running:
			return serverErr("VM %d is not running", vmid)
		case !v.agentUp:
			return serverErr("QEMU guest agent is not running")
		}
		mac := strings.ToLower(v.net.mac)
		eth := guestIface{name: "eth0", mac: mac}
		if a := h.allocateAddressLocked(vmid); a != "" {
			eth.addrs = append(eth.addrs, a)
		}
		eth.addrs = append(eth.addrs, linkLocal(mac))
		out = []guestIface{{name: "lo", mac: "00:00:00:00:00:00", addrs: []string{"127.0.0.1", "::1"}}, eth}
		return nil
	})
	return out, err
}

// linkLocal derives the EUI-64 fe80:: address of a MAC.
func linkLocal(mac string) string {
	var b [6]byte
	if _, err := fmt.Sscanf(mac, "%02x:%02x:%02x:%02x:%02x:%02x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]); err != nil {
		return "fe80::1"
	}
	return fmt.Sprintf("fe80::%02x%02x:%02xff:fe%02x:%02x%02x", b[0]^2, b[1], b[2], b[3], b[4], b[5])
}

func (h *hypervisor) storageOnNodeLocked(sid, node string) (*Storage, error) {
	st := h.storages[sid]
	if st == nil || !st.availableOn(node) {
		return nil, serverErr("storage '%s' does not exist", sid)
	}
	return st, nil
}

type storageStatus struct {
	typ     string
	content []string
	shared  bool
}

func (s *session) storageStatus(node, sid string) (storageStatus, error) {
	var out storageStatus
	err := s.do(OpStorageStatus, node, func(h *hypervisor) error {
		st, err := h.storageOnNodeLocked(sid, node)
		if err != nil {
			return err
		}
		out = storageStatus{typ: st.Type, content: append([]string(nil), st.Content...), shared: st.Shared}
		return nil
	})
	return out, err
}

// storageContent lists the ISO volume ids on a storage as node sees it.
func (s *session) storageContent(node, sid string) ([]string, error) {
	var out []string
	err := s.do(OpStorageContent, node, func(h *hypervisor) error {
		st, err := h.storageOnNodeLocked(sid, node)
		if err != nil {
			return err
		}
		scope := st.scope(node)
		for _, vol := range h.volumes {
			if vol.storage == sid && vol.scope == scope {
				out = append(out, vol.volid)
			}
		}
		return nil
	})
	return out, err
}

// upload is POST .../storage/{s}/upload with content=iso. The volume
// appears when the imgcopy task ends; an existing file is replaced.
func (s *session) upload(node, sid, filename string, payload provider.CloudInit) (string, string, error) {
	var upid, volid string
	err := s.do(OpUpload, node, func(h *hypervisor) error {
		st, err := h.storageOnNodeLocked(sid, node)
		if err != nil {
			return err
		}
		if !st.fileBased() {
			return paramErr("storage", fmt.Sprintf("can't upload to storage type '%s'", st.Type))
		}
		if !st.has("iso") {
			return paramErr("content", fmt.Sprintf("storage '%s' does not support 'iso' content", sid))
		}
		name := fileNameRE.ReplaceAllString(filename, "_")
		if !strings.HasSuffix(name, ".iso") && !strings.HasSuffix(name, ".img") {
			return paramErr("filename", "wrong file extension")
		}
		volid = sid + ":iso/" + name
		scope := st.scope(node)
		data := copyCloudInit(payload)
		upid = h.runTaskLocked(OpUpload, node, "imgcopy", "", s.user, h.o.Durations.Upload, func(time.Time) error {
			h.volumes[volumeKey(scope, volid)] = &hvVolume{storage: sid, scope: scope, volid: volid, payload: data}
			return nil
		}, nil)
		return nil
	})
	return upid, volid, err
}

// deleteVolume is DELETE .../storage/{s}/content/{volid} (task imgdel).
func (s *session) deleteVolume(node, sid, volid string) (string, error) {
	var upid string
	err := s.do(OpDeleteVolume, node, func(h *hypervisor) error {
		st, err := h.storageOnNodeLocked(sid, node)
		if err != nil {
			return err
		}
		key := volumeKey(st.scope(node), volid)
		if h.volumes[key] == nil {
			return serverErr("volume '%s' does not exist", volid)
		}
		upid = h.runTaskLocked(OpDeleteVolume, node, "imgdel", "", s.user, h.o.Durations.DeleteVolume, func(time.Time) error {
			delete(h.volumes, key)
			return nil
		}, nil)
		return nil
	})
	return upid, err
}

// findVolumeLocked resolves a "<storage>:iso/<file>" volume id as node
// sees it.
func (h *hypervisor) findVolumeLocked(volid, node string) (*Storage, *hvVolume) {
	sid, _, ok := strings.Cut(volid, ":")
	if !ok {
		return nil, nil
	}
	st := h.storages[sid]
	if st == nil || !st.availableOn(node) {
		return nil, nil
	}
	return st, h.volumes[volumeKey(st.scope(node), volid)]
}

func copyCloudInit(c provider.CloudInit) provider.CloudInit {
	return provider.CloudInit{
		UserData:      append([]byte(nil), c.UserData...),
		MetaData:      append([]byte(nil), c.MetaData...),
		NetworkConfig: append([]byte(nil), c.NetworkConfig...),
	}
}
