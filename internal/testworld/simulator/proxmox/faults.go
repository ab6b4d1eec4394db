package proxmoxsim

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"
)

// endpointClass groups endpoints for fault injection.
type endpointClass string

// Endpoint classes faults can target. "*" in Faults.Classes matches all.
const (
	classAuth      endpointClass = "auth"
	classClone     endpointClass = "clone"
	classConfig    endpointClass = "config"
	classPower     endpointClass = "power"
	classDestroy   endpointClass = "destroy"
	classStatus    endpointClass = "status"
	classResources endpointClass = "resources"
	classAgent     endpointClass = "agent"
	classUpload    endpointClass = "upload"
	classStorage   endpointClass = "storage"
	classNextID    endpointClass = "nextid"
	classOther     endpointClass = "other"
)

var knownClasses = map[endpointClass]bool{
	classAuth: true, classClone: true, classConfig: true, classPower: true, classDestroy: true, classStatus: true,
	classResources: true, classAgent: true, classUpload: true, classStorage: true, classNextID: true, classOther: true, "*": true,
}

// Faults configures injected failures.
type Faults struct {
	// Classes maps an endpoint class (clone, config, power, destroy, status,
	// resources, agent, upload, storage, nextid, auth, other, or "*") to
	// its fault profile.
	Classes map[string]FaultSpec `json:"classes,omitempty"`
	// OfflineNodes are unreachable: requests for them fail with 595.
	OfflineNodes []string `json:"offlineNodes,omitempty"`
}

// FaultSpec is the fault profile of one endpoint class. Rates are
// probabilities in [0,1] drawn per request from the seeded generator.
type FaultSpec struct {
	// ErrorRate fails requests with a realistic handler error.
	ErrorRate float64 `json:"errorRate,omitempty"`
	// Errors overrides the messages (one is picked at random); {vmid},
	// {node} and {storage} are substituted.
	Errors []string `json:"errors,omitempty"`
	// ErrorCode is the HTTP status of injected errors (500 by default).
	ErrorCode int `json:"errorCode,omitempty"`
	// SpikeRate delays requests by SpikeLatency, measured on the
	// simulator's clock (a FakeClock test releases them with Advance).
	SpikeRate    float64  `json:"spikeRate,omitempty"`
	SpikeLatency Duration `json:"spikeLatency,omitempty"`
	// DropRate closes the connection without any response.
	DropRate float64 `json:"dropRate,omitempty"`
	// TaskFailRate fails the worker task a request started (clone, power,
	// destroy, config, upload, storage deletion): the request succeeds
	// with its UPID, and the task ends with a realistic error without
	// doing its work, as a worker that hits a lock or I/O timeout does.
	TaskFailRate float64 `json:"taskFailRate,omitempty"`
}

// Injected fault kinds, the keys of InjectedFaults.
const (
	FaultError       = "error"
	FaultDrop        = "drop"
	FaultSpike       = "spike"
	FaultTaskFailure = "task-failure"
	// FaultOffline counts requests refused (595) because their node was
	// offline.
	FaultOffline = "node-offline"
)

// defaultTaskFailures are the errors real workers end with under load.
var defaultTaskFailures = map[endpointClass][]string{
	classClone:   {"clone failed: can't lock file '/var/lock/pve-manager/pve-storage-local-lvm' - got timeout", "clone failed: command 'qemu-img convert' failed: exit code 1"},
	classPower:   {"timeout waiting on systemd", "can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classDestroy: {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classConfig:  {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classUpload:  {"can't lock file '/var/lock/pve-manager/pve-storage-{storage}' - got timeout"},
	classStorage: {"can't lock file '/var/lock/pve-manager/pve-storage-{storage}' - got timeout"},
}

// defaultFaultErrors are messages real clusters produce under load.
var defaultFaultErrors = map[endpointClass][]string{
	classClone:     {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout", "VM is locked (clone)"},
	classConfig:    {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classPower:     {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classDestroy:   {"can't lock file '/var/lock/qemu-server/lock-{vmid}.conf' - got timeout"},
	classStatus:    {"VM {vmid} qmp command 'query-proxmox-support' failed - got timeout"},
	classAgent:     {"QEMU guest agent is not running"},
	classUpload:    {"can't lock file '/var/lock/pve-manager/pve-storage-{storage}' - got timeout"},
	classStorage:   {"can't lock file '/var/lock/pve-manager/pve-storage-{storage}' - got timeout"},
	classResources: {"Can't connect to 127.0.0.1:85 (Connection refused)"},
	classNextID:    {"Can't connect to 127.0.0.1:85 (Connection refused)"},
	classAuth:      {"Can't connect to 127.0.0.1:85 (Connection refused)"},
	classOther:     {"Can't connect to 127.0.0.1:85 (Connection refused)"},
}

func (f Faults) validate() error {
	for name, spec := range f.Classes {
		if !knownClasses[endpointClass(name)] {
			return fmt.Errorf("faults: unknown endpoint class %q", name)
		}
		for _, r := range []float64{spec.ErrorRate, spec.SpikeRate, spec.DropRate, spec.TaskFailRate} {
			if r < 0 || r > 1 {
				return fmt.Errorf("faults %s: rates must be between 0 and 1", name)
			}
		}
	}
	return nil
}

// spec returns the profile for a class ("*" is the fallback).
func (f Faults) spec(c endpointClass) (FaultSpec, bool) {
	if s, ok := f.Classes[string(c)]; ok {
		return s, true
	}
	s, ok := f.Classes["*"]
	return s, ok
}

// SetFaults replaces the fault configuration at run time.
func (s *Simulator) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range f.OfflineNodes {
		if s.nodes[n] == nil {
			return fmt.Errorf("faults: unknown node %q", n)
		}
	}
	s.cfg.Faults = f
	offline := map[string]bool{}
	for _, n := range f.OfflineNodes {
		offline[n] = true
	}
	for name, n := range s.nodes {
		n.online = !offline[name]
	}
	return nil
}

// SetLatency replaces the latency model at run time. Work already
// scheduled keeps its timing.
func (s *Simulator) SetLatency(l Latency) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Latency = l
}

// SetTimings changes the 401 delay, the storage lock timeout and the
// resource refresh interval at run time.
func (s *Simulator) SetTimings(authFailureDelay, storageLockTimeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.AuthFailureDelay = Duration(authFailureDelay)
	s.cfg.StorageLockTimeout = Duration(storageLockTimeout)
}

func (s *Simulator) apiLatency() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.Latency.API.D()
}

// injectTransportFault drops the connection or delays the request. It
// reports true when the request has been consumed.
func (s *Simulator) injectTransportFault(w http.ResponseWriter, r *http.Request, c endpointClass) bool {
	s.mu.Lock()
	spec, ok := s.cfg.Faults.spec(c)
	var drop, spike bool
	if ok {
		drop = spec.DropRate > 0 && s.rng.Float64() < spec.DropRate
		spike = spec.SpikeRate > 0 && s.rng.Float64() < spec.SpikeRate
	}
	if drop {
		s.countFaultLocked(FaultDrop, c)
	} else if spike {
		s.countFaultLocked(FaultSpike, c)
	}
	s.mu.Unlock()
	if drop {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return true
			}
		}
		// Without a hijackable connection, abort the handler: net/http
		// then closes the connection without a response.
		panic(http.ErrAbortHandler)
	}
	if spike {
		s.wait(r, spec.SpikeLatency.D())
	}
	return false
}

// injectErrorLocked fails a verified request with a realistic message.
func (s *Simulator) injectErrorLocked(q *apiRequest) error {
	spec, ok := s.cfg.Faults.spec(q.route.class)
	if !ok || spec.ErrorRate <= 0 || s.rng.Float64() >= spec.ErrorRate {
		return nil
	}
	msgs := spec.Errors
	if len(msgs) == 0 {
		msgs = defaultFaultErrors[q.route.class]
	}
	msg := msgs[s.rng.Intn(len(msgs))]
	msg = strings.NewReplacer("{vmid}", q.vars["vmid"], "{node}", q.vars["node"], "{storage}", q.vars["storage"]).Replace(msg)
	code := spec.ErrorCode
	if code == 0 {
		code = http.StatusInternalServerError
	}
	s.countFaultLocked(FaultError, q.route.class)
	return &apiError{code: code, msg: msg + "\n"}
}

// taskFaultLocked draws whether a task of class c fails (FaultSpec.
// TaskFailRate) and returns its error, with {vmid} and {storage}
// substituted; nil when it runs.
func (s *Simulator) taskFaultLocked(c endpointClass, vmid, storage string) error {
	spec, ok := s.cfg.Faults.spec(c)
	if !ok || spec.TaskFailRate <= 0 || s.rng.Float64() >= spec.TaskFailRate {
		return nil
	}
	msgs := defaultTaskFailures[c]
	if len(msgs) == 0 {
		msgs = []string{"got timeout"}
	}
	s.countFaultLocked(FaultTaskFailure, c)
	return errors.New(strings.NewReplacer("{vmid}", vmid, "{storage}", storage).Replace(msgs[s.rng.Intn(len(msgs))]))
}

// countFaultLocked counts one injected fault of kind on class c.
func (s *Simulator) countFaultLocked(kind string, c endpointClass) {
	if s.injected == nil {
		s.injected = map[string]map[string]int{}
	}
	if s.injected[kind] == nil {
		s.injected[kind] = map[string]int{}
	}
	s.injected[kind][string(c)]++
}

// InjectedFaults counts the faults injected so far, by kind (FaultError,
// FaultDrop, FaultSpike, FaultTaskFailure, FaultOffline) and endpoint
// class: what a chaos run reports it injected.
func (s *Simulator) InjectedFaults() map[string]map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]map[string]int, len(s.injected))
	for kind, byClass := range s.injected {
		out[kind] = maps.Clone(byClass)
	}
	return out
}
