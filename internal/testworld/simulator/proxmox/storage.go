package proxmoxsim

import (
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
)

type storage struct {
	id       string
	typ      string
	content  map[string]bool
	shared   bool
	capacity int64
	nodes    map[string]bool // nil: every node
	path     string
	disabled bool
	// volumes by volumeKey(scope, volid); scope is "" on shared storages
	// and the node name on local ones (local-lvm on pve1 and on pve2 are
	// different disks).
	volumes map[string]*volume
}

type volume struct {
	volid   string
	scope   string
	content string // images, iso, vztmpl, import, rootdir
	format  string
	size    int64
	vmid    int
	ctime   int64
	data    []byte // uploaded file contents
	// file, when set, holds the volume's content on the host instead of
	// data (a real guest's saved state: realguest_suspend.go); it goes
	// with the volume (freeVolumeLocked).
	file string
	// linked volumes share blocks with their base and use no space.
	linked bool
}

func volumeKey(scope, volid string) string { return scope + "|" + volid }

func (s *Simulator) initStorages() {
	for _, sc := range s.cfg.Storages {
		st := &storage{
			id: sc.ID, typ: sc.Type, content: map[string]bool{}, shared: sc.Shared, capacity: int64(sc.Capacity),
			path: sc.Path, disabled: sc.Disabled, volumes: map[string]*volume{},
		}
		for _, c := range sc.Content {
			st.content[c] = true
		}
		if len(sc.Nodes) > 0 {
			st.nodes = map[string]bool{}
			for _, n := range sc.Nodes {
				st.nodes[n] = true
			}
		}
		if st.capacity == 0 {
			st.capacity = 100 << 30
		}
		if st.path == "" && st.fileBased() {
			st.path = "/mnt/pve/" + st.id
		}
		s.storages[st.id] = st
		s.storeOrder = append(s.storeOrder, st.id)
	}
}

// fileBased storages have a path and accept uploads.
func (st *storage) fileBased() bool {
	switch st.typ {
	case "dir", "nfs", "cifs", "cephfs", "btrfs", "glusterfs":
		return true
	}
	return false
}

// supportsLinkedClone reports whether a base volume of format on this
// storage can be the parent of a linked clone. Thick LVM cannot.
func (st *storage) supportsLinkedClone(format string) bool {
	switch st.typ {
	case "lvmthin", "zfspool", "rbd":
		return true
	case "dir", "nfs", "cifs", "glusterfs", "btrfs":
		return format == "qcow2" || format == "raw" || format == "vmdk"
	}
	return false
}

func (st *storage) availableOn(nodeName string) bool {
	return st.nodes == nil || st.nodes[nodeName]
}

func (st *storage) scope(nodeName string) string {
	if st.shared {
		return ""
	}
	return nodeName
}

func (st *storage) contentString() string {
	return strings.Join(sortedKeys(st.content), ",")
}

// lockName is the storage lock a clone takes: a cluster-wide cfs lock for
// shared storages, a node-local flock otherwise.
func (st *storage) lockKey(nodeName string) string {
	if st.shared {
		return "cfs:" + st.id
	}
	return nodeName + ":" + st.id
}

// lockTimeoutError is the real message of a storage lock wait that ran out.
func (st *storage) lockTimeoutError() string {
	if st.shared {
		return fmt.Sprintf("cfs-lock 'storage-%s' error: got lock request timeout", st.id)
	}
	return fmt.Sprintf("can't lock file '/var/lock/pve-manager/pve-storage-%s' - got timeout", st.id)
}

func (s *Simulator) storageUsedLocked(st *storage, nodeName string) int64 {
	var used int64
	scope := st.scope(nodeName)
	for _, v := range st.volumes {
		if v.scope == scope && !v.linked {
			used += v.size
		}
	}
	return used
}

// storageOnNodeLocked resolves a storage for a node-scoped endpoint.
func (s *Simulator) storageOnNodeLocked(id, nodeName string) (*storage, error) {
	st := s.storages[id]
	if st == nil {
		return nil, serverError("storage '%s' does not exist", id)
	}
	if !st.availableOn(nodeName) {
		return nil, serverError("storage '%s' is not available on node '%s'", id, nodeName)
	}
	if st.disabled {
		return nil, serverError("storage '%s' is disabled", id)
	}
	return st, nil
}

// newVolumeName returns the next free vm-<vmid>-disk-N name on a storage.
func (s *Simulator) newDiskNameLocked(st *storage, scope string, vmid int, format string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("vm-%d-disk-%d", vmid, i)
		volid := st.id + ":" + name
		if st.fileBased() {
			volid = fmt.Sprintf("%s:%d/%s.%s", st.id, vmid, name, format)
		}
		if st.volumes[volumeKey(scope, volid)] == nil {
			return volid
		}
	}
}

func (s *Simulator) addVolumeLocked(st *storage, scope string, v *volume) {
	v.scope = scope
	if v.ctime == 0 {
		v.ctime = s.clock.Now().Unix()
	}
	st.volumes[volumeKey(scope, v.volid)] = v
}

// freeVolumeLocked removes vol from st, and its file from the host.
func (s *Simulator) freeVolumeLocked(st *storage, vol *volume) {
	delete(st.volumes, volumeKey(vol.scope, vol.volid))
	if vol.file == "" {
		return
	}
	if err := os.Remove(vol.file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("Cannot remove the file of a freed volume", "volume", vol.volid, "file", vol.file, "err", err)
	}
}

// findVolumeLocked finds volid as seen from nodeName.
func (s *Simulator) findVolumeLocked(volid, nodeName string) (*storage, *volume) {
	sid, _, ok := strings.Cut(volid, ":")
	if !ok {
		return nil, nil
	}
	st := s.storages[sid]
	if st == nil {
		return nil, nil
	}
	return st, st.volumes[volumeKey(st.scope(nodeName), volid)]
}

func storageEntry(s *Simulator, st *storage, nodeName string) map[string]any {
	used := s.storageUsedLocked(st, nodeName)
	e := map[string]any{
		"storage": st.id, "type": st.typ, "content": st.contentString(), "active": 1,
		"enabled": boolInt(!st.disabled), "shared": boolInt(st.shared),
		"total": st.capacity, "used": used, "avail": st.capacity - used,
		"used_fraction": float64(used) / float64(st.capacity),
	}
	return e
}

// handleNodeStorages is GET /nodes/{node}/storage.
func (s *Simulator) handleNodeStorages(q *apiRequest) (any, error) {
	nodeName := q.vars["node"]
	var want []string
	if c := q.str("content"); c != "" {
		want = splitList(c)
	}
	out := []map[string]any{}
	for _, id := range s.storeOrder {
		st := s.storages[id]
		if !st.availableOn(nodeName) {
			continue
		}
		if q.has("storage") && q.str("storage") != id {
			continue
		}
		if q.boolean("enabled", false) && st.disabled {
			continue
		}
		if !s.allowedLocked(q, "storage", map[string]string{"storage": id}) {
			continue
		}
		if len(want) > 0 {
			match := false
			for _, c := range want {
				match = match || st.content[c]
			}
			if !match {
				continue
			}
		}
		out = append(out, storageEntry(s, st, nodeName))
	}
	return out, nil
}

// handleStorageStatus is GET /nodes/{node}/storage/{storage}/status.
func (s *Simulator) handleStorageStatus(q *apiRequest) (any, error) {
	nodeName := q.vars["node"]
	st := s.storages[q.vars["storage"]]
	if st == nil {
		return nil, serverError("storage '%s' does not exist", q.vars["storage"])
	}
	if !st.availableOn(nodeName) {
		return nil, serverError("storage '%s' is not available on node '%s'", st.id, nodeName)
	}
	e := storageEntry(s, st, nodeName)
	delete(e, "storage")
	delete(e, "used_fraction")
	return e, nil
}

func volumeEntry(v *volume) map[string]any {
	e := map[string]any{"volid": v.volid, "format": v.format, "size": v.size, "content": v.content, "ctime": v.ctime}
	if v.vmid != 0 {
		e["vmid"] = v.vmid
	}
	return e
}

// handleListContent is GET /nodes/{node}/storage/{storage}/content.
func (s *Simulator) handleListContent(q *apiRequest) (any, error) {
	st, err := s.storageOnNodeLocked(q.vars["storage"], q.vars["node"])
	if err != nil {
		return nil, err
	}
	scope := st.scope(q.vars["node"])
	out := []map[string]any{}
	keys := sortedKeys(st.volumes)
	for _, k := range keys {
		v := st.volumes[k]
		if v.scope != scope {
			continue
		}
		if c := q.str("content"); c != "" && c != v.content {
			continue
		}
		if q.has("vmid") && int64(v.vmid) != q.integer("vmid", 0) {
			continue
		}
		out = append(out, volumeEntry(v))
	}
	return out, nil
}

// qualifyVolume accepts "local:iso/x.iso" or just "iso/x.iso".
func qualifyVolume(storageID, vol string) (string, error) {
	sid, _, ok := strings.Cut(vol, ":")
	if !ok {
		return storageID + ":" + vol, nil
	}
	if sid != storageID {
		return "", serverError("storage ID mismatch ('%s' != '%s')", sid, storageID)
	}
	return vol, nil
}

func (st *storage) volumePath(v string) string {
	_, name, _ := strings.Cut(v, ":")
	switch {
	case strings.HasPrefix(name, "iso/"):
		return path.Join(st.path, "template", "iso", strings.TrimPrefix(name, "iso/"))
	case strings.HasPrefix(name, "vztmpl/"):
		return path.Join(st.path, "template", "cache", strings.TrimPrefix(name, "vztmpl/"))
	case strings.HasPrefix(name, "import/"):
		return path.Join(st.path, "import", strings.TrimPrefix(name, "import/"))
	case strings.HasPrefix(name, "snippets/"):
		return path.Join(st.path, name)
	case st.fileBased():
		return path.Join(st.path, "images", name)
	}
	return "/dev/" + st.id + "/" + name
}

// handleGetContent is GET /nodes/{node}/storage/{storage}/content/{volume}.
func (s *Simulator) handleGetContent(q *apiRequest) (any, error) {
	st, err := s.storageOnNodeLocked(q.vars["storage"], q.vars["node"])
	if err != nil {
		return nil, err
	}
	volid, err := qualifyVolume(st.id, q.vars["volume"])
	if err != nil {
		return nil, err
	}
	v := st.volumes[volumeKey(st.scope(q.vars["node"]), volid)]
	if v == nil {
		return nil, serverError("volume '%s' does not exist", volid)
	}
	return map[string]any{"path": st.volumePath(volid), "size": v.size, "used": v.size, "format": v.format}, nil
}

// handleDeleteContent is DELETE /nodes/{node}/storage/{storage}/content/{volume}
// (task imgdel). A missing file fails inside the task, like unlink does.
func (s *Simulator) handleDeleteContent(q *apiRequest) (any, error) {
	nodeName := q.vars["node"]
	st, err := s.storageOnNodeLocked(q.vars["storage"], nodeName)
	if err != nil {
		return nil, err
	}
	volid, err := qualifyVolume(st.id, q.vars["volume"])
	if err != nil {
		return nil, err
	}
	t := s.newTaskLocked(nodeName, "imgdel", "", q.auth)
	key := volumeKey(st.scope(nodeName), volid)
	s.afterLocked(0, func(at time.Time) {
		if err := s.taskFaultLocked(classStorage, "", st.id); err != nil {
			t.finish(at, err)
			return
		}
		vol := st.volumes[key]
		if vol == nil {
			t.finish(at, fmt.Errorf("unlink '%s' failed - No such file or directory", st.volumePath(volid)))
			return
		}
		s.freeVolumeLocked(st, vol)
		t.logf("Removed volume '%s'", volid)
		t.finish(at, nil)
	})
	return t.upid, nil
}

var uploadSchema = sch(nodeP, storageP,
	param{name: "content", kind: kString, enum: []string{"iso", "vztmpl", "import"}},
	param{name: "filename", kind: kString, maxLen: 255},
	param{name: "checksum", kind: kString, optional: true},
	param{name: "checksum-algorithm", kind: kString, optional: true, enum: []string{"md5", "sha1", "sha224", "sha256", "sha384", "sha512"}},
	param{name: "tmpfilename", kind: kString, optional: true, pattern: regexp.MustCompile(`^/var/tmp/pveupload-[0-9a-f]+$`)},
)

var (
	isoExtRE    = regexp.MustCompile(`(?i)[^/]+\.(?:iso|img)$`)
	vztmplExtRE = regexp.MustCompile(`[^/]+\.tar\.(?:gz|xz|zst|bz2)$`)
	importExtRE = regexp.MustCompile(`[^/]+\.(?:ova|ovf|qcow2|raw|vmdk)$`)
	unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9_.\-]`)
)

// normalizeContentFilename drops directories and replaces every character
// outside [a-zA-Z0-9_.-] with '_', as PVE::Storage does.
func normalizeContentFilename(name string) string {
	name = strings.TrimRight(name, "\n")
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	return unsafeChars.ReplaceAllString(name, "_")
}

// handleUpload is POST /nodes/{node}/storage/{storage}/upload (task imgcopy).
func (s *Simulator) handleUpload(q *apiRequest) (any, error) {
	nodeName := q.vars["node"]
	st, err := s.storageOnNodeLocked(q.vars["storage"], nodeName)
	if err != nil {
		return nil, err
	}
	if !st.fileBased() {
		return nil, serverError("can't upload to storage type '%s'", st.typ)
	}
	content := q.str("content")
	filename := normalizeContentFilename(q.str("filename"))
	var dir string
	switch content {
	case "iso":
		if !isoExtRE.MatchString(filename) {
			return nil, paramError(map[string]string{"filename": "wrong file extension"})
		}
		dir = "iso/"
	case "vztmpl":
		if !vztmplExtRE.MatchString(filename) {
			return nil, paramError(map[string]string{"filename": "wrong file extension"})
		}
		dir = "vztmpl/"
	case "import":
		if !importExtRE.MatchString(filename) {
			return nil, paramError(map[string]string{"filename": "invalid filename or wrong extension"})
		}
		dir = "import/"
	}
	if !st.content[content] {
		return nil, serverError("storage '%s' does not support '%s' content", st.id, content)
	}
	if q.file == nil {
		return nil, paramError(map[string]string{"filename": "property is missing and it is not optional"})
	}
	var sum string
	if alg := q.str("checksum-algorithm"); alg != "" || q.has("checksum") {
		if alg == "" || !q.has("checksum") {
			return nil, paramError(map[string]string{"checksum": "'checksum' and 'checksum-algorithm' need to be specified together"})
		}
		sum = checksum(alg, q.file.data)
	}
	data := append([]byte(nil), q.file.data...)
	volid := st.id + ":" + dir + filename
	t := s.newTaskLocked(nodeName, "imgcopy", "", q.auth)
	t.logf("starting file import from: /var/tmp/pveupload-%x", sha1.Sum([]byte(volid)))
	want := strings.ToLower(q.str("checksum"))
	s.afterLocked(s.cfg.Latency.Upload.D(), func(at time.Time) {
		if err := s.taskFaultLocked(classUpload, "", st.id); err != nil {
			t.finish(at, err)
			return
		}
		if sum != "" {
			t.logf("calculating checksum...")
			if sum != want {
				t.finish(at, fmt.Errorf("checksum mismatch: got '%s' != expect '%s'", sum, want))
				return
			}
			t.logf("checksum verified")
		}
		t.logf("target node: %s", nodeName)
		t.logf("target file: %s", st.volumePath(volid))
		t.logf("file size is: %d", len(data))
		s.addVolumeLocked(st, st.scope(nodeName), &volume{
			volid: volid, content: content, format: formatOf(content, filename), size: int64(len(data)), data: data,
		})
		t.finish(at, nil)
	})
	return t.upid, nil
}

func formatOf(content, filename string) string {
	switch content {
	case "iso":
		return "iso"
	case "vztmpl":
		return "tgz"
	}
	if i := strings.LastIndex(filename, "."); i >= 0 {
		return filename[i+1:]
	}
	return "raw"
}

func checksum(alg string, data []byte) string {
	var h hash.Hash
	switch alg {
	case "md5":
		h = md5.New()
	case "sha1":
		h = sha1.New()
	case "sha224":
		h = sha256.New224()
	case "sha256":
		h = sha256.New()
	case "sha384":
		h = sha512.New384()
	default:
		h = sha512.New()
	}
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// splitList splits Proxmox list values on ',', ';', spaces and NULs.
func splitList(v string) []string {
	f := strings.FieldsFunc(v, func(r rune) bool { return r == ',' || r == ';' || r == ' ' || r == '\t' || r == '\n' || r == 0 })
	return f
}

// sortedVolumes lists a storage's volumes by scope, then volume id, for
// the state dump.
func sortedVolumes(st *storage) []*volume {
	out := make([]*volume, 0, len(st.volumes))
	for _, v := range st.volumes {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].scope != out[j].scope {
			return out[i].scope < out[j].scope
		}
		return out[i].volid < out[j].volid
	})
	return out
}
