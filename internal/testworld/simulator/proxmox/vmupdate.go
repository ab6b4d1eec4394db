package proxmoxsim

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/pkg/provider/proxmox/qemucpu"
)

// handleConfigAsync is POST .../config: checks run synchronously, the
// change is applied by a qmconfig task.
func (s *Simulator) handleConfigAsync(q *apiRequest) (any, error) {
	return s.updateConfig(q, false)
}

// handleConfigSync is PUT .../config: applied before the call returns null.
func (s *Simulator) handleConfigSync(q *apiRequest) (any, error) {
	if q.has("background_delay") {
		return nil, paramError(map[string]string{"background_delay": "property is not defined in schema and the schema does not allow additional properties"})
	}
	return s.updateConfig(q, true)
}

// configMeta are request parameters that are not config keys.
var configMeta = map[string]bool{"node": true, "vmid": true, "delete": true, "revert": true, "digest": true, "skiplock": true, "force": true, "background_delay": true}

// updateConfig mirrors qemu-server's update_vm_api: parameter conflicts
// (400), then under the config lock: load (500 does not exist), digest,
// lock check, boot order and volume checks, then apply (inline for PUT, in
// a worker for POST).
func (s *Simulator) updateConfig(q *apiRequest, sync bool) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	deletes := splitList(q.str("delete"))
	for _, k := range deletes {
		if q.has(k) && !configMeta[k] {
			return nil, paramError(map[string]string{"delete": fmt.Sprintf("you can't use '-%s' and -delete %s' at the same time", k, k)})
		}
	}
	changes := map[string]string{}
	for k, v := range q.params {
		if !configMeta[k] {
			changes[k] = v
		}
	}
	if cpu, ok := changes["cpu"]; ok {
		// The pve-vm-cpu-conf format's check, part of the parameter
		// verification (400): validate_vm_cpu_conf in qemu-server's
		// src/PVE/QemuServer/CPUConfig.pm, per version. The simulator
		// defines no custom CPU model.
		if err := qemucpu.Check(int(s.version()), cpu, nil); err != nil {
			return nil, paramError(map[string]string{"cpu": err.Error()})
		}
	}
	if len(changes) == 0 && len(deletes) == 0 && !q.has("revert") {
		return nil, serverError("no options specified")
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	if d := q.str("digest"); d != "" && d != configDigest(v.conf) {
		return nil, serverError("detected modified configuration - file changed by other user? Try again.")
	}
	// update_vm: deleting the saved state of a VM suspended to disk
	// lifts its lock with it ("'suspended' lock should probably be a
	// state or \"weak\" lock").
	dropState := contains(deletes, "vmstate")
	if !q.boolean("skiplock", false) && (!dropState || v.conf["lock"] != lockSuspended) {
		if err := checkLock(v); err != nil {
			return nil, err
		}
	}
	if val := v.conf["vmstate"]; dropState && val != "" && v.conf["protection"] == "1" {
		return nil, serverError("can't remove vmstate '%s'", val)
	}
	if b, ok := changes["boot"]; ok {
		if p, _ := propertyString(b, "legacy"); p != nil && p["order"] != "" {
			for _, dev := range strings.Split(p["order"], ";") {
				_, inConf := v.conf[dev]
				_, inReq := changes[dev]
				if (!inConf && !inReq) || contains(deletes, dev) {
					return nil, serverError("invalid bootorder: device '%s' does not exist'", dev)
				}
			}
		}
	}
	for k, val := range changes {
		if !driveKeyRE.MatchString(k) {
			continue
		}
		if err := s.checkDriveLocked(v, k, val); err != nil {
			return nil, err
		}
	}
	if sync {
		s.applyConfigLocked(v, changes, deletes, nil)
		return nil, nil
	}
	t := s.newTaskLocked(v.node, "qmconfig", strconv.Itoa(v.vmid), q.auth)
	gen := v
	s.afterLocked(s.cfg.Latency.Config.D(), func(at time.Time) {
		if s.vms[gen.vmid] != gen {
			t.finish(at, fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", gen.node, gen.vmid)) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
			return
		}
		if err := s.taskFaultLocked(classConfig, strconv.Itoa(gen.vmid), ""); err != nil {
			t.finish(at, err)
			return
		}
		s.applyConfigLocked(gen, changes, deletes, t)
		t.finish(at, nil)
	})
	return t.upid, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// checkDriveLocked validates the storage side of a drive value: an ISO must
// exist, new disks need an images storage on the VM's node.
func (s *Simulator) checkDriveLocked(v *vm, key, val string) error {
	if key == tpmKey {
		if err := checkTPMVersionChange(v.conf[key], val); err != nil {
			return err
		}
	}
	d := parseDrive(val)
	if d.file == "none" || d.file == "cdrom" || strings.HasPrefix(d.file, "/dev/") {
		return nil
	}
	sid, rest, _ := strings.Cut(d.file, ":")
	st, err := s.storageOnNodeLocked(sid, v.node)
	if err != nil {
		return err
	}
	switch {
	case rest == "cloudinit":
		// qemu-server's $check_storage_access passes cloud-init drives;
		// the allocation fails later, with a 500.
		if !st.content["images"] {
			return serverError("storage '%s' does not support content-type 'images'", sid)
		}
	case isNewDiskSize(rest):
		// $check_storage_access (src/PVE/API2/Qemu.pm) refuses a new
		// disk on such a storage up front, naming the storage.
		if !st.content["images"] {
			return paramError(map[string]string{"storage": fmt.Sprintf("storage '%s' does not support vm images", sid)})
		}
		// The volume is allocated in the update (create_disks): a
		// storage without the room fails it, and nothing is written.
		gib, _ := strconv.ParseFloat(rest, 64)
		if size := int64(gib * (1 << 30)); st.capacity > 0 && s.storageUsedLocked(st, v.node)+size > st.capacity {
			return serverError("unable to create image: no space left on storage '%s' (%d bytes needed)", sid, size)
		}
	default:
		if st.volumes[volumeKey(st.scope(v.node), d.file)] == nil {
			return serverError("volume '%s' does not exist", d.file)
		}
	}
	return nil
}

func isNewDiskSize(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

// applyConfigLocked writes the change set into the config. Replaced or
// deleted disks become unusedN entries, as in qemu-server.
func (s *Simulator) applyConfigLocked(v *vm, changes map[string]string, deletes []string, t *task) {
	for _, k := range deletes {
		if k == "vmstate" {
			// The volume is freed (if the VM owns it), runningmachine,
			// runningcpu and the "suspended" lock go with it: the VM is
			// a stopped one that boots afresh.
			if v.conf["lock"] == lockSuspended {
				delete(v.conf, "lock")
			}
			s.dropVMStateLocked(v)
			continue
		}
		old, ok := v.conf[k]
		if !ok {
			continue
		}
		delete(v.conf, k)
		if driveKeyRE.MatchString(k) {
			s.detachDriveLocked(v, old)
		}
	}
	keys := sortedKeys(changes)
	for _, k := range keys {
		val := changes[k]
		switch {
		case k == "tags":
			tags, _ := ParseTags(val)
			if tags == "" {
				delete(v.conf, k)
				continue
			}
			v.conf[k] = tags
		case k == "description" && val == "":
			delete(v.conf, k)
		case netKeyRE.MatchString(k):
			v.conf[k] = s.netWithMAC(val)
		case driveKeyRE.MatchString(k):
			if old, ok := v.conf[k]; ok {
				s.detachDriveLocked(v, old)
				if s.real != nil && old != val {
					s.real.ejectLocked(v.vmid, k)
				}
			}
			v.conf[k] = s.allocDriveLocked(v, k, val, t)
		default:
			v.conf[k] = val
		}
	}
}

// netWithMAC adds a generated MAC when only the model was given.
func (s *Simulator) netWithMAC(v string) string {
	parts := strings.Split(v, ",")
	if !strings.Contains(parts[0], "=") {
		hasMac := false
		for _, p := range parts[1:] {
			hasMac = hasMac || strings.HasPrefix(p, "macaddr=")
		}
		if !hasMac {
			parts[0] += "=" + s.newMAC()
		}
	}
	return strings.Join(parts, ",")
}

// allocDriveLocked turns "<storage>:<GiB>" and "<storage>:cloudinit" into
// real volumes.
func (s *Simulator) allocDriveLocked(v *vm, key, val string, t *task) string {
	d := parseDrive(val)
	sid, rest, ok := strings.Cut(d.file, ":")
	if !ok {
		return val
	}
	st := s.storages[sid]
	if st == nil {
		return val
	}
	scope := st.scope(v.node)
	switch {
	case key == tpmKey && isNewDiskSize(rest):
		// A fixed 4 MiB raw volume, named like any disk; the size given
		// is ignored (qemu-server's create_disks).
		d.file = s.newDiskNameLocked(st, scope, v.vmid, "raw")
		s.addVolumeLocked(st, scope, &volume{volid: d.file, content: "images", format: "raw", size: tpmStateSize, vmid: v.vmid})
		delete(d.opts, "format")
		d.keys = slices.DeleteFunc(d.keys, func(k string) bool { return k == "format" })
		d.set("size", formatSize(tpmStateSize))
		if t != nil {
			t.logf("%s: successfully created disk '%s'", key, printTPMState(d))
		}
		return printTPMState(d)
	case rest == "cloudinit":
		d.file = s.cloudInitVolid(st, v.vmid)
		s.addVolumeLocked(st, scope, &volume{volid: d.file, content: "images", format: "raw", size: 4 << 20, vmid: v.vmid})
		d.set("media", "cdrom")
		if t != nil {
			t.logf("%s: successfully created disk '%s,media=cdrom'", key, d.file)
		}
	case isNewDiskSize(rest):
		gib, _ := strconv.ParseFloat(rest, 64)
		format := d.opts["format"]
		if format == "" {
			format = "raw"
			if st.fileBased() {
				format = "qcow2"
			}
		}
		d.file = s.newDiskNameLocked(st, scope, v.vmid, format)
		size := int64(gib * (1 << 30))
		s.addVolumeLocked(st, scope, &volume{volid: d.file, content: "images", format: format, size: size, vmid: v.vmid})
		delete(d.opts, "format")
		var keys []string
		for _, k := range d.keys {
			if k != "format" {
				keys = append(keys, k)
			}
		}
		d.keys = keys
		d.set("size", formatSize(size))
		if t != nil {
			t.logf("%s: successfully created disk '%s'", key, d.String())
		}
	}
	return d.String()
}

// detachDriveLocked handles a drive leaving the config: cloud-init drives
// are freed, disks become unusedN, CD-ROM media are just ejected.
func (s *Simulator) detachDriveLocked(v *vm, old string) {
	d := parseDrive(old)
	if d.file == "none" || d.file == "cdrom" || strings.Contains(d.file, ":iso/") {
		return
	}
	if d.isCloudInit() {
		if st, vol := s.findVolumeLocked(d.file, v.node); vol != nil {
			s.freeVolumeLocked(st, vol)
		}
		return
	}
	for i := 0; ; i++ {
		k := "unused" + strconv.Itoa(i)
		if _, used := v.conf[k]; !used {
			v.conf[k] = d.file
			return
		}
	}
}

var resizeSchema = sch(nodeP, vmidP,
	param{name: "disk", kind: kString, pattern: driveKeyRE},
	param{name: "size", kind: kString, pattern: sizeRE},
	param{name: "digest", kind: kString, optional: true, maxLen: 64},
	param{name: "skiplock", kind: kBool, optional: true},
)

// handleResize is PUT .../resize (task resize; PVE 8+ runs it in a worker,
// so shrinking fails inside the task).
func (s *Simulator) handleResize(q *apiRequest) (any, error) {
	if err := checkSkiplock(q); err != nil {
		return nil, err
	}
	v, err := s.vmOnNodeLocked(q)
	if err != nil {
		return nil, err
	}
	disk, size, digest, skiplock := q.str("disk"), q.str("size"), q.str("digest"), q.boolean("skiplock", false)
	t := s.newTaskLocked(v.node, "resize", strconv.Itoa(v.vmid), q.auth)
	s.afterLocked(s.cfg.Latency.Resize.D(), func(at time.Time) {
		t.finish(at, s.resizeLocked(v, disk, size, digest, skiplock, t))
	})
	return t.upid, nil
}

func (s *Simulator) resizeLocked(v *vm, disk, size, digest string, skiplock bool, t *task) error {
	if s.vms[v.vmid] != v {
		return fmt.Errorf("Configuration file 'nodes/%s/qemu-server/%d.conf' does not exist", v.node, v.vmid) //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if digest != "" && digest != configDigest(v.conf) {
		return fmt.Errorf("detected modified configuration - file changed by other user? Try again.") //nolint:staticcheck,revive // ST1005/error-strings: Proxmox's own message, verbatim on the wire
	}
	if !skiplock {
		if l := v.conf["lock"]; l != "" {
			return fmt.Errorf("VM is locked (%s)", l)
		}
	}
	val, ok := v.conf[disk]
	if !ok {
		return fmt.Errorf("disk '%s' does not exist", disk)
	}
	d := parseDrive(val)
	if d.isCDROM() {
		return fmt.Errorf("you can't resize a cdrom")
	}
	st, vol := s.findVolumeLocked(d.file, v.node)
	if vol == nil {
		return fmt.Errorf("volume '%s' does not exist", d.file)
	}
	n, rel, _ := parseSize(size)
	newSize := n
	if rel {
		newSize = vol.size + n
	}
	if newSize < vol.size {
		return fmt.Errorf("shrinking disks is not supported")
	}
	if newSize == vol.size {
		return nil
	}
	if st.capacity > 0 && s.storageUsedLocked(st, v.node)+newSize-vol.size > st.capacity && !vol.linked {
		return fmt.Errorf("no space left on storage '%s'", st.id)
	}
	t.logf("Image resized.")
	vol.size = newSize
	d.set("size", formatSize(newSize))
	v.conf[disk] = d.String()
	return nil
}
