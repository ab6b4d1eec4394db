package githubsim

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// runner is a registered self-hosted runner. Removed runners stay in the
// map as tombstones (removed = true): their credentials still read the
// status of the job they ran, so an ephemeral runner's script can see its
// job complete, but they never get another job.
type runner struct {
	id         int64
	name       string
	owner      *owner
	repo       *repo // nil: organization runner
	group      *runnerGroup
	labels     []string
	os         string
	ephemeral  bool
	jit        bool
	secret     string
	clientID   string
	workFolder string
	createdAt  time.Time
	removed    bool

	// disableUpdate is what the runner's .runner file says: a runner of a
	// scale set's JIT config takes it from the scale set's RunnerSetting;
	// the others keep true, as the simulator always wrote (the runner's
	// own config.sh writes what --disableupdate says, and HyperFleet's
	// agent passes it; GitHub's REST generate-jitconfig takes no such
	// setting).
	disableUpdate bool

	// session is the id of the connected runner process's session ("" when
	// not connected). polls counts long polls in flight; lastSeen is the
	// last contact; a session without either for HeartbeatTimeout ends.
	session  string
	polls    int
	lastSeen time.Time
	hbTimer  Timer
	rmTimer  Timer

	busy bool
	job  *job
	// scaleSet is the scale set whose JIT config made the runner (nil:
	// none); it runs only jobs that scale set acquired.
	scaleSet  *scaleSet
	jobsRun   int
	idleSince time.Time
	wake      chan struct{}
}

// wakeLocked releases the runner's long polls so that they re-check.
func (r *runner) wakeLocked() {
	if r.wake != nil {
		close(r.wake)
	}
	r.wake = make(chan struct{})
}

func (r *runner) scope() string {
	if r.repo != nil {
		return r.repo.fullName()
	}
	if r.owner.enterprise {
		return "enterprises/" + r.owner.login
	}
	return r.owner.login
}

// onlineLocked reports whether the runner is connected and its heartbeat
// is fresh.
func (s *Simulator) onlineLocked(r *runner) bool {
	if r.removed || r.session == "" {
		return false
	}
	return r.polls > 0 || s.clock.Now().Sub(r.lastSeen) < s.cfg.HeartbeatTimeout.D()
}

// touchLocked records contact from the runner process and makes sure a
// heartbeat check is pending.
func (s *Simulator) touchLocked(r *runner) {
	r.lastSeen = s.clock.Now()
	if r.hbTimer == nil && r.session != "" {
		s.armHeartbeatLocked(r, s.cfg.HeartbeatTimeout.D())
	}
}

func (s *Simulator) armHeartbeatLocked(r *runner, d time.Duration) {
	r.hbTimer = s.afterFunc(d, func() {
		r.hbTimer = nil
		if r.removed || r.session == "" {
			return
		}
		if s.onlineLocked(r) {
			// Still alive: check again when the heartbeat would lapse.
			left := s.cfg.HeartbeatTimeout.D() - s.clock.Now().Sub(r.lastSeen)
			s.armHeartbeatLocked(r, max(left, time.Millisecond))
			return
		}
		s.log.Info("runner heartbeat timed out", "runner", r.name, "id", r.id)
		s.endSessionLocked(r, "failure")
	})
}

// endSessionLocked disconnects a runner. A job it was running fails, as
// GitHub fails a job whose runner lost communication.
func (s *Simulator) endSessionLocked(r *runner, jobConclusion string) {
	r.session = ""
	r.polls = 0
	s.stopTimer(r.hbTimer)
	r.hbTimer = nil
	if j := r.job; r.busy && j != nil {
		if j.status == "in_progress" {
			s.completeJobLocked(j, jobConclusion)
		} else {
			s.unassignLocked(j)
			s.scheduleLocked()
		}
	}
	r.wakeLocked()
	s.armRemovalLocked(r)
}

// armRemovalLocked schedules the removal GitHub applies to runners that
// stay offline: a day for ephemeral runners, 14 days for others.
func (s *Simulator) armRemovalLocked(r *runner) {
	if r.removed {
		return
	}
	s.stopTimer(r.rmTimer)
	d := s.cfg.OfflineRemoval.D()
	if r.ephemeral {
		d = s.cfg.EphemeralOfflineRemoval.D()
	}
	r.rmTimer = s.afterFunc(d, func() {
		r.rmTimer = nil
		if !s.onlineLocked(r) && !r.busy {
			s.log.Info("removing offline runner", "runner", r.name, "id", r.id)
			s.removeRunnerLocked(r)
		}
	})
}

// removeRunnerLocked deletes a runner (it becomes a tombstone).
func (s *Simulator) removeRunnerLocked(r *runner) {
	r.removed = true
	r.session = ""
	s.stopTimer(r.hbTimer)
	s.stopTimer(r.rmTimer)
	r.hbTimer, r.rmTimer = nil, nil
	r.wakeLocked()
}

// scopeRunnersLocked lists the live runners registered at exactly the
// request's scope, by id.
func (s *Simulator) scopeRunnersLocked(o *owner, rp *repo) []*runner {
	var out []*runner
	for _, r := range s.runners {
		if !r.removed && r.owner == o && r.repo == rp {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// handleRegistrationToken is POST .../actions/runners/registration-token.
func (s *Simulator) handleRegistrationToken(q *request) (int, any, error) {
	t := &regToken{token: s.randomString(29, "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"), owner: q.owner, repo: q.repo, expires: q.now.Add(time.Hour)}
	s.regTokens[t.token] = t
	return http.StatusCreated, map[string]any{"token": t.token, "expires_at": q.now.Add(time.Hour).Format("2006-01-02T15:04:05.000Z07:00")}, nil
}

// jitRequest is the body of generate-jitconfig. Fields are raw so that
// type errors produce GitHub's validation messages instead of a decoder
// error.
type jitRequest struct {
	Name          json.RawMessage `json:"name"`
	RunnerGroupID json.RawMessage `json:"runner_group_id"`
	Labels        json.RawMessage `json:"labels"`
	WorkFolder    json.RawMessage `json:"work_folder"`
}

// jitSpec is a validated generate-jitconfig request.
type jitSpec struct {
	name       string
	groupID    int64
	labels     []string
	workFolder string
}

// parseJITRequest validates a generate-jitconfig body the way GitHub's
// schema validation does (422 "Invalid request." with the reason).
func parseJITRequest(body []byte) (jitSpec, *apiError) {
	var req jitRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return jitSpec{}, &apiError{code: http.StatusBadRequest, msg: "Problems parsing JSON"}
	}
	invalid := func(format string, args ...any) (jitSpec, *apiError) {
		return jitSpec{}, errValidation("Invalid request.\n\n"+format, args...)
	}
	var spec jitSpec
	if isNull(req.Name) {
		return invalid(`"name" wasn't supplied.`)
	}
	if json.Unmarshal(req.Name, &spec.name) != nil {
		return invalid("For 'properties/name', %s is not a string.", req.Name)
	}
	if isNull(req.RunnerGroupID) {
		return invalid(`"runner_group_id" wasn't supplied.`)
	}
	if json.Unmarshal(req.RunnerGroupID, &spec.groupID) != nil {
		return invalid("For 'properties/runner_group_id', %s is not an integer.", req.RunnerGroupID)
	}
	if isNull(req.Labels) {
		return invalid(`"labels" wasn't supplied.`)
	}
	var raw []json.RawMessage
	if json.Unmarshal(req.Labels, &raw) != nil {
		return invalid("For 'properties/labels', %s is not an array.", req.Labels)
	}
	if len(raw) < 1 {
		return invalid("For 'properties/labels', [] has fewer items than 1 (minItems).")
	}
	if len(raw) > 100 {
		return invalid("For 'properties/labels', the array has more items than 100 (maxItems).")
	}
	for _, l := range raw {
		var name string
		if json.Unmarshal(l, &name) != nil {
			return invalid("For 'items', %s is not a string.", l)
		}
		spec.labels = append(spec.labels, name)
	}
	if !isNull(req.WorkFolder) && json.Unmarshal(req.WorkFolder, &spec.workFolder) != nil {
		return invalid("For 'properties/work_folder', %s is not a string.", req.WorkFolder)
	}
	if spec.workFolder == "" {
		spec.workFolder = "_work"
	}
	if err := validateRunnerName(spec.name); err != nil {
		return jitSpec{}, errValidation("%s", err.Error())
	}
	for _, l := range spec.labels {
		if strings.TrimSpace(l) == "" || len(l) > 256 || strings.Contains(l, ",") {
			return jitSpec{}, errValidation("Invalid label %q: labels must be 1-256 characters without commas.", l)
		}
	}
	return spec, nil
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// validateRunnerName applies the runner's own name rules (non-empty, at
// most 64 characters, no control characters or path separators).
func validateRunnerName(name string) error {
	if strings.TrimSpace(name) == "" {
		return fmt.Errorf("Invalid request.\n\nThe runner name must not be empty.") //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	if len(name) > 64 {
		return fmt.Errorf("Invalid request.\n\nThe runner name %q is longer than 64 characters.", name) //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
	}
	for _, c := range name {
		if c < 0x20 || c == '/' || c == '\\' || c == '"' {
			return fmt.Errorf("Invalid request.\n\nThe runner name %q contains invalid characters.", name) //nolint:staticcheck,revive // ST1005/error-strings: GitHub's own message, verbatim on the wire
		}
	}
	return nil
}

// handleJITConfig is POST .../actions/runners/generate-jitconfig.
func (s *Simulator) handleJITConfig(q *request) (int, any, error) {
	spec, aerr := parseJITRequest(q.body)
	if aerr != nil {
		return 0, nil, aerr
	}
	group := defaultGroup
	if q.repo == nil {
		group = q.owner.group(spec.groupID)
	} else if spec.groupID != 1 {
		group = nil
	}
	if group == nil {
		return 0, nil, errValidation("Invalid request.\n\nNo runner group with id %d exists.", spec.groupID)
	}
	if s.nameTakenLocked(q.owner, q.repo, spec.name) {
		return 0, nil, &apiError{code: http.StatusConflict, msg: fmt.Sprintf("Already exists - A runner with the name %s already exists.", spec.name)}
	}
	r := s.newRunnerLocked(q.owner, q.repo, group, spec.name, spec.labels, spec.workFolder, true, true)
	return http.StatusCreated, map[string]any{"runner": s.runnerJSON(r), "encoded_jit_config": s.encodedConfigLocked(r)}, nil
}

// nameTakenLocked reports whether a live runner of that name exists in the
// scope (names are unique per repository or organization, ignoring case).
func (s *Simulator) nameTakenLocked(o *owner, rp *repo, name string) bool {
	return s.runnerByNameLocked(o, rp, name) != nil
}

func (s *Simulator) runnerByNameLocked(o *owner, rp *repo, name string) *runner {
	for _, r := range s.runners {
		if !r.removed && r.owner == o && r.repo == rp && strings.EqualFold(r.name, name) {
			return r
		}
	}
	return nil
}

// newRunnerLocked registers a runner (offline until its process connects).
func (s *Simulator) newRunnerLocked(o *owner, rp *repo, g *runnerGroup, name string, labels []string, work string, ephemeral, jit bool) *runner {
	s.nextRunnerID++
	r := &runner{
		id: s.nextRunnerID, name: name, owner: o, repo: rp, group: g, labels: dedupLabels(labels), os: osFromLabels(labels),
		ephemeral: ephemeral, jit: jit, disableUpdate: true, secret: s.randomString(40, alnum), clientID: s.newGUID(), workFolder: work,
		createdAt: s.clock.Now(), wake: make(chan struct{}),
	}
	s.runners[r.id] = r
	s.armRemovalLocked(r)
	return r
}

func dedupLabels(labels []string) []string {
	seen := map[string]bool{}
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		if k := strings.ToLower(l); !seen[k] {
			seen[k] = true
			out = append(out, l)
		}
	}
	return out
}

// osFromLabels is the runner's os as GitHub reports it (from its OS
// label; Linux when it has none).
func osFromLabels(labels []string) string {
	for _, l := range labels {
		switch strings.ToLower(l) {
		case "windows":
			return "Windows"
		case "macos":
			return "macOS"
		}
	}
	return "Linux"
}

// encodedConfigLocked renders a runner's configuration as GitHub's
// encoded_jit_config: base64 of a JSON object mapping the runner's file
// names to their base64 contents.
func (s *Simulator) encodedConfigLocked(r *runner) string {
	server := s.serverBase()
	ghURL := server + "/" + r.scope()
	runnerFile := fmt.Sprintf(`{
  "agentId": %d,
  "agentName": %s,
  "poolId": %d,
  "poolName": %s,
  "serverUrl": %s,
  "gitHubUrl": %s,
  "workFolder": %s,
  "ephemeral": %t,
  "disableUpdate": %t,
  "useV2Flow": false
}`, r.id, jsonString(r.name), r.group.id, jsonString(r.group.name), jsonString(server), jsonString(ghURL), jsonString(r.workFolder), r.ephemeral, r.disableUpdate)
	credentials := fmt.Sprintf(`{
  "scheme": "OAuth",
  "data": {
    "clientId": %s,
    "authorizationUrl": %s,
    "requireFipsCryptography": "False",
    "simRunnerSecret": %s
  }
}`, jsonString(r.clientID), jsonString(server+runnerAPIPrefix+"oauth2/token"), jsonString(r.secret))
	// The real file holds the runner's RSA key; the simulator's runner
	// authenticates with simRunnerSecret, so these are placeholders of the
	// right shape.
	param := func(n int) string { return base64.StdEncoding.EncodeToString([]byte(s.randomString(n, alnum))) }
	rsaParams := fmt.Sprintf(`{
  "d": %q,
  "dp": %q,
  "dq": %q,
  "exponent": "AQAB",
  "inverseQ": %q,
  "modulus": %q,
  "p": %q,
  "q": %q
}`, param(256), param(128), param(128), param(128), param(256), param(128), param(128))
	b64 := base64.StdEncoding.EncodeToString
	outer, _ := json.Marshal(map[string]string{
		".runner":                b64([]byte(runnerFile)),
		".credentials":           b64([]byte(credentials)),
		".credentials_rsaparams": b64([]byte(rsaParams)),
	})
	return b64(outer)
}

func jsonString(v string) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// handleListRunners is GET .../actions/runners (name, per_page, page).
func (s *Simulator) handleListRunners(q *request) (int, any, error) {
	all := s.scopeRunnersLocked(q.owner, q.repo)
	if name := q.query.Get("name"); name != "" {
		var filtered []*runner
		for _, r := range all {
			if r.name == name {
				filtered = append(filtered, r)
			}
		}
		all = filtered
	}
	start, end := q.paginate(len(all))
	list := make([]any, 0, end-start)
	for _, r := range all[start:end] {
		list = append(list, s.runnerJSON(r))
	}
	return http.StatusOK, map[string]any{"total_count": len(all), "runners": list}, nil
}

// runnerInScopeLocked finds a live runner by the runner_id path variable.
func (s *Simulator) runnerInScopeLocked(q *request) (*runner, error) {
	id, err := strconv.ParseInt(q.vars["runner_id"], 10, 64)
	if err != nil {
		return nil, errNotFound()
	}
	r := s.runners[id]
	if r == nil || r.removed || r.owner != q.owner || r.repo != q.repo {
		return nil, errNotFound()
	}
	return r, nil
}

// handleGetRunner is GET .../actions/runners/{runner_id}.
func (s *Simulator) handleGetRunner(q *request) (int, any, error) {
	r, err := s.runnerInScopeLocked(q)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, s.runnerJSON(r), nil
}

// handleDeleteRunner is DELETE .../actions/runners/{runner_id}.
func (s *Simulator) handleDeleteRunner(q *request) (int, any, error) {
	r, err := s.runnerInScopeLocked(q)
	if err != nil {
		return 0, nil, err
	}
	if r.busy {
		return 0, nil, errValidation("Runner %q is still running a job", r.name)
	}
	s.removeRunnerLocked(r)
	return http.StatusNoContent, nil, nil
}

// handleListRunnerGroups is GET /orgs/{org}/actions/runner-groups.
func (s *Simulator) handleListRunnerGroups(q *request) (int, any, error) {
	start, end := q.paginate(len(q.owner.groups))
	list := make([]any, 0, end-start)
	for _, g := range q.owner.groups[start:end] {
		list = append(list, s.runnerGroupJSON(q.owner, g))
	}
	return http.StatusOK, map[string]any{"total_count": len(q.owner.groups), "runner_groups": list}, nil
}
