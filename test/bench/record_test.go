//go:build bench

package bench

import (
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
)

// recorder counts the requests a simulator receives, by method and path
// pattern, and keeps the times of the ones a job's timeline needs.
type recorder struct {
	mu     sync.Mutex
	counts map[string]int
	// first holds the first time each pattern was seen since the last
	// reset (the cold-start timeline).
	first map[string]time.Time
	// last holds the last time each pattern was seen since the last
	// reset: a destroy refused because the VM still ran is followed by a
	// stop and the destroy that happens.
	last map[string]time.Time
	// onClone, when set, is called with every clone request's arrival.
	onClone func(time.Time)
	// vms, while tracing, holds when each VM id was first named in a
	// path and when its start and delete requests came (vmTimes).
	vms map[string]*vmTimes
}

// vmTimes are one VM's requests, for the churn's stages and the standby
// starts: its first, its start and destroy requests, its first resume and
// its first file written through the guest agent (the credential).
type vmTimes struct {
	first, start, destroy time.Time
	resume, placed        time.Time
}

func newRecorder() *recorder {
	return &recorder{counts: map[string]int{}, first: map[string]time.Time{}, last: map[string]time.Time{}}
}

func (r *recorder) observe(req *http.Request) {
	now := time.Now()
	key := req.Method + " " + pattern(req.URL.Path)
	r.mu.Lock()
	r.counts[key]++
	if _, ok := r.first[key]; !ok {
		r.first[key] = now
	}
	r.last[key] = now
	hook := r.onClone
	if r.vms != nil {
		r.traceVM(req, now)
	}
	r.mu.Unlock()
	if hook != nil && req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/clone") {
		hook(now)
	}
}

// snapshot returns a copy of the counts.
func (r *recorder) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.counts))
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

func (r *recorder) resetFirst() {
	r.mu.Lock()
	clear(r.first)
	clear(r.last)
	r.mu.Unlock()
}

// firstSeen returns when a request matching method and a pattern suffix
// was first seen since the last reset.
func (r *recorder) firstSeen(method, suffix string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at time.Time
	for k, t := range r.first {
		if strings.HasPrefix(k, method+" ") && strings.HasSuffix(k, suffix) && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	return at
}

// lastSeen returns when a request matching method and a pattern suffix
// was last seen since the last reset.
func (r *recorder) lastSeen(method, suffix string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at time.Time
	for k, t := range r.last {
		if strings.HasPrefix(k, method+" ") && strings.HasSuffix(k, suffix) && t.After(at) {
			at = t
		}
	}
	return at
}

// trace starts (or, with false, stops) keeping the VMs' request times.
func (r *recorder) trace(on bool) map[string]*vmTimes {
	r.mu.Lock()
	defer r.mu.Unlock()
	vms := r.vms
	r.vms = nil
	if on {
		r.vms = map[string]*vmTimes{}
	}
	return vms
}

// traceVM notes a request naming a VM (/nodes/{node}/qemu/{id}/...);
// the template's clone request names the template, not the new VM.
func (r *recorder) traceVM(req *http.Request, now time.Time) {
	_, rest, ok := strings.Cut(req.URL.Path, "/qemu/")
	if !ok || strings.HasSuffix(rest, "/clone") {
		return
	}
	id, _, _ := strings.Cut(rest, "/")
	vm := r.vms[id]
	if vm == nil {
		vm = &vmTimes{first: now}
		r.vms[id] = vm
	}
	switch {
	case req.Method == http.MethodPost && strings.HasSuffix(rest, "/status/start"):
		vm.start = now
	case req.Method == http.MethodDelete && !strings.Contains(rest, "/"):
		vm.destroy = now
	case req.Method == http.MethodPost && strings.HasSuffix(rest, "/status/resume") && vm.resume.IsZero():
		vm.resume = now
	case req.Method == http.MethodPost && strings.HasSuffix(rest, "/agent/file-write") && vm.placed.IsZero():
		vm.placed = now
	}
}

func (r *recorder) setOnClone(f func(time.Time)) {
	r.mu.Lock()
	r.onClone = f
	r.mu.Unlock()
}

// pattern replaces a path's variable parts (numbers, node names, task
// ids, owners and repositories) with placeholders, so that counts add up
// per kind of call.
func pattern(path string) string {
	path = strings.TrimPrefix(path, "/api2/json")
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for i, s := range segs {
		switch {
		case s == "":
		case strings.HasPrefix(s, "UPID:"):
			segs[i] = "{upid}"
		case strings.Contains(s, ":"):
			// A volume id (local:iso/hf-....iso) runs to the path's end.
			return "/" + strings.Join(append(segs[:i:i], "{volume}"), "/")
		case strings.IndexFunc(s, func(r rune) bool { return !unicode.IsDigit(r) }) < 0:
			segs[i] = "{id}"
		case i > 0 && (segs[i-1] == "nodes" || segs[i-1] == "storage"):
			segs[i] = "{" + segs[i-1] + "}"
		case i > 0 && (segs[i-1] == "repos" || segs[i-1] == "orgs"):
			segs[i] = "{owner}"
			if segs[i-1] == "repos" && i+1 < len(segs) {
				segs[i+1] = "{repo}"
			}
		}
	}
	return "/" + strings.Join(segs, "/")
}
