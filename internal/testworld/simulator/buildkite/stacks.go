package buildkitesim

import (
	"net/http"
	"slices"
	"strings"
	"time"
)

// The Stacks API (agent API, /v3/stacks/...), which a stack controller
// calls with a cluster agent token: register a stack for a cluster queue,
// reserve scheduled jobs, and issue job acquisition tokens (bkjat_) for
// reserved jobs. An agent registers with such a token and may acquire only
// that job. Facts from Buildkite's Stacks API and job acquisition token
// documentation, as README.md lists them.

const (
	// jatPrefix starts every job acquisition token.
	jatPrefix = "bkjat_"
	// defaultJATLifetime and maxJATLifetime bound token_lifetime_seconds.
	defaultJATLifetime = 15 * time.Minute
	maxJATLifetime     = time.Hour
	// defaultReservation is reservation_expiry_seconds when not given.
	defaultReservation = 15 * time.Minute
	// maxBatch bounds job_uuids in one call.
	maxBatch = 100
)

type stack struct {
	key, typ, queueKey string
	metadata           map[string]string
	cluster            *cluster
	createdAt          time.Time
}

// jobToken is a job acquisition token: good for registering an agent that
// acquires job only, until expiresAt (never past the reservation), while
// the cluster agent token that issued it stays active.
type jobToken struct {
	token     string
	job       *job
	stack     *stack
	issuer    *clusterToken
	issuedAt  time.Time
	expiresAt time.Time
	used      bool
}

// reservedLocked says whether a job is held by a stack's unexpired
// reservation.
func (s *Simulator) reservedLocked(j *job) bool {
	return j.reservedBy != nil && s.clock.Now().Before(j.reservedUntil)
}

func (s *Simulator) serveStacksLocked(r *http.Request, p string) (int, any, error) {
	tok := s.clusterTokenLocked(bearerToken(r))
	if tok == nil {
		return 0, nil, errf(http.StatusUnauthorized, "Invalid token")
	}
	if !ipAllowed(tok.allowedIPs, r.RemoteAddr) {
		return 0, nil, errf(http.StatusUnauthorized, "Invalid token: the IP address is not allowed")
	}
	if r.Method == http.MethodPost && p == "register" {
		return s.registerStackLocked(r, tok)
	}
	seg := strings.Split(p, "/")
	if len(seg) < 2 {
		return 0, nil, errf(http.StatusNotFound, "Not Found")
	}
	st := s.stacks[seg[0]]
	if st == nil || st.cluster != tok.cluster {
		return 0, nil, errf(http.StatusNotFound, "No stack found with key %q", seg[0])
	}
	switch rest := strings.Join(seg[1:], "/"); {
	case r.Method == http.MethodPut && rest == "scheduled-jobs/batch-reserve":
		return s.reserveLocked(r, st)
	case r.Method == http.MethodPost && rest == "job-acquisition-tokens":
		return s.issueJATsLocked(r, st, tok)
	case r.Method == http.MethodPost && rest == "deregister":
		delete(s.stacks, st.key)
		return http.StatusOK, map[string]any{}, nil
	}
	return 0, nil, errf(http.StatusNotFound, "Not Found")
}

func (s *Simulator) registerStackLocked(r *http.Request, tok *clusterToken) (int, any, error) {
	var req struct {
		Key      string            `json:"key"`
		Type     string            `json:"type"`
		QueueKey string            `json:"queue_key"`
		Metadata map[string]string `json:"metadata"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	switch {
	case req.Key == "" || req.Type == "" || req.QueueKey == "":
		return 0, nil, errf(http.StatusUnprocessableEntity, "key, type and queue_key are required")
	case req.Type != "custom":
		return 0, nil, errf(http.StatusUnprocessableEntity, "type %q is reserved; third-party stacks use \"custom\"", req.Type)
	case tok.cluster.queueByKey(req.QueueKey) == nil:
		return 0, nil, errf(http.StatusUnprocessableEntity, "The queue %q does not exist in cluster %q", req.QueueKey, tok.cluster.name)
	}
	code := http.StatusOK
	st := s.stacks[req.Key]
	switch {
	case st == nil:
		st = &stack{key: req.Key, cluster: tok.cluster, createdAt: s.clock.Now()}
		s.stacks[req.Key] = st
		code = http.StatusCreated
	case st.cluster != tok.cluster:
		return 0, nil, errf(http.StatusUnprocessableEntity, "The stack key %q is taken in another cluster", req.Key)
	}
	st.typ, st.queueKey, st.metadata = req.Type, req.QueueKey, req.Metadata
	return code, map[string]any{"key": st.key, "type": st.typ, "cluster_queue_key": st.queueKey, "metadata": st.metadata}, nil
}

// reserveLocked reserves the scheduled jobs of the stack's cluster that no
// other stack holds; the rest are not_reserved.
func (s *Simulator) reserveLocked(r *http.Request, st *stack) (int, any, error) {
	var req struct {
		JobUUIDs []string `json:"job_uuids"`
		Expiry   int      `json:"reservation_expiry_seconds"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	if len(req.JobUUIDs) == 0 || len(req.JobUUIDs) > maxBatch || req.Expiry < 0 {
		return 0, nil, errf(http.StatusUnprocessableEntity, "job_uuids must hold 1 to %d jobs and reservation_expiry_seconds be positive", maxBatch)
	}
	expiry := defaultReservation
	if req.Expiry > 0 {
		expiry = time.Duration(req.Expiry) * time.Second
	}
	reserved, notReserved := []string{}, []string{}
	for _, id := range req.JobUUIDs {
		j := s.jobs[id]
		if j == nil || j.state != stateScheduled || j.build.pipeline.cluster != st.cluster ||
			(s.reservedLocked(j) && j.reservedBy != st) {
			notReserved = append(notReserved, id)
			continue
		}
		j.reservedBy, j.reservedUntil = st, s.clock.Now().Add(expiry)
		reserved = append(reserved, id)
	}
	return http.StatusOK, map[string]any{"reserved": reserved, "not_reserved": notReserved}, nil
}

// issueJATsLocked issues a job acquisition token for each job the stack
// holds reserved; its life ends at token_lifetime_seconds (900 by default,
// at most 3600) or with the reservation, whichever comes first.
func (s *Simulator) issueJATsLocked(r *http.Request, st *stack, issuer *clusterToken) (int, any, error) {
	var req struct {
		JobUUIDs []string `json:"job_uuids"`
		Lifetime int      `json:"token_lifetime_seconds"`
	}
	if err := decodeBody(r, &req); err != nil {
		return 0, nil, err
	}
	lifetime := defaultJATLifetime
	if req.Lifetime != 0 {
		lifetime = time.Duration(req.Lifetime) * time.Second
	}
	if len(req.JobUUIDs) == 0 || len(req.JobUUIDs) > maxBatch || lifetime <= 0 || lifetime > maxJATLifetime {
		return 0, nil, errf(http.StatusUnprocessableEntity, "job_uuids must hold 1 to %d jobs and token_lifetime_seconds be 1 to %d", maxBatch, int(maxJATLifetime.Seconds()))
	}
	now := s.clock.Now()
	issued, notIssued := []map[string]any{}, []string{}
	for _, id := range req.JobUUIDs {
		j := s.jobs[id]
		if j == nil || j.state != stateScheduled || j.reservedBy != st || !s.reservedLocked(j) {
			notIssued = append(notIssued, id)
			continue
		}
		jt := &jobToken{token: jatPrefix + randomToken(24), job: j, stack: st, issuer: issuer, issuedAt: now, expiresAt: now.Add(lifetime)}
		if j.reservedUntil.Before(jt.expiresAt) {
			jt.expiresAt = j.reservedUntil
		}
		s.jobTokens[jt.token] = jt
		issued = append(issued, map[string]any{"job_uuid": j.id, "job_acquisition_token": jt.token, "expires_at": bkTime(jt.expiresAt)})
	}
	return http.StatusCreated, map[string]any{"job_acquisition_tokens": issued, "not_issued": notIssued}, nil
}

// jobTokenLocked is the usable job acquisition token of that secret: not
// used, not expired, its job still reserved and scheduled, and the agent
// token that issued it still active (deleting that token revokes it).
func (s *Simulator) jobTokenLocked(secret string) *jobToken {
	jt := s.jobTokens[secret]
	if jt == nil || jt.used || !s.clock.Now().Before(jt.expiresAt) {
		return nil
	}
	if s.clusterTokenLocked(jt.issuer.token) == nil {
		return nil
	}
	return jt
}

// IssueJobToken does what a stack controller does through the Stacks API
// with the cluster agent token secret: registers the stack "sim-<queue>",
// reserves job for lifetime and issues its job acquisition token, which it
// returns. For tests that need a token without an operator.
func (s *Simulator) IssueJobToken(secret, queue, jobID string, lifetime time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tok := s.clusterTokenLocked(secret)
	if tok == nil {
		return "", errf(http.StatusUnauthorized, "Invalid token")
	}
	if tok.cluster.queueByKey(queue) == nil {
		return "", errf(http.StatusUnprocessableEntity, "no queue %q", queue)
	}
	st := s.stacks["sim-"+queue]
	if st == nil {
		st = &stack{key: "sim-" + queue, typ: "custom", queueKey: queue, cluster: tok.cluster, createdAt: s.clock.Now()}
		s.stacks[st.key] = st
	}
	j := s.jobs[jobID]
	if j == nil || j.state != stateScheduled || j.build.pipeline.cluster != tok.cluster || (s.reservedLocked(j) && j.reservedBy != st) {
		return "", errf(http.StatusUnprocessableEntity, "job %s cannot be reserved", jobID)
	}
	if lifetime <= 0 || lifetime > maxJATLifetime {
		return "", errf(http.StatusUnprocessableEntity, "lifetime %v is not in (0, 1h]", lifetime)
	}
	now := s.clock.Now()
	j.reservedBy, j.reservedUntil = st, now.Add(lifetime)
	jt := &jobToken{token: jatPrefix + randomToken(24), job: j, stack: st, issuer: tok, issuedAt: now, expiresAt: now.Add(lifetime)}
	s.jobTokens[jt.token] = jt
	return jt.token, nil
}

// JobTokenInfo is what a test reads back about a job acquisition token.
type JobTokenInfo struct {
	Token     string    `json:"token"`
	Job       string    `json:"job"`
	Stack     string    `json:"stack"`
	IssuedAt  time.Time `json:"issuedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
	// Issuer is the description of the cluster agent token that issued it.
	Issuer string `json:"issuer"`
	Used   bool   `json:"used"`
}

// JobTokens lists every job acquisition token issued, oldest first.
func (s *Simulator) JobTokens() []JobTokenInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]JobTokenInfo, 0, len(s.jobTokens))
	for _, jt := range s.jobTokens {
		out = append(out, JobTokenInfo{Token: jt.token, Job: jt.job.id, Stack: jt.stack.key, IssuedAt: jt.issuedAt,
			ExpiresAt: jt.expiresAt, Issuer: jt.issuer.description, Used: jt.used})
	}
	slices.SortFunc(out, func(a, b JobTokenInfo) int { return a.IssuedAt.Compare(b.IssuedAt) })
	return out
}
