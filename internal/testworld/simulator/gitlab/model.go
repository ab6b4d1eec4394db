package gitlabsim

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Config describes the world the simulator starts with. Every part can also
// be added later through the Go API or the admin API.
type Config struct {
	// URL is the instance's external URL (web_url, CI_SERVER_URL, webhook
	// X-Gitlab-Instance and payload URLs). Empty: answers use each request's
	// own scheme and host, and webhooks name http://gitlab.example.com.
	URL string `json:"url,omitempty"`
	// Version is the GitLab version the simulator claims (User-Agent of
	// webhooks); default 18.6.0.
	Version string        `json:"version,omitempty"`
	Users   []UserConfig  `json:"users,omitempty"`
	Groups  []GroupConfig `json:"groups,omitempty"`
	// Projects live in a group (Namespace is a group's full path).
	Projects []ProjectConfig `json:"projects,omitempty"`
	Tokens   []TokenConfig   `json:"tokens,omitempty"`
	// RateLimit is each credential's budget of API requests per minute
	// (GitLab.com's authenticated API limit is 2000); default 2000.
	RateLimit int `json:"rateLimit,omitempty"`
	// TraceUpdateInterval is what PATCH /jobs/:id/trace answers in
	// X-GitLab-Trace-Update-Interval, in seconds (GitLab: 60, 3 while the
	// log is watched); default 3.
	TraceUpdateInterval int   `json:"traceUpdateInterval,omitempty"`
	Seed                int64 `json:"seed,omitempty"`
}

// UserConfig is a user; Admin users are instance administrators.
type UserConfig struct {
	Username string `json:"username"`
	Admin    bool   `json:"admin,omitempty"`
	// Members maps a group's or project's full path to the user's access
	// level there (Guest 10 ... Owner 50).
	Members map[string]int `json:"members,omitempty"`
}

// GroupConfig is a group; Path may be nested ("org/platform/ci"), and its
// parents are created as needed.
type GroupConfig struct {
	Path string `json:"path"`
}

// ProjectConfig is a project in a group: Path is its full path
// ("org/platform/app").
type ProjectConfig struct {
	Path          string `json:"path"`
	DefaultBranch string `json:"defaultBranch,omitempty"`
	// ProtectedBranches are the project's protected branches besides its
	// default branch, which GitLab protects in a new project (the
	// instance's default branch protection). A pipeline of a protected
	// branch runs protected jobs: only they go to ref_protected runners,
	// and they carry the project's protected variables.
	ProtectedBranches []string `json:"protectedBranches,omitempty"`
}

// TokenConfig is an access token. Kind "personal" belongs to User; kinds
// "project" and "group" belong to a bot user of Resource (a project's or
// group's full path) with AccessLevel there, and reach nothing else, as
// GitLab's project and group access tokens do.
type TokenConfig struct {
	Token       string   `json:"token"`
	Kind        string   `json:"kind,omitempty"`
	User        string   `json:"user,omitempty"`
	Resource    string   `json:"resource,omitempty"`
	AccessLevel int      `json:"accessLevel,omitempty"`
	Scopes      []string `json:"scopes"`
	Name        string   `json:"name,omitempty"`
	// ExpiresAt is a date (2006-01-02); empty: never.
	ExpiresAt string `json:"expiresAt,omitempty"`
}

type user struct {
	id       int64
	username string
	name     string
	admin    bool
	bot      bool
	created  time.Time
	// access maps "g<id>" and "p<id>" to a direct membership's level.
	access map[string]int
}

type group struct {
	id       int64
	name     string
	path     string
	fullPath string
	parent   *group
	created  time.Time
}

type project struct {
	id            int64
	name          string
	path          string
	group         *group
	defaultBranch string
	// protected are the protected branches besides the default branch.
	protected []string
	created   time.Time
}

func (p *project) fullPath() string { return p.group.fullPath + "/" + p.path }

// protectedRef reports whether ref is a protected branch of p: its default
// branch (protected in a new project) or one configured so.
func (p *project) protectedRef(ref string) bool {
	return ref == p.defaultBranch || slices.Contains(p.protected, ref)
}

type accessToken struct {
	id        int64
	token     string
	name      string
	kind      string
	user      *user
	scopes    []string
	created   time.Time
	expiresAt time.Time
	revoked   bool
	lastUsed  time.Time
}

func (t *accessToken) has(scopes ...string) bool {
	for _, sc := range scopes {
		if slices.Contains(t.scopes, sc) {
			return true
		}
	}
	return false
}

// Runner access levels (GitLab's access_level).
const (
	accessNotProtected = "not_protected"
	accessRefProtected = "ref_protected"
)

// minMaximumTimeout is the shortest maximum_timeout GitLab accepts, in
// seconds (its runner model's validation: "needs to be at least 10
// minutes").
const minMaximumTimeout = 600

type runner struct {
	id              int64
	kind            string
	group           *group
	projects        []*project
	description     string
	tags            []string
	runUntagged     bool
	locked          bool
	paused          bool
	maintenanceNote string
	accessLevel     string
	maximumTimeout  int64
	token           string
	tokenExpiresAt  time.Time
	creator         *user
	created         time.Time
	contacted       time.Time
	// managers are the runner's managers by system_id (one per host that
	// verified the token, as GitLab records ci_runner_machines).
	managers map[string]time.Time
}

type pipeline struct {
	id      int64
	iid     int64
	project *project
	ref     string
	// protected: ref is a protected branch (GitLab's Ci::Pipeline
	// protected), so its jobs are protected jobs.
	protected bool
	sha       string
	status    string
	created   time.Time
	stages    []string
	jobs      []*job
	user      *user
}

type job struct {
	id            int64
	name          string
	stage         string
	script        []string
	tags          []string
	variables     map[string]string
	allowFailure  bool
	pipeline      *pipeline
	status        string
	token         string
	runner        *runner
	created       time.Time
	queued        time.Time
	started       time.Time
	finished      time.Time
	exitCode      *int
	failureReason string
	trace         []byte
	timeout       int
}

type hook struct {
	ID        int64  `json:"id"`
	UUID      string `json:"uuid"`
	URL       string `json:"url"`
	Token     string `json:"-"`
	ProjectID int64  `json:"projectId,omitempty"`
	GroupID   int64  `json:"groupId,omitempty"`
	// JobEvents must be on for Job Hook deliveries (GitLab's job_events).
	JobEvents bool `json:"jobEvents"`
}

// load builds the configured world.
func (s *Simulator) load(cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range cfg.Groups {
		if _, err := s.ensureGroupLocked(g.Path); err != nil {
			return err
		}
	}
	for _, p := range cfg.Projects {
		if _, err := s.addProjectLocked(p); err != nil {
			return err
		}
	}
	for _, u := range cfg.Users {
		if _, err := s.addUserLocked(u); err != nil {
			return err
		}
	}
	for _, t := range cfg.Tokens {
		if err := s.addTokenLocked(t); err != nil {
			return err
		}
	}
	return nil
}

// ensureGroupLocked returns the group at a full path, creating it and its
// parents.
func (s *Simulator) ensureGroupLocked(full string) (*group, error) {
	full = strings.Trim(full, "/")
	if full == "" {
		return nil, errors.New("group path is empty")
	}
	if g := s.groupByPathLocked(full); g != nil {
		return g, nil
	}
	var parent *group
	if i := strings.LastIndex(full, "/"); i > 0 {
		var err error
		if parent, err = s.ensureGroupLocked(full[:i]); err != nil {
			return nil, err
		}
	}
	if s.projectByPathLocked(full) != nil {
		return nil, fmt.Errorf("group %q: a project has that path", full)
	}
	name := full[strings.LastIndex(full, "/")+1:]
	g := &group{id: s.id("group"), name: name, path: name, fullPath: full, parent: parent, created: s.clock.Now()}
	s.groups[g.id] = g
	return g, nil
}

func (s *Simulator) addProjectLocked(p ProjectConfig) (*project, error) {
	full := strings.Trim(p.Path, "/")
	i := strings.LastIndex(full, "/")
	if i <= 0 {
		return nil, fmt.Errorf("project %q: give group/project (projects in a user's namespace are not modelled)", p.Path)
	}
	if s.projectByPathLocked(full) != nil {
		return nil, fmt.Errorf("project %q exists", full)
	}
	g, err := s.ensureGroupLocked(full[:i])
	if err != nil {
		return nil, err
	}
	branch := p.DefaultBranch
	if branch == "" {
		branch = "main"
	}
	pr := &project{id: s.id("project"), name: full[i+1:], path: full[i+1:], group: g, defaultBranch: branch, protected: p.ProtectedBranches, created: s.clock.Now()}
	s.projects[pr.id] = pr
	return pr, nil
}

func (s *Simulator) addUserLocked(u UserConfig) (*user, error) {
	if u.Username == "" {
		return nil, errors.New("user without username")
	}
	if s.userByNameLocked(u.Username) != nil {
		return nil, fmt.Errorf("user %q exists", u.Username)
	}
	nu := &user{id: s.id("user"), username: u.Username, name: u.Username, admin: u.Admin, created: s.clock.Now(), access: map[string]int{}}
	for path, level := range u.Members {
		key, err := s.sourceKeyLocked(path)
		if err != nil {
			return nil, fmt.Errorf("user %q: %w", u.Username, err)
		}
		nu.access[key] = level
	}
	s.users[nu.id] = nu
	return nu, nil
}

// sourceKeyLocked names a membership source: "p<id>" for a project's full
// path, else "g<id>" for a group's.
func (s *Simulator) sourceKeyLocked(path string) (string, error) {
	if p := s.projectByPathLocked(path); p != nil {
		return fmt.Sprintf("p%d", p.id), nil
	}
	if g := s.groupByPathLocked(path); g != nil {
		return fmt.Sprintf("g%d", g.id), nil
	}
	return "", fmt.Errorf("no group or project %q", path)
}

func (s *Simulator) addTokenLocked(t TokenConfig) error {
	if t.Token == "" {
		return errors.New("token without value")
	}
	if _, dup := s.tokens[t.Token]; dup {
		return fmt.Errorf("token %q configured twice", t.Name)
	}
	at := &accessToken{id: s.id("token"), token: t.Token, name: t.Name, kind: t.Kind, scopes: t.Scopes, created: s.clock.Now()}
	if at.kind == "" {
		at.kind = "personal"
	}
	if at.name == "" {
		at.name = at.kind + "-token"
	}
	if t.ExpiresAt != "" {
		d, err := time.Parse("2006-01-02", t.ExpiresAt)
		if err != nil {
			return fmt.Errorf("token %q expiresAt: %w", at.name, err)
		}
		at.expiresAt = d
	}
	switch at.kind {
	case "personal":
		at.user = s.userByNameLocked(t.User)
		if at.user == nil {
			return fmt.Errorf("token %q: no user %q", at.name, t.User)
		}
	case "project", "group":
		key, err := s.sourceKeyLocked(t.Resource)
		if err != nil {
			return fmt.Errorf("token %q: %w", at.name, err)
		}
		if (at.kind == "project") != strings.HasPrefix(key, "p") {
			return fmt.Errorf("token %q: %s is not a %s", at.name, t.Resource, at.kind)
		}
		level := t.AccessLevel
		if level == 0 {
			level = Maintainer
		}
		// GitLab names bot users <kind>_<id>_bot_<hex>.
		bot := &user{id: s.id("user"), bot: true, created: s.clock.Now(), access: map[string]int{key: level}}
		bot.username = fmt.Sprintf("%s_%s_bot_%s", at.kind, key[1:], randomHex(16))
		bot.name = at.name
		s.users[bot.id] = bot
		at.user = bot
	default:
		return fmt.Errorf("token %q: kind %q is not personal, project or group", at.name, at.kind)
	}
	s.tokens[at.token] = at
	return nil
}

func (s *Simulator) userByNameLocked(name string) *user {
	for _, u := range s.users {
		if strings.EqualFold(u.username, name) {
			return u
		}
	}
	return nil
}

func (s *Simulator) groupByPathLocked(full string) *group {
	for _, g := range s.groups {
		if strings.EqualFold(g.fullPath, full) {
			return g
		}
	}
	return nil
}

func (s *Simulator) projectByPathLocked(full string) *project {
	for _, p := range s.projects {
		if strings.EqualFold(p.fullPath(), full) {
			return p
		}
	}
	return nil
}

// groupLevel is u's access to g: the highest of its memberships in g and
// g's ancestors (GitLab's inherited membership); admins are Owners.
func (u *user) groupLevel(g *group) int {
	if u.admin {
		return Owner
	}
	level := 0
	for a := g; a != nil; a = a.parent {
		level = max(level, u.access[fmt.Sprintf("g%d", a.id)])
	}
	return level
}

// projectLevel is u's access to p: its project membership or one inherited
// from p's group.
func (u *user) projectLevel(p *project) int {
	if u.admin {
		return Owner
	}
	return max(u.access[fmt.Sprintf("p%d", p.id)], u.groupLevel(p.group))
}

// under reports whether g is a or a descendant of a.
func (g *group) under(a *group) bool {
	for x := g; x != nil; x = x.parent {
		if x == a {
			return true
		}
	}
	return false
}

// canRun reports whether r may pick up j: its scope covers the job's
// project, it is not paused, a ref_protected runner takes protected jobs
// only (a not_protected one takes any, protected ones included), the
// job's tags are all the runner's, and an untagged job needs run_untagged
// (GitLab's matching rules).
func (r *runner) canRun(j *job) bool {
	if r.paused || r.accessLevel == accessRefProtected && !j.pipeline.protected {
		return false
	}
	p := j.pipeline.project
	switch r.kind {
	case GroupType:
		if !p.group.under(r.group) {
			return false
		}
	case ProjectType:
		if !slices.Contains(r.projects, p) {
			return false
		}
	}
	if len(j.tags) == 0 {
		return r.runUntagged
	}
	for _, t := range j.tags {
		if !slices.Contains(r.tags, t) {
			return false
		}
	}
	return true
}

// status is the runner's REST status: online when contacted in the last
// two hours (GitLab's ONLINE_CONTACT_TIMEOUT), never_contacted, offline
// (paused is a separate field since GitLab 16).
func (r *runner) status(now time.Time) (string, bool) {
	switch {
	case r.contacted.IsZero():
		return "never_contacted", false
	case now.Sub(r.contacted) < 2*time.Hour:
		return "online", true
	default:
		return "offline", false
	}
}
