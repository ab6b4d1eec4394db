package proxmoxsim

import (
	"container/heap"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// task is a Proxmox worker task (what a UPID names).
type task struct {
	upid      string
	node      string
	typ       string
	id        string
	user      string // user@realm
	tokenid   string
	pid       int
	pstart    int64
	starttime int64
	endtime   int64
	running   bool
	// exitstatus is "OK", "WARNINGS: N" or the error text, once stopped.
	exitstatus string
	warnings   int
	log        []string
}

// newTaskLocked starts a worker task. The UPID's user field is the full
// user@realm!token of the caller, its id field whatever the endpoint puts
// there (the SOURCE vmid for clones, empty for uploads).
func (s *Simulator) newTaskLocked(nodeName, typ, id string, caller *identity) *task {
	now := s.clock.Now()
	s.lastPID++
	n := s.nodes[nodeName]
	// pstart is the process start in clock ticks since boot; it grows with
	// node uptime and passes 8 hex digits on long-running nodes.
	pstart := int64(now.Sub(n.bootTime)/(10*time.Millisecond)) + int64(s.lastPID)
	t := &task{
		node: nodeName, typ: typ, id: id, pid: s.lastPID, pstart: pstart,
		starttime: now.Unix(), running: true,
	}
	userField := "root@pam"
	if caller != nil {
		userField = caller.userString()
		t.user = caller.user.id
		if caller.token != nil {
			t.tokenid = caller.token.id
		}
	} else {
		t.user = userField
	}
	t.upid = fmt.Sprintf("UPID:%s:%08X:%08X:%08X:%s:%s:%s:", nodeName, t.pid, t.pstart, t.starttime, typ, id, userField)
	s.tasks[t.upid] = t
	s.taskOrder = append(s.taskOrder, t.upid)
	return t
}

// logf appends a line to the task log.
func (t *task) logf(format string, args ...any) {
	t.log = append(t.log, fmt.Sprintf(format, args...))
}

// finish stops the task with err (nil for success).
func (t *task) finish(at time.Time, err error) {
	if !t.running {
		return
	}
	t.running = false
	t.endtime = at.Unix()
	switch {
	case err != nil:
		t.exitstatus = strings.TrimSuffix(err.Error(), "\n")
		t.logf("TASK ERROR: %s", t.exitstatus)
	case t.warnings > 0:
		t.exitstatus = fmt.Sprintf("WARNINGS: %d", t.warnings)
		t.logf("TASK WARNINGS: %d", t.warnings)
	default:
		t.exitstatus = "OK"
		t.logf("TASK OK")
	}
}

func (s *Simulator) lookupTask(q *apiRequest) (*task, error) {
	upid := q.vars["upid"]
	m := upidRE.FindStringSubmatch(upid)
	if m == nil {
		return nil, serverError("unable to parse worker upid '%s'", upid)
	}
	t := s.tasks[upid]
	if t == nil || t.node != q.vars["node"] {
		return nil, paramError(map[string]string{"upid": "no such task"})
	}
	// Owners may read their tasks; others need Sys.Audit on the node.
	if q.auth != nil && t.user != q.auth.user.id && !s.allowedLocked(q, "task", map[string]string{"node": t.node}) {
		return nil, &apiError{code: http.StatusForbidden, msg: fmt.Sprintf("Permission check failed (/nodes/%s, Sys.Audit)\n", t.node)}
	}
	return t, nil
}

// handleTaskStatus is GET /nodes/{node}/tasks/{upid}/status.
func (s *Simulator) handleTaskStatus(q *apiRequest) (any, error) {
	t, err := s.lookupTask(q)
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"upid": t.upid, "node": t.node, "pid": t.pid, "pstart": t.pstart, "starttime": t.starttime,
		"type": t.typ, "id": t.id, "user": t.user, "status": "running",
	}
	if t.tokenid != "" {
		out["tokenid"] = t.tokenid
	}
	if !t.running {
		out["status"] = "stopped"
		out["exitstatus"] = t.exitstatus
	}
	return out, nil
}

// handleTaskLog is GET /nodes/{node}/tasks/{upid}/log.
func (s *Simulator) handleTaskLog(q *apiRequest) (any, error) {
	t, err := s.lookupTask(q)
	if err != nil {
		return nil, err
	}
	start := int(q.integer("start", 0))
	limit := int(q.integer("limit", 50))
	lines := []map[string]any{}
	for i := start; i < len(t.log) && len(lines) < limit; i++ {
		lines = append(lines, map[string]any{"n": i + 1, "t": t.log[i]})
	}
	return lines, nil
}

// event is work scheduled on the clock (a task step, a boot, a sample).
type event struct {
	at  time.Time
	seq uint64
	fn  func(at time.Time)
}

type eventQueue []*event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at.Equal(q[j].at) {
		return q[i].seq < q[j].seq
	}
	return q[i].at.Before(q[j].at)
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// scheduleLocked runs fn (with the state lock held) once the clock reaches
// at. Events due at the same instant run in scheduling order.
func (s *Simulator) scheduleLocked(at time.Time, fn func(at time.Time)) {
	s.eventSeq++
	heap.Push(&s.events, &event{at: at, seq: s.eventSeq, fn: fn})
	s.armTimerLocked()
}

// after schedules fn d from now.
func (s *Simulator) afterLocked(d time.Duration, fn func(at time.Time)) {
	s.scheduleLocked(s.clock.Now().Add(d), fn)
}

// runDueLocked runs every event that is due. Requests call it first, so
// state is always current even if the timer goroutine has not run yet.
func (s *Simulator) runDueLocked() {
	now := s.clock.Now()
	for len(s.events) > 0 && !s.events[0].at.After(now) {
		e := heap.Pop(&s.events).(*event)
		e.fn(e.at)
	}
	s.armTimerLocked()
}

// armTimerLocked keeps one clock timer armed for the earliest event.
func (s *Simulator) armTimerLocked() {
	if s.closed {
		return
	}
	if len(s.events) == 0 {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		return
	}
	next := s.events[0].at
	if s.timer != nil && s.timerAt.Equal(next) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerAt = next
	s.timer = s.clock.AfterFunc(next.Sub(s.clock.Now()), s.onTimer)
}

func (s *Simulator) onTimer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.timer = nil
	s.runDueLocked()
}
