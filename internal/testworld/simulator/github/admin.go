package githubsim

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// adminPrefix is reserved for the simulator's own admin API; GitHub has
// nothing under it.
const adminPrefix = "/_sim/"

// Runner is a snapshot of a runner.
type Runner struct {
	ID        int64    `json:"id"`
	Name      string   `json:"name"`
	Scope     string   `json:"scope"`
	GroupID   int64    `json:"groupID"`
	GroupName string   `json:"groupName"`
	Labels    []string `json:"labels"`
	OS        string   `json:"os"`
	// Status is online or offline, as the REST API reports it.
	Status    string `json:"status"`
	Busy      bool   `json:"busy"`
	Ephemeral bool   `json:"ephemeral"`
	JIT       bool   `json:"jit"`
	// JobID is the job the runner holds (0 when idle).
	JobID int64 `json:"jobID,omitempty"`
	// JobsRun counts the jobs it has started.
	JobsRun   int       `json:"jobsRun"`
	Removed   bool      `json:"removed,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	LastSeen  time.Time `json:"lastSeen,omitzero"`
}

// State is a dump of the simulator's state. It never contains PATs,
// installation or registration tokens, runner secrets, webhook secrets or
// keys.
type State struct {
	Time           time.Time  `json:"time"`
	Runners        []Runner   `json:"runners"`
	RemovedRunners []Runner   `json:"removedRunners"`
	Runs           []Run      `json:"runs"`
	Jobs           []Job      `json:"jobs"`
	Deliveries     []Delivery `json:"deliveries"`
	Webhooks       []Webhook  `json:"webhooks"`
	Faults         Faults     `json:"faults"`
}

func (s *Simulator) runnerSnapshot(r *runner) Runner {
	st := Runner{ID: r.id, Name: r.name, Scope: r.scope(), GroupID: r.group.id, GroupName: r.group.name, Labels: append([]string(nil), r.labels...),
		OS: r.os, Status: "offline", Busy: r.busy, Ephemeral: r.ephemeral, JIT: r.jit, JobsRun: r.jobsRun, Removed: r.removed,
		CreatedAt: r.createdAt, LastSeen: r.lastSeen}
	if s.onlineLocked(r) {
		st.Status = "online"
	}
	if r.busy && r.job != nil {
		st.JobID = r.job.id
	}
	return st
}

// Runners returns the registered (not removed) runners by id.
func (s *Simulator) Runners() []Runner {
	live, _ := s.runnerLists()
	return live
}

// AllRunners returns every runner ever registered, the removed ones
// (Removed set) after the live ones.
func (s *Simulator) AllRunners() []Runner {
	live, removed := s.runnerLists()
	return append(live, removed...)
}

// RunnerByName returns a live runner by name (any scope).
func (s *Simulator) RunnerByName(name string) (Runner, bool) {
	for _, r := range s.Runners() {
		if r.Name == name {
			return r, true
		}
	}
	return Runner{}, false
}

func (s *Simulator) runnerLists() (live, removed []Runner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int64, 0, len(s.runners))
	for id := range s.runners {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	live, removed = []Runner{}, []Runner{}
	for _, id := range ids {
		r := s.runners[id]
		if r.removed {
			removed = append(removed, s.runnerSnapshot(r))
		} else {
			live = append(live, s.runnerSnapshot(r))
		}
	}
	return live, removed
}

// State returns a snapshot of everything.
func (s *Simulator) State() State {
	live, removed := s.runnerLists()
	s.mu.Lock()
	now := s.clock.Now()
	s.mu.Unlock()
	return State{Time: now, Runners: live, RemovedRunners: removed, Runs: s.Runs(), Jobs: s.Jobs(), Deliveries: s.Deliveries(),
		Webhooks: s.Webhooks(), Faults: s.Faults()}
}

// adminJobRequest is JobRequest with a readable duration.
type adminJobRequest struct {
	JobRequest
	Duration Duration `json:"duration"`
}

// serveAdmin serves /_sim/. JSON in, JSON out; errors are plain text.
//
//	GET    /_sim/state                          State (no secrets)
//	POST   /_sim/jobs                           enqueue: {"repository","labels","duration":"30s",...}
//	POST   /_sim/jobs/{id}/complete?conclusion= finish a job now
//	POST   /_sim/runs/{id}/cancel               cancel a run
//	GET    /_sim/deliveries                     delivery log
//	POST   /_sim/deliveries/{guid}/redeliver    redeliver (also POST /_sim/redeliver?id=)
//	POST   /_sim/webhooks                       {"url","secret","scope"} add an endpoint
//	DELETE /_sim/webhooks/{id}                  remove it
//	GET    /_sim/faults, POST /_sim/faults, DELETE /_sim/faults
//	POST   /_sim/ratelimit                      {"key":"user:octocat","used":4999}
//	POST   /_sim/clock/advance?by=5s            only with a FakeClock
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
	decode := func(v any) bool {
		if err := json.NewDecoder(r.Body).Decode(v); err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("decode request: %w", err))
			return false
		}
		return true
	}
	idAt := func(i int) (int64, bool) {
		id, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("invalid id %q", parts[i]))
			return 0, false
		}
		return id, true
	}
	switch {
	case route == "GET state":
		writeJSON(w, http.StatusOK, s.State())
	case route == "POST jobs":
		var req adminJobRequest
		if !decode(&req) {
			return
		}
		req.JobRequest.Duration = req.Duration.D()
		j, err := s.EnqueueJob(req.JobRequest)
		if err != nil {
			fail(http.StatusUnprocessableEntity, err)
			return
		}
		writeJSON(w, http.StatusCreated, j)
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "jobs" && parts[2] == "complete":
		id, ok := idAt(1)
		if !ok {
			return
		}
		c := r.URL.Query().Get("conclusion")
		if c == "" {
			c = "success"
		}
		if err := s.CompleteJob(id, c); err != nil {
			fail(http.StatusNotFound, err)
			return
		}
		j, _ := s.Job(id)
		writeJSON(w, http.StatusOK, j)
	case r.Method == http.MethodPost && len(parts) == 3 && parts[0] == "runs" && parts[2] == "cancel":
		id, ok := idAt(1)
		if !ok {
			return
		}
		if err := s.CancelRun(id); err != nil {
			fail(http.StatusConflict, err)
			return
		}
		writeJSON(w, http.StatusAccepted, map[string]any{})
	case route == "GET deliveries":
		writeJSON(w, http.StatusOK, s.Deliveries())
	case r.Method == http.MethodPost && ((len(parts) == 3 && parts[0] == "deliveries" && parts[2] == "redeliver") || route == "POST redeliver"):
		id := r.URL.Query().Get("id")
		if len(parts) == 3 {
			id = parts[1]
		}
		d, err := s.Redeliver(id)
		if err != nil {
			fail(http.StatusNotFound, err)
			return
		}
		writeJSON(w, http.StatusAccepted, d)
	case route == "POST webhooks":
		var hook struct {
			Webhook
			Secret string `json:"secret"`
		}
		if !decode(&hook) {
			return
		}
		hook.Webhook.Secret = hook.Secret
		wh, err := s.AddWebhook(hook.Webhook)
		if err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusCreated, wh)
	case r.Method == http.MethodDelete && len(parts) == 2 && parts[0] == "webhooks":
		id, ok := idAt(1)
		if !ok {
			return
		}
		if !s.RemoveWebhook(id) {
			fail(http.StatusNotFound, fmt.Errorf("no webhook %d", id))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case route == "GET faults":
		writeJSON(w, http.StatusOK, s.Faults())
	case route == "POST faults":
		var f Faults
		if !decode(&f) {
			return
		}
		if err := s.AddFaults(f); err != nil {
			fail(http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusOK, s.Faults())
	case route == "DELETE faults":
		s.ClearFaults()
		writeJSON(w, http.StatusOK, s.Faults())
	case route == "POST ratelimit":
		var req struct {
			Key  string `json:"key"`
			Used int    `json:"used"`
		}
		if !decode(&req) {
			return
		}
		s.SetRateLimitUsed(req.Key, req.Used)
		writeJSON(w, http.StatusOK, req)
	case parts[0] == "scalesets":
		s.serveScaleSetAdmin(w, r, parts)
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
		writeJSON(w, http.StatusOK, map[string]any{"now": fc.Now()})
	default:
		fail(http.StatusNotFound, fmt.Errorf("unknown admin call %s; see the package README", route))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
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
