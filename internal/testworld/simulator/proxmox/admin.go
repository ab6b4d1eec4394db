package proxmoxsim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// adminPrefix is reserved for the simulator's own admin API; Proxmox has
// nothing under it.
const adminPrefix = "/_sim/"

// State is a complete dump of the simulator's state. It includes every VM
// config, description and tag and the contents of uploaded files, so that
// security tests can scan for secrets that leaked to the hypervisor.
type State struct {
	Time     time.Time      `json:"time"`
	Nodes    []NodeState    `json:"nodes"`
	VMs      []VMState      `json:"vms"`
	Storages []StorageState `json:"storages"`
	Tasks    []TaskState    `json:"tasks"`
	Pools    []PoolState    `json:"pools"`
}

// NodeState is one node in a State dump.
type NodeState struct {
	Name     string `json:"name"`
	Online   bool   `json:"online"`
	MemTotal int64  `json:"memTotal"`
	MemUsed  int64  `json:"memUsed"`
}

// VMState is one VM in a State dump.
type VMState struct {
	VMID        int               `json:"vmid"`
	Node        string            `json:"node"`
	Name        string            `json:"name,omitempty"`
	Status      string            `json:"status"`
	AgentUp     bool              `json:"agentUp"`
	Template    bool              `json:"template"`
	Lock        string            `json:"lock,omitempty"`
	Tags        string            `json:"tags,omitempty"`
	Description string            `json:"description,omitempty"`
	IPv4        string            `json:"ipv4,omitempty"`
	Config      map[string]string `json:"config"`
	// GuestImage is set on real guests (see GuestImage).
	GuestImage *GuestImage `json:"guestImage,omitempty"`
}

// StorageState is one storage in a State dump.
type StorageState struct {
	ID      string        `json:"id"`
	Type    string        `json:"type"`
	Shared  bool          `json:"shared"`
	Volumes []VolumeState `json:"volumes"`
}

// VolumeState is one volume. Data holds uploaded bytes (base64 in JSON);
// Files holds the files inside an uploaded ISO, as text.
type VolumeState struct {
	VolID   string `json:"volid"`
	Node    string `json:"node,omitempty"`
	Content string `json:"content"`
	Format  string `json:"format"`
	Size    int64  `json:"size"`
	VMID    int    `json:"vmid,omitempty"`
	Linked  bool   `json:"linked,omitempty"`
	Data    []byte `json:"data,omitempty"`
	// File is the host file that holds the content instead of Data (a
	// real guest's saved state).
	File  string            `json:"file,omitempty"`
	Files map[string]string `json:"files,omitempty"`
}

// TaskState is one task in a State dump.
type TaskState struct {
	UPID       string   `json:"upid"`
	Type       string   `json:"type"`
	ID         string   `json:"id"`
	Running    bool     `json:"running"`
	ExitStatus string   `json:"exitstatus,omitempty"`
	Log        []string `json:"log"`
}

// PoolState is one pool in a State dump.
type PoolState struct {
	ID      string `json:"id"`
	Comment string `json:"comment,omitempty"`
	Members []int  `json:"members"`
}

// State returns a deep copy of the current state.
func (s *Simulator) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runDueLocked()
	st := State{Time: s.clock.Now()}
	for _, name := range s.nodeOrder {
		n := s.nodes[name]
		st.Nodes = append(st.Nodes, NodeState{Name: name, Online: n.online, MemTotal: n.memTotal, MemUsed: s.memUsedLocked(n)})
	}
	st.VMs = s.vmsLocked()
	for _, sid := range s.storeOrder {
		so := s.storages[sid]
		ss := StorageState{ID: sid, Type: so.typ, Shared: so.shared, Volumes: []VolumeState{}}
		for _, vol := range sortedVolumes(so) {
			vs := VolumeState{VolID: vol.volid, Node: vol.scope, Content: vol.content, Format: vol.format, Size: vol.size,
				VMID: vol.vmid, Linked: vol.linked, Data: append([]byte(nil), vol.data...), File: vol.file}
			if vol.content == "iso" && len(vol.data) > 0 {
				if files, err := readISOFiles(vol.data); err == nil {
					vs.Files = map[string]string{}
					for name, content := range files {
						vs.Files[name] = string(content)
					}
				}
			}
			ss.Volumes = append(ss.Volumes, vs)
		}
		st.Storages = append(st.Storages, ss)
	}
	for _, upid := range s.taskOrder {
		t := s.tasks[upid]
		st.Tasks = append(st.Tasks, TaskState{UPID: upid, Type: t.typ, ID: t.id, Running: t.running, ExitStatus: t.exitstatus, Log: append([]string(nil), t.log...)})
	}
	for _, id := range sortedKeys(s.pools) {
		p := s.pools[id]
		ps := PoolState{ID: id, Comment: p.comment, Members: []int{}}
		for m := range p.members {
			ps.Members = append(ps.Members, m)
		}
		sort.Ints(ps.Members)
		st.Pools = append(st.Pools, ps)
	}
	return st
}

// VMs returns a copy of the VMs' part of State, by VM id: for a test
// that polls the VMs, State copies every volume's bytes, reads every ISO
// and copies every task's log, all under the simulator's lock, which
// holds up its API for as long.
func (s *Simulator) VMs() []VMState {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runDueLocked()
	return s.vmsLocked()
}

// VolumeIDs returns the ids of the volumes whose content type is content
// ("iso", "images"), storage by storage, without their bytes.
func (s *Simulator) VolumeIDs(content string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runDueLocked()
	var out []string
	for _, sid := range s.storeOrder {
		for _, vol := range sortedVolumes(s.storages[sid]) {
			if vol.content == content {
				out = append(out, vol.volid)
			}
		}
	}
	return out
}

// vmsLocked copies the VMs, by VM id.
func (s *Simulator) vmsLocked() []VMState {
	var out []VMState
	for _, id := range s.sortedVMIDsLocked() {
		v := s.vms[id]
		conf := make(map[string]string, len(v.conf))
		for k, val := range v.conf {
			conf[k] = val
		}
		status := "stopped"
		if v.running {
			status = "running"
		}
		out = append(out, VMState{
			VMID: id, Node: v.node, Name: v.conf["name"], Status: status, AgentUp: v.agentUp, Template: v.isTemplate(),
			Lock: v.conf["lock"], Tags: v.conf["tags"], Description: v.conf["description"], IPv4: v.ipv4, Config: conf,
			GuestImage: v.image,
		})
	}
	return out
}

// GuestPowerOff powers a running VM off as if its guest had shut down
// (no task; the VM simply stops, like after an in-guest poweroff).
func (s *Simulator) GuestPowerOff(vmid int) error {
	return s.onVM(vmid, func(v *vm) error {
		if !v.running {
			return fmt.Errorf("VM %d is not running", vmid)
		}
		s.powerOffLocked(v)
		return nil
	})
}

// onVM runs f on VM vmid with the state current and locked.
func (s *Simulator) onVM(vmid int, f func(v *vm) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runDueLocked()
	v := s.vms[vmid]
	if v == nil {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	return f(v)
}

// Unlock is `qm unlock <vmid>` run by an admin on the VM's node: the
// config's lock is removed, whatever it was (a suspend to disk that failed
// leaves "lock: suspending" for exactly this).
func (s *Simulator) Unlock(vmid int) error {
	return s.onVM(vmid, func(v *vm) error {
		delete(v.conf, "lock")
		return nil
	})
}

// SetGuestImage marks VM vmid (a template, usually) as a real guest booted
// from img, or, with nil, as a simulated one again. Clones made afterwards
// inherit it; running VMs keep what they booted with until restarted.
func (s *Simulator) SetGuestImage(vmid int, img *GuestImage) error {
	if img != nil {
		if err := img.validate(); err != nil {
			return err
		}
		c := *img
		img = &c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.vms[vmid]
	if v == nil {
		return fmt.Errorf("VM %d does not exist", vmid)
	}
	v.image = img
	return nil
}

// Console returns the console output of VM vmid's guest, real (its serial
// port) or simulated (the guest program's output), kept until the VM is
// destroyed.
func (s *Simulator) Console(vmid int) ([]byte, error) {
	s.mu.Lock()
	v := s.vms[vmid]
	var dir string
	switch {
	case v == nil:
	case v.image != nil && s.real != nil:
		dir = s.real.vmDir(vmid)
	case v.image == nil && s.guest != nil:
		dir = filepath.Join(s.guest.baseDir, fmt.Sprintf("vm-%d", vmid))
	}
	s.mu.Unlock()
	if v == nil {
		return nil, fmt.Errorf("VM %d does not exist", vmid)
	}
	if dir == "" {
		return nil, fmt.Errorf("VM %d has not booted a guest", vmid)
	}
	data, err := os.ReadFile(filepath.Join(dir, "console.log"))
	if err != nil {
		return nil, fmt.Errorf("VM %d console: %w", vmid, err)
	}
	return data, nil
}

// Latency returns the current latency model.
func (s *Simulator) Latency() Latency {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Latency
}

// Faults returns the current fault configuration.
func (s *Simulator) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Faults
}

// serveAdmin serves /_sim/. JSON in, JSON out; errors are plain text.
//
//	GET  /_sim/state                  complete state (State)
//	GET  /_sim/latency, PUT /_sim/latency   latency model (Latency)
//	GET  /_sim/faults,  PUT /_sim/faults    fault injection (Faults)
//	PUT  /_sim/timings                {"authFailureDelay":"0s","storageLockTimeout":"10s"}
//	POST /_sim/nodes/{node}/offline | /online
//	POST /_sim/vms/{vmid}/poweroff     guest-initiated power-off
//	PUT  /_sim/vms/{vmid}/guest-image  mark a template as a real guest (GuestImage); DELETE unmarks
//	GET  /_sim/vms/{vmid}/console      the guest's console output
//	POST /_sim/refresh                 take a /cluster/resources sample now
//	POST /_sim/clock/advance?by=5s     only with a FakeClock
//	POST /_sim/pveum                   ["role","add",...]: a pveum command line (Pveum); its output, or 400 and pveum's error
func (s *Simulator) serveAdmin(w http.ResponseWriter, r *http.Request) {
	if !s.admin {
		http.NotFound(w, r)
		return
	}
	if !loopbackPeer(r) {
		http.Error(w, "the simulator's admin API answers loopback clients only", http.StatusForbidden)
		return
	}
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, adminPrefix), "/"), "/")
	route := r.Method + " " + strings.Join(parts, "/")
	fail := func(code int, err error) { http.Error(w, err.Error(), code) }
	switch {
	case route == "GET state":
		writeJSON(w, s.State())
	case route == "GET latency":
		writeJSON(w, s.Latency())
	case route == "PUT latency":
		var l Latency
		if err := json.NewDecoder(r.Body).Decode(&l); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decode latency: %w", err))
			return
		}
		s.SetLatency(l)
		writeJSON(w, s.Latency())
	case route == "POST pveum":
		var args []string
		if err := json.NewDecoder(r.Body).Decode(&args); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decode pveum's arguments (a JSON list): %w", err))
			return
		}
		out, err := s.Pveum(args)
		if err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, out)
	case route == "GET faults":
		writeJSON(w, s.Faults())
	case route == "PUT faults":
		var f Faults
		if err := json.NewDecoder(r.Body).Decode(&f); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decode faults: %w", err))
			return
		}
		if err := s.SetFaults(f); err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		writeJSON(w, s.Faults())
	case route == "PUT timings":
		var t struct {
			AuthFailureDelay   Duration `json:"authFailureDelay"`
			StorageLockTimeout Duration `json:"storageLockTimeout"`
		}
		s.mu.Lock()
		t.AuthFailureDelay, t.StorageLockTimeout = s.cfg.AuthFailureDelay, s.cfg.StorageLockTimeout
		s.mu.Unlock()
		if err := json.NewDecoder(r.Body).Decode(&t); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decode timings: %w", err))
			return
		}
		s.SetTimings(t.AuthFailureDelay.D(), t.StorageLockTimeout.D())
		writeJSON(w, t)
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "nodes" && (parts[2] == "online" || parts[2] == "offline"):
		if err := s.SetNodeOnline(parts[1], parts[2] == "online"); err != nil {
			fail(http.StatusNotFound, err)
			return
		}
		writeJSON(w, map[string]any{"node": parts[1], "online": parts[2] == "online"})
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "vms" && parts[2] == "poweroff":
		id, err := strconv.Atoi(parts[1])
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("invalid vmid %q", parts[1]))
			return
		}
		if err := s.GuestPowerOff(id); err != nil {
			fail(http.StatusConflict, err)
			return
		}
		writeJSON(w, map[string]any{"vmid": id, "status": "stopped"})
	case len(parts) == 3 && parts[0] == "vms" && parts[2] == "guest-image" && (r.Method == http.MethodPut || r.Method == http.MethodDelete):
		id, err := strconv.Atoi(parts[1])
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("invalid vmid %q", parts[1]))
			return
		}
		var img *GuestImage
		if r.Method == http.MethodPut {
			img = &GuestImage{}
			if err := json.NewDecoder(r.Body).Decode(img); err != nil {
				fail(http.StatusBadRequest, fmt.Errorf("decode guest image: %w", err))
				return
			}
		}
		if err := s.SetGuestImage(id, img); err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		writeJSON(w, map[string]any{"vmid": id, "guestImage": img})
	case r.Method == http.MethodGet && len(parts) == 3 && parts[0] == "vms" && parts[2] == "console":
		id, err := strconv.Atoi(parts[1])
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("invalid vmid %q", parts[1]))
			return
		}
		data, err := s.Console(id)
		if err != nil {
			fail(http.StatusNotFound, err)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(data)
	case route == "POST refresh":
		s.RefreshResources()
		writeJSON(w, map[string]any{"refreshed": true})
	case route == "POST clock/advance":
		fc, ok := s.clock.(*FakeClock)
		if !ok {
			fail(http.StatusConflict, fmt.Errorf("the simulator runs on the real clock"))
			return
		}
		d, err := time.ParseDuration(r.URL.Query().Get("by"))
		if err != nil || d < 0 {
			fail(http.StatusBadRequest, fmt.Errorf("by must be a non-negative duration like 5s"))
			return
		}
		fc.Advance(d)
		writeJSON(w, map[string]any{"now": fc.Now()})
	default:
		fail(http.StatusNotFound, fmt.Errorf("unknown admin call %s; see the package documentation", route))
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// loopbackPeer reports whether the request comes from a loopback address.
func loopbackPeer(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// SetGuestProgram makes the VMs booted from now on run prog in process in
// place of the guest command (GuestConfig.Program); nil goes back to the
// command. The simulator must have a guest hook.
func (s *Simulator) SetGuestProgram(prog GuestProgram) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.guest == nil:
		return errors.New("proxmoxsim: no guest hook is configured (guest.command)")
	case prog == nil && len(s.guest.cfg.Command) == 0:
		return errors.New("proxmoxsim: the guest hook has no command to go back to")
	}
	s.guest.cfg.Program = prog
	return nil
}
