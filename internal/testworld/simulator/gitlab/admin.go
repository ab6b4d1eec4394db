package gitlabsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

// AddGroup creates a group (and its missing parents) at a full path.
func (s *Simulator) AddGroup(path string) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, err := s.ensureGroupLocked(path)
	if err != nil {
		return 0, err
	}
	return g.id, nil
}

// AddProject creates a project (and its missing groups).
func (s *Simulator) AddProject(p ProjectConfig) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pr, err := s.addProjectLocked(p)
	if err != nil {
		return 0, err
	}
	return pr.id, nil
}

// AddUser creates a user with memberships.
func (s *Simulator) AddUser(u UserConfig) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nu, err := s.addUserLocked(u)
	if err != nil {
		return 0, err
	}
	return nu.id, nil
}

// AddToken creates an access token.
func (s *Simulator) AddToken(t TokenConfig) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addTokenLocked(t)
}

// RevokeToken revokes an access token (401 from then on).
func (s *Simulator) RevokeToken(token string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	at := s.tokens[token]
	if at == nil {
		return fmt.Errorf("no token %q", token)
	}
	at.revoked = true
	return nil
}

// IssuedRunner is a runner created through the API, with its
// authentication token, as tests read it after the runner is gone.
type IssuedRunner struct {
	ID          int64  `json:"id"`
	Description string `json:"description"`
	Token       string `json:"token"`
	// Live: the runner still exists.
	Live bool `json:"live"`
}

// IssuedRunners lists every runner created through the API, deleted ones
// included, in creation order.
func (s *Simulator) IssuedRunners() []IssuedRunner {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]IssuedRunner, len(s.issued))
	for i, r := range s.issued {
		r.Live = s.runners[r.ID] != nil
		out[i] = r
	}
	return out
}

// RunnerInfo is a runner as tests read it.
type RunnerInfo struct {
	ID       int64    `json:"id"`
	Type     string   `json:"type"`
	Tags     []string `json:"tags"`
	Managers []string `json:"managers"`
	Paused   bool     `json:"paused"`
}

// Runners lists the live runners by id.
func (s *Simulator) Runners() []RunnerInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []RunnerInfo
	for _, r := range s.sortedRunnersLocked() {
		ri := RunnerInfo{ID: r.id, Type: r.kind, Tags: r.tags, Paused: r.paused}
		for m := range r.managers {
			ri.Managers = append(ri.Managers, m)
		}
		out = append(out, ri)
	}
	return out
}

// serveAdmin is the /_sim/ admin API: loopback clients only, off unless
// WithAdmin(true). It creates the world's objects, pipelines and hooks,
// reads jobs and deliveries, and injects faults.
func (s *Simulator) serveAdmin(w http.ResponseWriter, r *http.Request) {
	if !s.admin {
		http.Error(w, "admin API disabled", http.StatusNotFound)
		return
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		http.Error(w, "admin API answers loopback clients only", http.StatusForbidden)
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/_sim")
	decode := func(v any) bool {
		if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(v); err != nil {
			http.Error(w, "bad JSON: "+err.Error(), http.StatusBadRequest)
			return false
		}
		return true
	}
	created := func(v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnprocessableEntity)
			return
		}
		writeJSON(w, http.StatusCreated, v)
	}
	switch {
	case r.Method == http.MethodPost && path == "/groups":
		var c GroupConfig
		if decode(&c) {
			id, err := s.AddGroup(c.Path)
			created(map[string]int64{"id": id}, err)
		}
	case r.Method == http.MethodPost && path == "/projects":
		var c ProjectConfig
		if decode(&c) {
			id, err := s.AddProject(c)
			created(map[string]int64{"id": id}, err)
		}
	case r.Method == http.MethodPost && path == "/users":
		var c UserConfig
		if decode(&c) {
			id, err := s.AddUser(c)
			created(map[string]int64{"id": id}, err)
		}
	case r.Method == http.MethodPost && path == "/tokens":
		var c TokenConfig
		if decode(&c) {
			created(map[string]string{"name": c.Name}, s.AddToken(c))
		}
	case r.Method == http.MethodPost && path == "/pipelines":
		var c PipelineRequest
		if decode(&c) {
			created(s.CreatePipeline(c))
		}
	case r.Method == http.MethodPost && path == "/hooks":
		var c HookConfig
		if decode(&c) {
			id, err := s.AddHook(c)
			created(map[string]int64{"id": id}, err)
		}
	case r.Method == http.MethodGet && strings.HasPrefix(path, "/jobs/"):
		id, _ := strconv.ParseInt(strings.TrimPrefix(path, "/jobs/"), 10, 64)
		j, ok := s.Job(id)
		if !ok {
			http.Error(w, "no such job", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, j)
	case r.Method == http.MethodPost && strings.HasPrefix(path, "/jobs/") && strings.HasSuffix(path, "/cancel"):
		id, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimPrefix(path, "/jobs/"), "/cancel"), 10, 64)
		if err := s.CancelJob(id); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodGet && path == "/runners":
		writeJSON(w, http.StatusOK, s.Runners())
	case r.Method == http.MethodGet && path == "/deliveries":
		writeJSON(w, http.StatusOK, s.Deliveries())
	case r.Method == http.MethodPost && path == "/faults":
		var f Fault
		if decode(&f) {
			s.InjectFault(f)
			w.WriteHeader(http.StatusNoContent)
		}
	case r.Method == http.MethodDelete && path == "/faults":
		s.ClearFaults()
		w.WriteHeader(http.StatusNoContent)
	case r.Method == http.MethodPost && path == "/clock/advance":
		fc, ok := s.clock.(*simclock.FakeClock)
		d, err := time.ParseDuration(r.URL.Query().Get("by"))
		if !ok || err != nil {
			http.Error(w, "needs a fake clock and ?by=<duration>", http.StatusBadRequest)
			return
		}
		fc.Advance(d)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "no such admin call", http.StatusNotFound)
	}
}
