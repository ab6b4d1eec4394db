package proxmoxsim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

var cloneSchema = sch(nodeP, vmidP,
	param{name: "newid", kind: kInt, min: intPtr(minVMID), max: intPtr(maxVMID)},
	param{name: "name", kind: kString, optional: true, format: verifyDNSName},
	param{name: "description", kind: kString, optional: true, maxLen: 8192},
	param{name: "pool", kind: kString, optional: true, format: verifyPoolID},
	param{name: "snapname", kind: kString, optional: true, maxLen: 40},
	param{name: "storage", kind: kString, optional: true, format: verifyStorageID},
	param{name: "format", kind: kString, optional: true, enum: []string{"raw", "qcow2", "vmdk"}},
	param{name: "full", kind: kBool, optional: true},
	param{name: "target", kind: kString, optional: true, format: verifyNodeName},
	param{name: "bwlimit", kind: kInt, optional: true, min: intPtr(0)},
)

// clonePlan is what a clone will do, decided by the synchronous checks.
type clonePlan struct {
	src, newid int
	srcNode    string
	target     string
	full       bool
	storage    string // target storage for full clones ("" = same as source)
	format     string
	name       string
	desc       *string
	pool       string
	totalBytes int64
}

// handleClone is POST /nodes/{node}/qemu/{vmid}/clone (task qmclone, UPID id
// = source vmid).
func (s *Simulator) handleClone(q *apiRequest) (any, error) {
	src, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	p := &clonePlan{src: src.vmid, newid: int(q.integer("newid", 0)), srcNode: src.node, target: src.node,
		storage: q.str("storage"), format: q.str("format"), name: q.str("name"), pool: q.str("pool")}
	if q.has("description") {
		d := q.str("description")
		p.desc = &d
	}
	if t := q.str("target"); t != "" {
		if s.nodes[t] == nil {
			return nil, serverError("no such cluster node '%s'", t)
		}
		p.target = t
	}
	if p.storage != "" {
		if _, err := s.storageOnNodeLocked(p.storage, p.target); err != nil {
			return nil, err
		}
		if !s.storages[p.storage].content["images"] {
			return nil, serverError("storage '%s' does not support vm images", p.storage)
		}
	}
	if p.pool != "" && s.pools[p.pool] == nil {
		return nil, serverError("pool '%s' does not exist", p.pool)
	}
	if err := checkLock(src); err != nil {
		return nil, err
	}
	// Templates default to linked clones, ordinary VMs to full clones.
	p.full = q.boolean("full", !src.isTemplate())
	if !p.full && p.storage != "" {
		return nil, serverError("parameter 'storage' not allowed for linked clones")
	}
	if !p.full && p.format != "" {
		return nil, serverError("parameter 'format' not allowed for linked clones")
	}
	if _, exists := s.vms[p.newid]; exists {
		return nil, serverError("unable to create VM %d: config file already exists", p.newid)
	}
	for _, k := range driveKeys(src.conf) {
		d := parseDrive(src.conf[k])
		if d.isCDROM() && !d.isCloudInit() {
			continue
		}
		st, vol := s.findVolumeLocked(d.file, src.node)
		if st == nil || vol == nil {
			return nil, serverError("volume '%s' does not exist", d.file)
		}
		if !d.isCloudInit() {
			p.totalBytes += vol.size
		}
		if p.full && src.running && k == tpmKey {
			return nil, serverError("cannot clone TPM state while VM is running")
		}
		// Cloud-init drives and TPM state are copied in full whatever
		// the mode (qemu-server's clone_vm).
		if !p.full && !d.isCloudInit() && k != tpmKey && (!src.isTemplate() || !st.supportsLinkedClone(vol.format)) {
			return nil, serverError("Linked clone feature is not supported for '%s' (%s)", d.file, k)
		}
		// Whether the VM may go to another node is the source volumes'
		// to decide, whatever a full clone's target storage (qemu-server's
		// check_storage_access_clone, src/PVE/API2/Qemu.pm).
		if p.target != src.node && !st.shared {
			return nil, serverError("can't clone VM to node '%s' (VM uses local storage)", p.target)
		}
	}
	t := s.newTaskLocked(src.node, "qmclone", strconv.Itoa(src.vmid), q.auth)
	s.afterLocked(s.cfg.Latency.ClonePlaceholder.D(), func(at time.Time) { s.clonePlaceholder(t, p, at) })
	return t.upid, nil
}

// clonePlaceholder is the first step of the clone worker: take the new id
// by writing a config that holds only "lock: clone", then queue the disk
// work on the storage locks.
func (s *Simulator) clonePlaceholder(t *task, p *clonePlan, at time.Time) {
	src := s.vms[p.src]
	if src == nil || src.node != p.srcNode {
		t.finish(at, fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", p.srcNode, p.src)) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
		return
	}
	if _, exists := s.vms[p.newid]; exists {
		t.finish(at, fmt.Errorf("unable to create VM %d: config file already exists", p.newid))
		return
	}
	if l := src.conf["lock"]; l != "" {
		t.finish(at, fmt.Errorf("VM is locked (%s)", l))
		return
	}
	s.vms[p.newid] = &vm{vmid: p.newid, node: p.target, conf: map[string]string{"lock": "clone"}}
	// clone_vmfw_conf, right after the placeholder; a failed clone removes
	// the copy with the VM.
	s.cloneFirewallLocked(p.src, p.newid)

	// Disk work runs under the storage locks of every storage involved.
	// One clone holds a storage for its whole disk phase; later clones
	// queue behind it and give up after the lock timeout.
	dur := s.cfg.Latency.CloneBase.D()
	if p.full {
		dur += time.Duration(float64(s.cfg.Latency.ClonePerGiB.D()) * float64(p.totalBytes) / float64(1<<30))
	}
	stores := s.cloneStoragesLocked(src, p)
	start := at
	var blocker *storage
	for _, st := range stores {
		if busy := s.storageBusy[st.lockKey(p.target)]; busy.After(start) {
			start = busy
		}
	}
	wait := s.cfg.StorageLockTimeout.D()
	if start.Sub(at) > wait {
		for _, st := range stores {
			if s.storageBusy[st.lockKey(p.target)].Sub(at) > wait {
				blocker = st
				break
			}
		}
		s.scheduleLocked(at.Add(wait), func(at2 time.Time) {
			delete(s.vms, p.newid)
			s.forgetFirewallLocked(p.newid)
			t.finish(at2, fmt.Errorf("clone failed: %s", blocker.lockTimeoutError()))
		})
		return
	}
	for _, st := range stores {
		s.storageBusy[st.lockKey(p.target)] = start.Add(dur)
	}
	s.scheduleLocked(start.Add(dur), func(end time.Time) { s.cloneFinish(t, p, end) })
}

func (s *Simulator) cloneStoragesLocked(src *vm, p *clonePlan) []*storage {
	seen := map[string]bool{}
	var out []*storage
	for _, k := range driveKeys(src.conf) {
		d := parseDrive(src.conf[k])
		if d.isCDROM() && !d.isCloudInit() {
			continue
		}
		sid, _, _ := strings.Cut(d.file, ":")
		if p.full && p.storage != "" {
			sid = p.storage
		}
		if st := s.storages[sid]; st != nil && !seen[sid] {
			seen[sid] = true
			out = append(out, st)
		}
	}
	return out
}

// cloneFinish writes the new VM's config and volumes.
func (s *Simulator) cloneFinish(t *task, p *clonePlan, at time.Time) {
	src := s.vms[p.src]
	nv := s.vms[p.newid]
	if nv == nil || nv.conf["lock"] != "clone" {
		t.finish(at, fmt.Errorf("clone failed: VM %d config vanished during clone", p.newid))
		return
	}
	if src == nil {
		delete(s.vms, p.newid)
		s.forgetFirewallLocked(p.newid)
		t.finish(at, fmt.Errorf("clone failed: source VM %d vanished", p.src))
		return
	}
	if err := s.taskFaultLocked(classClone, strconv.Itoa(p.newid), p.storage); err != nil {
		// A failed clone worker removes what it created.
		delete(s.vms, p.newid)
		s.forgetFirewallLocked(p.newid)
		t.finish(at, err)
		return
	}
	conf := map[string]string{}
	for k, v := range src.conf {
		switch k {
		case "template", "lock", "parent", "snapstate", "vmstate", "runningmachine", "runningcpu":
			continue
		}
		conf[k] = v
	}
	if p.name != "" {
		conf["name"] = p.name
	} else if n := src.conf["name"]; n != "" {
		conf["name"] = "Copy-of-VM-" + n
	}
	if p.desc != nil {
		if *p.desc == "" {
			delete(conf, "description")
		} else {
			conf["description"] = *p.desc
		}
	}
	// A clone is a new machine: new MACs, SMBIOS uuid and vmgenid.
	for k, v := range conf {
		if netKeyRE.MatchString(k) {
			conf[k] = s.replaceMAC(v)
		}
	}
	conf["smbios1"] = "uuid=" + s.newUUID()
	conf["vmgenid"] = s.newUUID()
	conf["meta"] = fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", at.Unix())
	for _, k := range driveKeys(src.conf) {
		d := parseDrive(src.conf[k])
		if d.isCDROM() && !d.isCloudInit() {
			continue
		}
		sst, svol := s.findVolumeLocked(d.file, src.node)
		if sst == nil || svol == nil {
			delete(s.vms, p.newid)
			s.forgetFirewallLocked(p.newid)
			t.finish(at, fmt.Errorf("clone failed: volume '%s' does not exist", d.file))
			return
		}
		tst := sst
		if p.full && p.storage != "" && !d.isCloudInit() {
			tst = s.storages[p.storage]
		}
		scope := tst.scope(p.target)
		nd := d
		switch {
		case d.isCloudInit():
			// The cloud-init drive is always copied in full.
			nd.file = s.cloudInitVolid(tst, p.newid)
			s.addVolumeLocked(tst, scope, &volume{volid: nd.file, content: "images", format: svol.format, size: svol.size, vmid: p.newid})
		case k == tpmKey:
			// A copy, content and all, on the full clone's target
			// storage or the template's: a state manufactured by an
			// earlier start travels with it, endorsement key included
			// (docs/templates.md, "TPM").
			nd.file = s.newDiskNameLocked(tst, scope, p.newid, "raw")
			t.logf("create full clone of drive %s (%s)", k, d.file)
			s.addVolumeLocked(tst, scope, &volume{volid: nd.file, content: "images", format: "raw", size: svol.size, vmid: p.newid,
				data: slices.Clone(svol.data)})
		case p.full:
			format := svol.format
			if p.format != "" && tst.fileBased() {
				format = p.format
			}
			if !tst.fileBased() {
				format = "raw"
			}
			nd.file = s.newDiskNameLocked(tst, scope, p.newid, format)
			t.logf("create full clone of drive %s (%s)", k, d.file)
			s.addVolumeLocked(tst, scope, &volume{volid: nd.file, content: "images", format: format, size: svol.size, vmid: p.newid})
		default:
			nd.file = s.linkedVolid(tst, svol, p.newid, scope)
			t.logf("create linked clone of drive %s (%s)", k, d.file)
			s.addVolumeLocked(tst, scope, &volume{volid: nd.file, content: "images", format: svol.format, size: svol.size, vmid: p.newid, linked: true})
		}
		conf[k] = nd.String()
	}
	nv.conf = conf
	nv.image = src.image
	if p.pool != "" && s.pools[p.pool] != nil {
		s.pools[p.pool].members[p.newid] = true
	}
	t.finish(at, nil)
}

// linkedVolid names a linked clone the way each storage plugin does.
func (s *Simulator) linkedVolid(st *storage, base *volume, newid int, scope string) string {
	_, baseName, _ := strings.Cut(base.volid, ":")
	for i := 0; ; i++ {
		var volid string
		switch {
		case st.fileBased():
			volid = fmt.Sprintf("%s:%s/%d/vm-%d-disk-%d.%s", st.id, baseName, newid, newid, i, base.format)
		case st.typ == "lvmthin":
			volid = fmt.Sprintf("%s:vm-%d-disk-%d", st.id, newid, i)
		default:
			volid = fmt.Sprintf("%s:%s/vm-%d-disk-%d", st.id, baseName, newid, i)
		}
		if st.volumes[volumeKey(scope, volid)] == nil {
			return volid
		}
	}
}

// replaceMAC gives a net device a fresh MAC, keeping model and options.
func (s *Simulator) replaceMAC(v string) string {
	parts := strings.Split(v, ",")
	model, _, _ := strings.Cut(parts[0], "=")
	parts[0] = model + "=" + s.newMAC()
	for i, p := range parts[1:] {
		if strings.HasPrefix(p, "macaddr=") {
			parts[i+1] = "macaddr=" + s.newMAC()
		}
	}
	return strings.Join(parts, ",")
}
