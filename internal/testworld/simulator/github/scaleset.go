package githubsim

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// The runner scale-set protocol (the "Actions service" ARC's listener
// speaks): a registration token is exchanged at POST /actions/runner-registration
// for an admin token and a tenant URL, under which the simulator serves
// /_apis/runtime/runnerscalesets (scale sets, message sessions, the message
// queue, acquirejobs, generatejitconfig). The tenant lives at
// {server}/_actions/{tenant}/. pkg/workload/github/scaleset is the client.

const (
	actionsPrefix        = "/_actions/"
	runnerRegistration   = "/actions/runner-registration"
	scaleSetsPath        = "_apis/runtime/runnerscalesets"
	runnerGroupsPath     = "_apis/runtime/runnergroups"
	defaultScaleSetTTL   = time.Hour
	defaultScaleSetPoll  = 50 * time.Second
	maxScaleSetBatchSize = 100
)

// defaultSessionIdle is how long a message session lives with no poll of
// its queue in flight or begun. GitHub documents no value; its own
// listeners assume abandoned sessions go away within minutes: ARC's
// listener retries a 409 on session creation 10 times 30 s apart (about
// 4.5 min), the runner's listener retries a session conflict for 4 min.
// Two minutes is more than two missed 50 s long polls (a live listener
// never looks idle) and well inside both retry windows (a restarted
// listener gets the scale set back before it gives up).
const defaultSessionIdle = 2 * time.Minute

// scaleSetState is the simulator's scale-set side.
type scaleSetState struct {
	adminTTL, queueTTL time.Duration
	pollWait           time.Duration
	sessionIdle        time.Duration
	tenants            map[string]*tenant
	adminTokens        map[string]*actionsToken
	sets               map[int64]*scaleSet
	nextID             int64
	nextMessageID      int64
	nextRequestID      int64
	// hostile are the answers of a hostile or compromised Actions service
	// (HostileScaleSetAnswers); zero: the simulator's own.
	hostile HostileScaleSetAnswers
}

// HostileScaleSetAnswers make the scale-set protocol's answers send a
// client elsewhere, as a hostile or compromised service (or whoever sits
// between it and the client) would, for the tests of a client that must
// not follow them with its tokens: each non-empty base replaces the
// scheme and host of the URLs the simulator's answers name, each redirect
// answers a request with 307 Temporary Redirect to that base and the
// request's path and query.
type HostileScaleSetAnswers struct {
	// ServiceBase replaces the base of the Actions service URL the
	// registration exchange answers (POST /actions/runner-registration).
	ServiceBase string
	// QueueBase replaces the base of a session's messageQueueUrl.
	QueueBase string
	// RedirectRegistration redirects the registration exchange there.
	RedirectRegistration string
	// RedirectQueue redirects the message queue's requests there.
	RedirectQueue string
}

// SetHostileScaleSetAnswers makes the scale-set answers hostile from now
// on (a zero value makes them the simulator's own again).
func (s *Simulator) SetHostileScaleSetAnswers(h HostileScaleSetAnswers) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ss.hostile = h
}

// hostileRedirectLocked answers r with a redirect to base, keeping its
// path and query, when base is set.
func hostileRedirectLocked(w http.ResponseWriter, r *http.Request, base string) bool {
	if base == "" {
		return false
	}
	w.Header().Set("Location", strings.TrimRight(base, "/")+r.URL.RequestURI())
	w.WriteHeader(http.StatusTemporaryRedirect)
	return true
}

// answerBase is the scheme and host the answers to r name: the request's
// own, or hostile's when set.
func answerBase(r *http.Request, hostile string) string {
	if hostile != "" {
		return strings.TrimRight(hostile, "/")
	}
	return requestBase(r)
}

// tenant is one registration scope (an organization or a repository).
type tenant struct {
	key   string
	owner *owner
	repo  *repo // nil: organization
}

type actionsToken struct {
	tenant  *tenant
	expires time.Time
}

// scaleSet is a runner scale set with its (at most one) message session
// and its queue of unacknowledged messages.
type scaleSet struct {
	id        int64
	tenant    *tenant
	name      string
	group     *runnerGroup
	labels    []string
	createdAt time.Time
	session   *ssSession
	queue     []*ssMessage
	wake      chan struct{}
	// maxCapacity is the X-ScaleSetMaxCapacity of the latest poll (-1:
	// none yet or not a number).
	maxCapacity int
	// disableUpdate is the scale set's RunnerSetting.disableUpdate: its
	// JIT runners' configuration says so, and a runner started from it
	// does not update itself.
	disableUpdate bool
}

type ssSession struct {
	id         string
	owner      string
	queueToken string
	expires    time.Time
	// polls counts GETs of the queue in flight; lastPoll is when the
	// latest began or ended (or the session was created). With no poll in
	// flight for sessionIdle, idleTimer deletes the session: its listener
	// is gone.
	polls     int
	lastPoll  time.Time
	idleTimer Timer
}

// ssMessage is one RunnerScaleSetJobMessages batch. A message not yet
// delivered takes further job messages, as the service batches them.
type ssMessage struct {
	id        int64
	batch     []map[string]any
	delivered bool
}

// WithScaleSetTokenTTL sets how long admin tokens (from the registration
// exchange) and message-queue tokens (from sessions) live on the
// simulator clock; one hour each by default.
func WithScaleSetTokenTTL(admin, queue time.Duration) Option {
	return func(s *Simulator) { s.ss.adminTTL, s.ss.queueTTL = admin, queue }
}

// WithScaleSetPollWait sets how long a message long poll waits before
// answering 202 (wall clock, like the runner long poll); 50 s by default.
func WithScaleSetPollWait(d time.Duration) Option {
	return func(s *Simulator) { s.ss.pollWait = d }
}

// WithScaleSetSessionIdleTimeout sets how long a message session lives
// with no poll of its message queue (on the simulator clock); after that
// the simulator deletes it, as GitHub does the session of a listener that
// died without deleting it, and a new session may be created. Two
// minutes by default (defaultSessionIdle says why).
func WithScaleSetSessionIdleTimeout(d time.Duration) Option {
	return func(s *Simulator) { s.ss.sessionIdle = d }
}

func (st *scaleSetState) init() {
	if st.adminTTL == 0 {
		st.adminTTL = defaultScaleSetTTL
	}
	if st.queueTTL == 0 {
		st.queueTTL = defaultScaleSetTTL
	}
	if st.pollWait == 0 {
		st.pollWait = defaultScaleSetPoll
	}
	if st.sessionIdle == 0 {
		st.sessionIdle = defaultSessionIdle
	}
	st.tenants = map[string]*tenant{}
	st.adminTokens = map[string]*actionsToken{}
	st.sets = map[int64]*scaleSet{}
	st.nextID = 0
	st.hostile = HostileScaleSetAnswers{}
}

// ExpireScaleSetTokens makes every admin and message-queue token invalid
// now (the next call with one answers 401), as a fault.
func (s *Simulator) ExpireScaleSetTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	past := s.clock.Now().Add(-time.Second)
	for _, t := range s.ss.adminTokens {
		t.expires = past
	}
	for _, ss := range s.ss.sets {
		if ss.session != nil {
			ss.session.expires = past
		}
	}
	s.countFaultLocked("scaleset-token-expiry")
}

// RepeatScaleSetMessages sends the messages about job again, as the
// Actions service's queue may (its delivery is at least once): for the
// job's state now, the message that state produced (JobAvailable, and
// JobAssigned once a scale set acquired it, JobStarted, JobCompleted), in
// a new message to the scale set that has the job. A consumer must take
// them as repeats. It fails for a job no scale set was offered.
func (s *Simulator) RepeatScaleSetMessages(jobID int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	j := s.jobs[jobID]
	if j == nil || !j.ssOffered {
		return fmt.Errorf("job %d was not offered to a scale set", jobID)
	}
	ss := j.scaleSet
	if ss == nil {
		for _, c := range s.ss.sets {
			if s.scaleSetMatchesLocked(c, j) && (ss == nil || c.id < ss.id) {
				ss = c
			}
		}
	}
	if ss == nil || s.ss.sets[ss.id] != ss {
		return fmt.Errorf("job %d has no scale set", jobID)
	}
	kinds := []string{"JobAvailable"}
	if j.scaleSet != nil {
		kinds = append(kinds, "JobAssigned")
	}
	if j.runner != nil || !j.startedAt.IsZero() {
		kinds = append(kinds, "JobStarted")
	}
	if j.status == "completed" {
		kinds = append(kinds, "JobCompleted")
	}
	for _, k := range kinds {
		s.scaleSetMessageLocked(ss, j, k)
	}
	s.countFaultLocked("scaleset-repeat")
	return nil
}

// ScaleSet is a scale set as the test API shows it.
type ScaleSet struct {
	ID         int64    `json:"id"`
	Name       string   `json:"name"`
	Labels     []string `json:"labels"`
	Session    string   `json:"session,omitempty"`
	Unacked    int      `json:"unacknowledged"`
	RunnerGrp  int64    `json:"runnerGroupID"`
	SessionOwn string   `json:"sessionOwner,omitempty"`
	// MaxCapacity is the X-ScaleSetMaxCapacity the latest poll sent (-1:
	// none).
	MaxCapacity int `json:"maxCapacity"`
	// Polls counts the session's polls in flight (a session with none for
	// the idle timeout expires); DisableUpdate is the RunnerSetting's.
	Polls         int  `json:"polls,omitempty"`
	DisableUpdate bool `json:"disableUpdate,omitempty"`
}

// ScaleSets lists the scale sets, by id.
func (s *Simulator) ScaleSets() []ScaleSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []ScaleSet{}
	for _, ss := range s.ss.sets {
		v := ScaleSet{ID: ss.id, Name: ss.name, Labels: append([]string(nil), ss.labels...), Unacked: len(ss.queue), RunnerGrp: ss.group.id, MaxCapacity: ss.maxCapacity,
			DisableUpdate: ss.disableUpdate}
		if ss.session != nil {
			v.Session, v.SessionOwn, v.Polls = ss.session.id, ss.session.owner, ss.session.polls
		}
		out = append(out, v)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// actionsError writes the Actions service's error shape.
func actionsError(w http.ResponseWriter, code int, typeName, format string, args ...any) {
	writeJSON(w, code, map[string]any{"typeName": typeName, "message": fmt.Sprintf(format, args...)})
}

func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "Bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

// newActionsTokenLocked mints a JWT-shaped token whose exp claim tells the
// client when to refresh (clients read it unverified; the simulator checks
// its own table).
func (s *Simulator) newActionsTokenLocked(exp time.Time) string {
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]any{"iss": "githubsim", "exp": exp.Unix(), "nbf": s.clock.Now().Unix(), "jti": s.newGUID()})
	return header + "." + enc.EncodeToString(claims) + "." + s.randomString(43, alnum)
}

// serveRunnerRegistration is POST /actions/runner-registration: a
// registration token (Authorization: RemoteAuth) for the scope named by
// url buys an admin token for that scope's Actions service tenant.
func (s *Simulator) serveRunnerRegistration(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(w, "read request body", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if hostileRedirectLocked(w, r, s.ss.hostile.RedirectRegistration) {
		return
	}
	if f := s.actionsFaultLocked(r, runnerRegistration); f != nil {
		writeJSON(w, f.code, map[string]any{"message": f.msg})
		return
	}
	auth := r.Header.Get("Authorization")
	const scheme = "RemoteAuth "
	now := s.clock.Now()
	var rt *regToken
	if strings.HasPrefix(auth, scheme) {
		rt = s.regTokens[strings.TrimSpace(auth[len(scheme):])]
	}
	if rt == nil || !now.Before(rt.expires) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Bad credentials"})
		return
	}
	var req struct {
		URL         string `json:"url"`
		RunnerEvent string `json:"runner_event"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.URL == "" {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "the body needs url (the organization or repository URL)"})
		return
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"message": "invalid url"})
		return
	}
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	want := []string{rt.owner.login}
	if rt.repo != nil {
		want = append(want, rt.repo.name)
	}
	if len(parts) != len(want) || !strings.EqualFold(strings.Join(parts, "/"), strings.Join(want, "/")) {
		writeJSON(w, http.StatusNotFound, map[string]any{"message": "the registration token is not for " + req.URL})
		return
	}
	key := fmt.Sprintf("o%d", rt.owner.id)
	if rt.repo != nil {
		key = fmt.Sprintf("r%d", rt.repo.id)
	}
	tn := s.ss.tenants[key]
	if tn == nil {
		tn = &tenant{key: key, owner: rt.owner, repo: rt.repo}
		s.ss.tenants[key] = tn
	}
	exp := now.Add(s.ss.adminTTL)
	tok := s.newActionsTokenLocked(exp)
	s.ss.adminTokens[tok] = &actionsToken{tenant: tn, expires: exp}
	writeJSON(w, http.StatusOK, map[string]any{"url": answerBase(r, s.ss.hostile.ServiceBase) + actionsPrefix + key + "/", "token_schema": "OAuthAccessToken", "token": tok})
}

// actionsFaultLocked applies injected error rules to a scale-set request
// (paths as the client sees them, e.g. "/_actions/").
func (s *Simulator) actionsFaultLocked(r *http.Request, path string) *apiError {
	s.reqSeq++
	q := &request{r: r, reqID: requestID(s.reqSeq)}
	return s.injectFaultLocked(q, path, http.Header{}, nil)
}

// serveActions serves a tenant's Actions service.
func (s *Simulator) serveActions(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(strings.TrimPrefix(r.URL.Path, actionsPrefix), "/"), "/")
	if len(parts) < 2 {
		http.NotFound(w, r)
		return
	}
	// The message queue (a broker of its own on GitHub) takes no
	// api-version; every other service call must name one.
	if !strings.Contains(r.URL.Path, "/messages") && r.URL.Query().Get("api-version") == "" && !strings.Contains(r.Header.Get("Accept"), "api-version=") {
		actionsError(w, http.StatusBadRequest, "VssVersionNotSpecifiedException", "No api-version was supplied for the %s request", r.Method)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, "read request body", http.StatusBadRequest)
		return
	}
	key, rest := parts[0], strings.Join(parts[1:], "/")
	s.mu.Lock()
	if strings.Contains(r.URL.Path, "/messages") && hostileRedirectLocked(w, r, s.ss.hostile.RedirectQueue) {
		s.mu.Unlock()
		return
	}
	if f := s.actionsFaultLocked(r, r.URL.Path); f != nil {
		s.mu.Unlock()
		actionsError(w, f.code, faultTypeName(f.code), "%s", f.msg)
		return
	}
	tn := s.ss.tenants[key]
	if tn == nil {
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	switch {
	case rest == runnerGroupsPath:
		defer s.mu.Unlock()
		if !s.adminAuthLocked(w, r, tn) {
			return
		}
		s.handleRunnerGroupsLocked(w, r, tn)
	case rest == scaleSetsPath || strings.HasPrefix(rest, scaleSetsPath+"/"):
		sub := strings.Split(strings.Trim(strings.TrimPrefix(rest, scaleSetsPath), "/"), "/")
		if sub[0] == "" {
			defer s.mu.Unlock()
			if !s.adminAuthLocked(w, r, tn) {
				return
			}
			s.handleScaleSetsLocked(w, r, tn, body)
			return
		}
		id, err := strconv.ParseInt(sub[0], 10, 64)
		ss := s.ss.sets[id]
		if err != nil || ss == nil || ss.tenant != tn {
			s.mu.Unlock()
			actionsError(w, http.StatusNotFound, "RunnerScaleSetNotFoundException", "No runner scale set with id %s exists.", sub[0])
			return
		}
		if len(sub) >= 2 && sub[1] == "messages" {
			// The long poll releases the lock while it waits.
			s.handleMessagesLocked(w, r, ss, sub[2:])
			return
		}
		defer s.mu.Unlock()
		switch {
		case len(sub) == 1:
			if s.adminAuthLocked(w, r, tn) {
				s.handleScaleSetLocked(w, r, ss, body)
			}
		case sub[1] == "sessions":
			if s.adminAuthLocked(w, r, tn) {
				s.handleSessionsLocked(w, r, ss, sub[2:], body)
			}
		case sub[1] == "acquirejobs" && len(sub) == 2 && r.Method == http.MethodPost:
			if s.queueAuthLocked(w, r, ss) {
				s.handleAcquireLocked(w, ss, body)
			}
		case sub[1] == "generatejitconfig" && len(sub) == 2 && r.Method == http.MethodPost:
			if s.adminAuthLocked(w, r, tn) {
				s.handleScaleSetJITLocked(w, ss, body)
			}
		default:
			http.NotFound(w, r)
		}
	default:
		s.mu.Unlock()
		http.NotFound(w, r)
	}
}

func (s *Simulator) adminAuthLocked(w http.ResponseWriter, r *http.Request, tn *tenant) bool {
	t := s.ss.adminTokens[bearer(r)]
	if t == nil || t.tenant != tn || !s.clock.Now().Before(t.expires) {
		actionsError(w, http.StatusUnauthorized, "VssUnauthorizedException", "The admin token is missing, expired or not for this tenant.")
		return false
	}
	return true
}

func (s *Simulator) queueAuthLocked(w http.ResponseWriter, r *http.Request, ss *scaleSet) bool {
	sess := ss.session
	if sess == nil || bearer(r) != sess.queueToken || !s.clock.Now().Before(sess.expires) {
		actionsError(w, http.StatusUnauthorized, "TaskAgentAccessTokenExpiredException", "The message queue token is missing, expired or not for this session.")
		return false
	}
	return true
}

func (s *Simulator) handleRunnerGroupsLocked(w http.ResponseWriter, r *http.Request, tn *tenant) {
	if r.Method != http.MethodGet {
		http.NotFound(w, r)
		return
	}
	groups := []*runnerGroup{defaultGroup}
	if tn.repo == nil {
		groups = tn.owner.groups
	}
	name := r.URL.Query().Get("groupName")
	out := []map[string]any{}
	for _, g := range groups {
		if name == "" || strings.EqualFold(g.name, name) {
			out = append(out, map[string]any{"id": g.id, "name": g.name, "isDefaultGroup": g.def, "size": 0})
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(out), "value": out})
}

func (s *Simulator) groupLocked(tn *tenant, id int64) *runnerGroup {
	if id == 0 {
		id = 1
	}
	if tn.repo != nil {
		if id == 1 {
			return defaultGroup
		}
		return nil
	}
	return tn.owner.group(id)
}

type scaleSetBody struct {
	Name          string `json:"name"`
	RunnerGroupID int64  `json:"runnerGroupId"`
	Labels        []struct {
		Type string `json:"type"`
		Name string `json:"name"`
	} `json:"labels"`
	// RunnerSetting is spelled with a capital R, as GitHub's client
	// (github.com/actions/scaleset) sends it; nil on a PATCH keeps it.
	RunnerSetting *runnerSetting `json:"RunnerSetting"`
}

// runnerSetting is a scale set's RunnerSetting.
type runnerSetting struct {
	DisableUpdate bool `json:"disableUpdate,omitempty"`
}

func (s *Simulator) scaleSetJSON(r *http.Request, ss *scaleSet) map[string]any {
	labels := make([]map[string]any, 0, len(ss.labels))
	for _, l := range ss.labels {
		labels = append(labels, map[string]any{"type": "System", "name": l})
	}
	return map[string]any{
		"id": ss.id, "name": ss.name, "runnerGroupId": ss.group.id, "runnerGroupName": ss.group.name, "labels": labels,
		"RunnerSetting": runnerSetting{DisableUpdate: ss.disableUpdate}, "createdOn": ss.createdAt.UTC().Format(time.RFC3339Nano),
		"runnerJitConfigUrl": fmt.Sprintf("%s%s%s/%s/%d/generatejitconfig", requestBase(r), actionsPrefix, ss.tenant.key, scaleSetsPath, ss.id),
		"statistics":         s.statisticsLocked(ss),
	}
}

// applyScaleSetBody validates a create/update body into ss.
func (s *Simulator) applyScaleSetBody(ss *scaleSet, b scaleSetBody, create bool) (int, string, string) {
	if b.Name != "" || create {
		if strings.TrimSpace(b.Name) == "" || len(b.Name) > 45 {
			return http.StatusBadRequest, "ArgumentException", "name is required and at most 45 characters"
		}
	}
	if b.RunnerGroupID != 0 || create {
		g := s.groupLocked(ss.tenant, b.RunnerGroupID)
		if g == nil {
			return http.StatusNotFound, "RunnerGroupNotFoundException", fmt.Sprintf("No runner group with id %d exists.", b.RunnerGroupID)
		}
		ss.group = g
	}
	if b.Name != "" {
		for _, o := range s.ss.sets {
			if o != ss && o.tenant == ss.tenant && o.group == ss.group && strings.EqualFold(o.name, b.Name) {
				return http.StatusConflict, "RunnerScaleSetExistsException", fmt.Sprintf("A runner scale set named %s already exists in runner group %s.", b.Name, ss.group.name)
			}
		}
		ss.name = b.Name
	}
	if b.RunnerSetting != nil {
		ss.disableUpdate = b.RunnerSetting.DisableUpdate
	}
	if len(b.Labels) > 0 {
		labels := make([]string, 0, len(b.Labels))
		for _, l := range b.Labels {
			if strings.TrimSpace(l.Name) == "" {
				return http.StatusBadRequest, "ArgumentException", "labels need a name"
			}
			labels = append(labels, l.Name)
		}
		ss.labels = dedupLabels(labels)
	} else if create {
		ss.labels = []string{ss.name}
	}
	return 0, "", ""
}

func (s *Simulator) handleScaleSetsLocked(w http.ResponseWriter, r *http.Request, tn *tenant, body []byte) {
	switch r.Method {
	case http.MethodGet:
		q := r.URL.Query()
		name := q.Get("name")
		gid, _ := strconv.ParseInt(q.Get("runnerGroupId"), 10, 64)
		ids := make([]int64, 0, len(s.ss.sets))
		for id := range s.ss.sets {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		out := []map[string]any{}
		for _, id := range ids {
			ss := s.ss.sets[id]
			if ss.tenant == tn && (name == "" || strings.EqualFold(ss.name, name)) && (gid == 0 || ss.group.id == gid) {
				out = append(out, s.scaleSetJSON(r, ss))
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"count": len(out), "value": out})
	case http.MethodPost:
		var b scaleSetBody
		if err := json.Unmarshal(body, &b); err != nil {
			actionsError(w, http.StatusBadRequest, "ArgumentException", "invalid body: %v", err)
			return
		}
		ss := &scaleSet{tenant: tn, createdAt: s.clock.Now(), wake: make(chan struct{}), maxCapacity: -1}
		if code, typ, msg := s.applyScaleSetBody(ss, b, true); code != 0 {
			actionsError(w, code, typ, "%s", msg)
			return
		}
		s.ss.nextID++
		ss.id = s.ss.nextID
		s.ss.sets[ss.id] = ss
		// Jobs already waiting for these labels are offered at once.
		for _, id := range s.jobOrder {
			s.offerJobLocked(s.jobs[id])
		}
		writeJSON(w, http.StatusOK, s.scaleSetJSON(r, ss))
	default:
		http.NotFound(w, r)
	}
}

func (s *Simulator) handleScaleSetLocked(w http.ResponseWriter, r *http.Request, ss *scaleSet, body []byte) {
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, s.scaleSetJSON(r, ss))
	case http.MethodPatch:
		var b scaleSetBody
		if err := json.Unmarshal(body, &b); err != nil {
			actionsError(w, http.StatusBadRequest, "ArgumentException", "invalid body: %v", err)
			return
		}
		if code, typ, msg := s.applyScaleSetBody(ss, b, false); code != 0 {
			actionsError(w, code, typ, "%s", msg)
			return
		}
		writeJSON(w, http.StatusOK, s.scaleSetJSON(r, ss))
	case http.MethodDelete:
		if ss.session != nil {
			s.stopTimer(ss.session.idleTimer)
		}
		delete(s.ss.sets, ss.id)
		close(ss.wake)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

func (s *Simulator) handleSessionsLocked(w http.ResponseWriter, r *http.Request, ss *scaleSet, sub []string, body []byte) {
	now := s.clock.Now()
	switch {
	case len(sub) == 0 && r.Method == http.MethodPost:
		if ss.session != nil {
			s.expireIdleSessionLocked(ss, ss.session)
		}
		if ss.session != nil {
			actionsError(w, http.StatusConflict, "TaskAgentSessionConflictException", "The scale set %s already has an active session for owner %s.", ss.name, ss.session.owner)
			return
		}
		var b struct {
			OwnerName string `json:"ownerName"`
		}
		if err := json.Unmarshal(body, &b); err != nil || strings.TrimSpace(b.OwnerName) == "" {
			actionsError(w, http.StatusBadRequest, "ArgumentException", "the session needs an ownerName")
			return
		}
		ss.session = &ssSession{id: s.newGUID(), owner: b.OwnerName, expires: now.Add(s.ss.queueTTL), lastPoll: now}
		ss.session.queueToken = s.newActionsTokenLocked(ss.session.expires)
		s.armSessionIdleLocked(ss, ss.session)
		// A new session starts from the oldest unacknowledged message:
		// whatever the last holder did not delete is delivered again.
		for _, m := range ss.queue {
			m.delivered = false
		}
		writeJSON(w, http.StatusOK, s.sessionJSON(r, ss))
	case len(sub) == 1 && r.Method == http.MethodPatch:
		if ss.session == nil || ss.session.id != sub[0] {
			actionsError(w, http.StatusNotFound, "TaskAgentSessionExpiredException", "No session %s exists.", sub[0])
			return
		}
		ss.session.expires = now.Add(s.ss.queueTTL)
		ss.session.queueToken = s.newActionsTokenLocked(ss.session.expires)
		writeJSON(w, http.StatusOK, s.sessionJSON(r, ss))
	case len(sub) == 1 && r.Method == http.MethodDelete:
		if ss.session == nil || ss.session.id != sub[0] {
			actionsError(w, http.StatusNotFound, "TaskAgentSessionExpiredException", "No session %s exists.", sub[0])
			return
		}
		s.endScaleSetSessionLocked(ss)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

// endScaleSetSessionLocked deletes the scale set's session (a poll in flight
// answers 404).
func (s *Simulator) endScaleSetSessionLocked(ss *scaleSet) {
	if ss.session == nil {
		return
	}
	s.stopTimer(ss.session.idleTimer)
	ss.session = nil
	ss.wakeLocked()
}

// armSessionIdleLocked schedules the idle check of sess on the simulator
// clock, sessionIdle after its latest poll.
func (s *Simulator) armSessionIdleLocked(ss *scaleSet, sess *ssSession) {
	s.stopTimer(sess.idleTimer)
	sess.idleTimer = nil
	if sess.polls > 0 {
		return
	}
	wait := sess.lastPoll.Add(s.ss.sessionIdle).Sub(s.clock.Now())
	sess.idleTimer = s.afterFunc(wait, func() { s.expireIdleSessionLocked(ss, sess) })
}

// expireIdleSessionLocked deletes sess when it is still the scale set's
// and nothing polled its queue for sessionIdle: its listener died without
// deleting it, and GitHub lets a new listener take the scale set.
func (s *Simulator) expireIdleSessionLocked(ss *scaleSet, sess *ssSession) {
	if ss.session != sess || s.ss.sets[ss.id] != ss || sess.polls > 0 {
		return
	}
	if s.clock.Now().Before(sess.lastPoll.Add(s.ss.sessionIdle)) {
		s.armSessionIdleLocked(ss, sess)
		return
	}
	s.log.Info("message session expired: no poll of its queue", "scaleSet", ss.name, "session", sess.id, "owner", sess.owner, "idle", s.ss.sessionIdle)
	s.endScaleSetSessionLocked(ss)
}

func (ss *scaleSet) wakeLocked() {
	close(ss.wake)
	ss.wake = make(chan struct{})
}

func (s *Simulator) sessionJSON(r *http.Request, ss *scaleSet) map[string]any {
	q := url.Values{"sessionId": {ss.session.id}}
	return map[string]any{
		"sessionId": ss.session.id, "ownerName": ss.session.owner, "runnerScaleSet": s.scaleSetJSON(r, ss),
		"messageQueueUrl":         fmt.Sprintf("%s%s%s/%s/%d/messages?%s", answerBase(r, s.ss.hostile.QueueBase), actionsPrefix, ss.tenant.key, scaleSetsPath, ss.id, q.Encode()),
		"messageQueueAccessToken": ss.session.queueToken,
		"statistics":              s.statisticsLocked(ss),
	}
}

// handleMessagesLocked is the message queue: GET long-polls for the oldest
// message after lastMessageId (202 when none arrives in time), DELETE
// .../messages/{id} acknowledges one. It is entered with s.mu held and
// releases it.
func (s *Simulator) handleMessagesLocked(w http.ResponseWriter, r *http.Request, ss *scaleSet, sub []string) {
	q := r.URL.Query()
	if !s.queueAuthLocked(w, r, ss) {
		s.mu.Unlock()
		return
	}
	if q.Get("sessionId") != ss.session.id {
		s.mu.Unlock()
		actionsError(w, http.StatusNotFound, "TaskAgentSessionExpiredException", "No session %s exists.", q.Get("sessionId"))
		return
	}
	switch {
	case len(sub) == 1 && r.Method == http.MethodDelete:
		defer s.mu.Unlock()
		id, _ := strconv.ParseInt(sub[0], 10, 64)
		for i, m := range ss.queue {
			if m.id == id {
				ss.queue = append(ss.queue[:i], ss.queue[i+1:]...)
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		actionsError(w, http.StatusNotFound, "MessageNotFoundException", "No message %d is waiting.", id)
		return
	case len(sub) == 0 && r.Method == http.MethodGet:
	default:
		s.mu.Unlock()
		http.NotFound(w, r)
		return
	}
	last, _ := strconv.ParseInt(q.Get("lastMessageId"), 10, 64)
	ss.maxCapacity = -1
	if n, err := strconv.Atoi(r.Header.Get("X-ScaleSetMaxCapacity")); err == nil && n >= 0 {
		ss.maxCapacity = n
	}
	session := ss.session
	// The poll keeps the session alive while it waits and for
	// sessionIdle after it ends.
	session.polls++
	session.lastPoll = s.clock.Now()
	s.stopTimer(session.idleTimer)
	session.idleTimer = nil
	defer s.pollEnded(ss, session)
	deadline := time.NewTimer(s.ss.pollWait)
	defer deadline.Stop()
	for {
		if ss.session != session || s.ss.sets[ss.id] != ss {
			s.mu.Unlock()
			actionsError(w, http.StatusNotFound, "TaskAgentSessionExpiredException", "The session ended while polling.")
			return
		}
		for _, m := range ss.queue {
			if m.id > last || !m.delivered {
				m.delivered = true
				batch, _ := json.Marshal(m.batch)
				resp := map[string]any{"messageId": m.id, "messageType": "RunnerScaleSetJobMessages", "body": string(batch), "statistics": s.statisticsLocked(ss)}
				s.mu.Unlock()
				writeJSON(w, http.StatusOK, resp)
				return
			}
		}
		wake := ss.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-deadline.C:
			w.WriteHeader(http.StatusAccepted)
			return
		case <-r.Context().Done():
			return
		}
		s.mu.Lock()
	}
}

// pollEnded accounts for the end of a poll of sess (taking the lock).
func (s *Simulator) pollEnded(ss *scaleSet, sess *ssSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess.polls--
	sess.lastPoll = s.clock.Now()
	if ss.session == sess && !s.closed {
		s.armSessionIdleLocked(ss, sess)
	}
}

// handleAcquireLocked is POST .../acquirejobs: the listed job requests
// offered to this scale set become its jobs (JobAssigned follows) and its
// runners may take them.
func (s *Simulator) handleAcquireLocked(w http.ResponseWriter, ss *scaleSet, body []byte) {
	var ids []int64
	if err := json.Unmarshal(body, &ids); err != nil {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "the body must be a JSON array of request ids: %v", err)
		return
	}
	byRequest := map[int64]*job{}
	for _, j := range s.jobs {
		if j.ssOffered {
			byRequest[j.ssRequestID] = j
		}
	}
	acquired := []int64{}
	for _, id := range ids {
		j := byRequest[id]
		if j == nil || j.status != "queued" || j.scaleSet != nil || !s.scaleSetMatchesLocked(ss, j) {
			continue
		}
		j.scaleSet, j.ssAssigned = ss, s.clock.Now()
		acquired = append(acquired, id)
		s.scaleSetMessageLocked(ss, j, "JobAssigned")
	}
	s.scheduleLocked()
	writeJSON(w, http.StatusOK, map[string]any{"count": len(acquired), "value": acquired})
}

// handleScaleSetJITLocked is POST .../generatejitconfig: an ephemeral JIT
// runner of the scale set (its labels, its group).
func (s *Simulator) handleScaleSetJITLocked(w http.ResponseWriter, ss *scaleSet, body []byte) {
	var b struct {
		Name       string `json:"name"`
		WorkFolder string `json:"workFolder"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "invalid body: %v", err)
		return
	}
	if err := validateRunnerName(b.Name); err != nil {
		actionsError(w, http.StatusBadRequest, "ArgumentException", "%v", err)
		return
	}
	tn := ss.tenant
	if s.nameTakenLocked(tn.owner, tn.repo, b.Name) {
		actionsError(w, http.StatusConflict, "AgentExistsException", "A runner with the name %s already exists.", b.Name)
		return
	}
	work := b.WorkFolder
	if work == "" {
		work = "_work"
	}
	r := s.newRunnerLocked(tn.owner, tn.repo, ss.group, b.Name, ss.labels, work, true, true)
	r.scaleSet, r.disableUpdate = ss, ss.disableUpdate
	writeJSON(w, http.StatusOK, map[string]any{
		"runner":           map[string]any{"id": r.id, "name": r.name, "runnerScaleSetId": ss.id},
		"encodedJITConfig": s.encodedConfigLocked(r),
	})
}

// scaleSetMatchesLocked: the job is in the scale set's scope and every
// runs-on label is one of the scale set's (ignoring case).
func (s *Simulator) scaleSetMatchesLocked(ss *scaleSet, j *job) bool {
	rp := j.run.repo
	if ss.tenant.repo != nil {
		if ss.tenant.repo != rp {
			return false
		}
	} else if ss.tenant.owner != rp.owner {
		return false
	}
	have := map[string]bool{}
	for _, l := range ss.labels {
		have[strings.ToLower(l)] = true
	}
	for _, l := range j.labels {
		if !have[strings.ToLower(l)] {
			return false
		}
	}
	return true
}

// offerJobLocked sends JobAvailable for a queued job to the first scale
// set (by id) that matches it; such a job is then kept from runners
// outside scale sets.
func (s *Simulator) offerJobLocked(j *job) {
	if j.status != "queued" || j.ssOffered || j.runner != nil {
		return
	}
	ids := make([]int64, 0, len(s.ss.sets))
	for id := range s.ss.sets {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	for _, id := range ids {
		if ss := s.ss.sets[id]; s.scaleSetMatchesLocked(ss, j) {
			s.ss.nextRequestID += 3
			j.ssOffered, j.ssRequestID, j.ssJobID = true, s.ss.nextRequestID, s.newGUID()
			s.scaleSetMessageLocked(ss, j, "JobAvailable")
			return
		}
	}
}

// scaleSetJobEventLocked reports a job's progress to the scale set that
// acquired it.
func (s *Simulator) scaleSetJobEventLocked(j *job, kind string) {
	if j.scaleSet != nil && s.ss.sets[j.scaleSet.id] == j.scaleSet {
		s.scaleSetMessageLocked(j.scaleSet, j, kind)
	}
}

// scaleSetResult is a job conclusion as the service's result.
func scaleSetResult(conclusion string) string {
	switch conclusion {
	case "success":
		return "succeeded"
	case "failure", "timed_out":
		return "failed"
	case "cancelled":
		return "canceled"
	}
	return conclusion
}

func tsOrZero(t time.Time) string {
	if t.IsZero() {
		return "0001-01-01T00:00:00Z"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func (s *Simulator) scaleSetMessageLocked(ss *scaleSet, j *job, kind string) {
	rp := j.run.repo
	m := map[string]any{
		"messageType": kind, "runnerRequestId": j.ssRequestID, "repositoryName": rp.name, "ownerName": rp.owner.login,
		"jobId": j.ssJobID, "jobWorkflowRef": rp.fullName() + "/" + j.run.path + "@refs/heads/" + j.run.headBranch,
		"jobDisplayName": j.name, "workflowRunId": j.run.id, "eventName": "push", "requestLabels": append([]string(nil), j.labels...),
		"queueTime": tsOrZero(j.createdAt), "scaleSetAssignTime": tsOrZero(j.ssAssigned), "runnerAssignTime": tsOrZero(j.startedAt),
		"finishTime": tsOrZero(j.completedAt),
	}
	switch kind {
	case "JobAvailable":
		m["acquireJobUrl"] = fmt.Sprintf("%s%s%s/%s/%d/acquirejobs", s.serverBase(), actionsPrefix, ss.tenant.key, scaleSetsPath, ss.id)
	case "JobStarted":
		m["runnerId"], m["runnerName"] = j.runnerID, j.runnerName
	case "JobCompleted":
		m["runnerId"], m["runnerName"], m["result"] = j.runnerID, j.runnerName, scaleSetResult(j.conclusion)
	}
	if n := len(ss.queue); n > 0 && !ss.queue[n-1].delivered && len(ss.queue[n-1].batch) < maxScaleSetBatchSize {
		ss.queue[n-1].batch = append(ss.queue[n-1].batch, m)
	} else {
		s.ss.nextMessageID++
		ss.queue = append(ss.queue, &ssMessage{id: s.ss.nextMessageID, batch: []map[string]any{m}})
	}
	ss.wakeLocked()
}

// statisticsLocked counts the scale set's jobs and runners.
func (s *Simulator) statisticsLocked(ss *scaleSet) map[string]int {
	st := map[string]int{"totalAvailableJobs": 0, "totalAcquiredJobs": 0, "totalAssignedJobs": 0, "totalRunningJobs": 0,
		"totalRegisteredRunners": 0, "totalBusyRunners": 0, "totalIdleRunners": 0}
	for _, j := range s.jobs {
		if j.status == "completed" {
			continue
		}
		switch {
		case j.scaleSet == nil && j.ssOffered && s.scaleSetMatchesLocked(ss, j):
			st["totalAvailableJobs"]++
		case j.scaleSet == ss:
			st["totalAcquiredJobs"]++
			st["totalAssignedJobs"]++
			if j.status == "in_progress" {
				st["totalRunningJobs"]++
			}
		}
	}
	for _, r := range s.runners {
		if r.removed || r.scaleSet != ss {
			continue
		}
		st["totalRegisteredRunners"]++
		if r.busy {
			st["totalBusyRunners"]++
		} else if s.onlineLocked(r) {
			st["totalIdleRunners"]++
		}
	}
	return st
}

// errNoScaleSet is returned by admin helpers for an unknown scale set.
var errNoScaleSet = errors.New("no such scale set")

// ScaleSetSessionConflict makes the scale set's next session requests
// answer 409 as if another listener held it, count times.
func (s *Simulator) ScaleSetSessionConflict(id int64, count int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.ss.sets[id]
	if ss == nil {
		return errNoScaleSet
	}
	s.faults.errors = append(s.faults.errors, &ErrorFault{Method: http.MethodPost, PathPrefix: fmt.Sprintf("%s%s/%s/%d/sessions", actionsPrefix, ss.tenant.key, scaleSetsPath, id),
		Status: http.StatusConflict, Message: "TaskAgentSessionConflictException: another listener holds the session", Count: count})
	return nil
}

// faultTypeName is the service's exception name for an injected status.
func faultTypeName(code int) string {
	switch code {
	case http.StatusConflict:
		return "TaskAgentSessionConflictException"
	case http.StatusUnauthorized:
		return "TaskAgentAccessTokenExpiredException"
	}
	return "VssServiceException"
}

// serveScaleSetAdmin serves /_sim/scalesets...: the list, token
// revocation and session conflicts.
func (s *Simulator) serveScaleSetAdmin(w http.ResponseWriter, r *http.Request, parts []string) {
	fail := func(code int, err error) { http.Error(w, err.Error(), code) }
	switch {
	case r.Method == http.MethodGet && len(parts) == 1:
		writeJSON(w, http.StatusOK, s.ScaleSets())
	case r.Method == http.MethodPost && len(parts) == 2 && parts[1] == "expire-tokens":
		s.ExpireScaleSetTokens()
		writeJSON(w, http.StatusOK, map[string]any{})
	case r.Method == http.MethodPost && len(parts) == 3 && parts[2] == "session-conflict":
		id, err := strconv.ParseInt(parts[1], 10, 64)
		if err != nil {
			fail(http.StatusBadRequest, fmt.Errorf("invalid id %q", parts[1]))
			return
		}
		n, err := strconv.Atoi(r.URL.Query().Get("count"))
		if err != nil || n < 1 {
			fail(http.StatusBadRequest, errors.New("count must be a positive number"))
			return
		}
		if err := s.ScaleSetSessionConflict(id, n); err != nil {
			fail(http.StatusNotFound, err)
			return
		}
		writeJSON(w, http.StatusOK, s.Faults())
	default:
		fail(http.StatusNotFound, fmt.Errorf("unknown admin call %s %s; see the package README", r.Method, r.URL.Path))
	}
}
