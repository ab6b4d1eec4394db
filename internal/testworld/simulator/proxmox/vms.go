package proxmoxsim

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// vm is a QEMU guest: its config file plus runtime state.
type vm struct {
	vmid int
	node string
	// conf is the config file: every key as stored, including lock, tags
	// and description.
	conf      map[string]string
	running   bool
	startedAt time.Time
	agentUp   bool
	// bootGen increases on every start and stop so that events scheduled
	// for an earlier boot (agent becoming ready) are ignored.
	bootGen int
	pid     int
	// ipv4 is the address the guest agent reports (and the guest hook is
	// told), allocated on first start.
	ipv4 string
	// image makes the VM a real guest booted by QEMU: set on templates
	// (config or admin API) and inherited by their clones.
	image *GuestImage
	// guestFiles are the files agent/file-write put into a simulated guest
	// that runs no guest program, by path; its next stop empties them.
	guestFiles map[string]guestFile
	// paused: QEMU runs with its vCPUs stopped (a suspend without todisk,
	// qmpause); status/resume continues it.
	paused bool
	// saved is what a suspend to disk kept of the guest beside the memory
	// image on its state volume (suspend.go); nil unless suspended.
	saved *savedGuest
	// pciDevices are the PCI addresses the running VM holds on its node
	// (claimPCIDevicesLocked); a stop frees them.
	pciDevices []string
}

func (v *vm) isTemplate() bool { return v.conf["template"] == "1" }

func (v *vm) cores() int {
	c, _ := strconv.Atoi(v.conf["cores"])
	if c == 0 {
		c = 1
	}
	s, _ := strconv.Atoi(v.conf["sockets"])
	if s == 0 {
		s = 1
	}
	return c * s
}

func (v *vm) memoryMiB() int64 {
	m := memoryRE.FindStringSubmatch(v.conf["memory"])
	if m == nil {
		return 512
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

func (v *vm) memoryBytes() int64 { return v.memoryMiB() << 20 }

// bootDiskSize is the size of the first non-cdrom drive (maxdisk).
func (v *vm) bootDiskSize() int64 {
	for _, k := range driveKeys(v.conf) {
		d := parseDrive(v.conf[k])
		if d.isCDROM() || d.isCloudInit() || k == "efidisk0" || k == tpmKey {
			continue
		}
		if n, _, ok := parseSize(d.opts["size"]); ok {
			return n
		}
	}
	return 0
}

func (s *Simulator) newMAC() string {
	return fmt.Sprintf("BC:24:11:%02X:%02X:%02X", s.rng.Intn(256), s.rng.Intn(256), s.rng.Intn(256))
}

func (s *Simulator) newUUID() string {
	b := make([]byte, 16)
	for i := range b {
		b[i] = byte(s.rng.Intn(256))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// initTemplates creates the configured VMs with their volumes.
func (s *Simulator) initTemplates() error {
	now := s.clock.Now()
	for _, tc := range s.cfg.Templates {
		st := s.storages[tc.Storage]
		scope := st.scope(tc.Node)
		size := int64(tc.DiskSize)
		if size == 0 {
			size = 8 << 30
		}
		format := tc.Format
		if format == "" {
			format = "raw"
			if st.fileBased() {
				format = "qcow2"
			}
		}
		prefix := "base"
		if tc.NotTemplate {
			prefix = "vm"
		}
		name := fmt.Sprintf("%s-%d-disk-0", prefix, tc.VMID)
		volid := st.id + ":" + name
		if st.fileBased() {
			volid = fmt.Sprintf("%s:%d/%s.%s", st.id, tc.VMID, name, format)
		}
		s.addVolumeLocked(st, scope, &volume{volid: volid, content: "images", format: format, size: size, vmid: tc.VMID, ctime: now.Unix()})
		cores, mem := tc.Cores, tc.MemoryMiB
		if cores == 0 {
			cores = 1
		}
		if mem == 0 {
			mem = 1024
		}
		conf := map[string]string{
			"cores": strconv.Itoa(cores), "sockets": "1", "memory": strconv.Itoa(mem),
			"scsihw": "virtio-scsi-single", "ostype": "l26", "boot": "order=scsi0;net0",
			"scsi0":   fmt.Sprintf("%s,iothread=1,size=%s", volid, formatSize(size)),
			"net0":    fmt.Sprintf("virtio=%s,bridge=vmbr0", s.newMAC()),
			"smbios1": "uuid=" + s.newUUID(), "vmgenid": s.newUUID(),
			"meta": fmt.Sprintf("creation-qemu=9.2.0,ctime=%d", now.Unix()),
		}
		if tc.Name != "" {
			conf["name"] = tc.Name
		}
		if tc.Agent {
			conf["agent"] = "1"
		}
		if !tc.NotTemplate {
			conf["template"] = "1"
		}
		if tc.Tags != "" {
			tags, err := ParseTags(tc.Tags)
			if err != nil {
				return fmt.Errorf("template %d tags %q: %w", tc.VMID, tc.Tags, err)
			}
			conf["tags"] = tags
		}
		if tc.Description != "" {
			conf["description"] = tc.Description
		}
		if tc.CloudInitStorage != "" {
			cst := s.storages[tc.CloudInitStorage]
			civol := s.cloudInitVolid(cst, tc.VMID)
			s.addVolumeLocked(cst, cst.scope(tc.Node), &volume{volid: civol, content: "images", format: "raw", size: 4 << 20, vmid: tc.VMID})
			conf["ide2"] = civol + ",media=cdrom"
		}
		if tc.TPMVersion != "" {
			tpmVol := strings.Replace(volid, "-disk-0", "-disk-1", 1)
			tpmVol = strings.TrimSuffix(tpmVol, "."+format)
			if st.fileBased() {
				tpmVol += ".raw"
			}
			s.addVolumeLocked(st, scope, &volume{volid: tpmVol, content: "images", format: "raw", size: tpmStateSize, vmid: tc.VMID, ctime: now.Unix()})
			conf[tpmKey] = fmt.Sprintf("%s,size=%s,version=%s", tpmVol, formatSize(tpmStateSize), tc.TPMVersion)
		}
		for k, v := range tc.Config {
			conf[k] = v
		}
		s.vms[tc.VMID] = &vm{vmid: tc.VMID, node: tc.Node, conf: conf, image: tc.GuestImage}
	}
	return nil
}

func (s *Simulator) cloudInitVolid(st *storage, vmid int) string {
	if st.fileBased() {
		return fmt.Sprintf("%s:%d/vm-%d-cloudinit.qcow2", st.id, vmid, vmid)
	}
	return fmt.Sprintf("%s:vm-%d-cloudinit", st.id, vmid)
}

// vmOnNodeLocked loads the config of the VM named by the request. Config
// files are node-local, so a VM on another node "does not exist" here.
func (s *Simulator) vmOnNodeLocked(q *apiRequest) (*vm, error) {
	id := int(q.integer("vmid", 0))
	nodeName := q.vars["node"]
	v := s.vms[id]
	if v == nil || v.node != nodeName {
		return nil, serverError("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", nodeName, id)
	}
	return v, nil
}

// checkLock is PVE::QemuConfig->check_lock.
func checkLock(v *vm) error {
	if l := v.conf["lock"]; l != "" {
		return serverError("VM is locked (%s)", l)
	}
	return nil
}

// checkSkiplock rejects skiplock from anyone but root@pam.
func checkSkiplock(q *apiRequest) error {
	if q.boolean("skiplock", false) && (q.auth == nil || q.auth.userString() != "root@pam") {
		return paramError(map[string]string{"skiplock": "Only root may use this option."})
	}
	return nil
}

// handleGetConfig is GET /nodes/{node}/qemu/{vmid}/config.
func (s *Simulator) handleGetConfig(q *apiRequest) (any, error) {
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	return typedConfig(v.conf), nil
}

// handleGetPending is GET .../pending: the simulator applies changes at
// once, so every key is current with no pending value.
func (s *Simulator) handleGetPending(q *apiRequest) (any, error) {
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	tc := typedConfig(v.conf)
	for _, k := range sortedKeys(tc) {
		if k == "digest" {
			continue
		}
		out = append(out, map[string]any{"key": k, "value": tc[k]})
	}
	return out, nil
}

// vmStatus is the vmstatus() hash used by status/current and the qemu list.
func (s *Simulator) vmStatus(v *vm) map[string]any {
	now := s.clock.Now()
	st := map[string]any{
		"vmid": v.vmid, "status": "stopped", "qmpstatus": "stopped", "cpus": v.cores(), "maxmem": v.memoryBytes(),
		"mem": 0, "maxdisk": v.bootDiskSize(), "disk": 0, "uptime": 0, "cpu": 0,
		"netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0, "ha": map[string]any{"managed": 0},
	}
	if n := v.conf["name"]; n != "" {
		st["name"] = n
	} else {
		st["name"] = fmt.Sprintf("VM %d", v.vmid)
	}
	if v.running {
		st["status"], st["qmpstatus"] = "running", "running"
		if v.paused {
			st["qmpstatus"] = "paused"
		}
		st["pid"] = v.pid
		st["uptime"] = int64(now.Sub(v.startedAt).Seconds())
		st["mem"] = v.memoryBytes() / 3
		st["cpu"] = 0.01
		st["running-machine"] = "pc-i440fx-9.2+pve1"
		st["running-qemu"] = "9.2.0"
	}
	if l := v.conf["lock"]; l != "" {
		st["lock"] = l
	}
	if v.isTemplate() {
		st["template"] = 1
	}
	if t := v.conf["tags"]; t != "" {
		st["tags"] = t
	}
	if agentEnabled(v.conf["agent"]) {
		st["agent"] = 1
	}
	return st
}

// handleStatusCurrent is GET .../status/current.
func (s *Simulator) handleStatusCurrent(q *apiRequest) (any, error) {
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	return s.vmStatus(v), nil
}

// handleListVMs is GET /nodes/{node}/qemu.
func (s *Simulator) handleListVMs(q *apiRequest) (any, error) {
	ids := []int{}
	for id, v := range s.vms {
		if v.node == q.vars["node"] && s.allowedLocked(q, "vm", map[string]string{"vmid": strconv.Itoa(id)}) {
			ids = append(ids, id)
		}
	}
	sort.Ints(ids)
	out := make([]map[string]any, 0, len(ids))
	for _, id := range ids {
		out = append(out, s.vmStatus(s.vms[id]))
	}
	return out, nil
}

// volumesOwnedLocked lists the volumes a VM's config references that the
// VM owns (disks, cloud-init drive, unused), i.e. what destroy frees.
func (s *Simulator) volumesOwnedLocked(v *vm) []string {
	var vols []string
	for k, val := range v.conf {
		// destroy_vm frees the saved state with the disks (extra_keys
		// vmstate).
		if !driveKeyRE.MatchString(k) && !unusedRE.MatchString(k) && k != "vmstate" {
			continue
		}
		d := parseDrive(val)
		if d.file == "none" || d.file == "cdrom" || strings.Contains(d.file, ":iso/") {
			continue
		}
		vols = append(vols, d.file)
	}
	sort.Strings(vols)
	return vols
}

// sortedVMIDsLocked lists every VM id in ascending order, as Proxmox lists
// resources.
func (s *Simulator) sortedVMIDsLocked() []int {
	ids := make([]int, 0, len(s.vms))
	for id := range s.vms {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}
