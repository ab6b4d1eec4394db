package machineclaim

import (
	"sync"
	"time"
)

// A claim taken from the standby tier waits for its VM's resume (the
// hypervisor reading the guest's memory back from storage), and every
// moment it looks too late is added to its job's start. It looks first
// when the cluster's resumes have been taking (learnt from the resumes
// this process saw), then every resumePoll until the VM is back: a few
// reads per resume, and the job waits at most resumePoll longer than the
// hypervisor (make bench's standby row: looked at every 2 s, the job
// waited a second longer than the resume, a third of its start).

// resumePoll is how often a resume that took longer than learnt is
// looked at again.
const resumePoll = 250 * time.Millisecond

// firstResumeGuess is when the first resume on a cluster is looked at,
// before anything is learnt: about the fastest resume of a small VM.
const firstResumeGuess = time.Second

// resumePace learns how long resumes take on each cluster. Safe for
// concurrent use; in memory: a restarted operator learns again.
type resumePace struct {
	mu   sync.Mutex
	took map[string]time.Duration
}

// learn records that a resume on cluster took d: a moving average, so
// that one slow resume (a busy storage) moves the next looks only a
// quarter of the way.
func (p *resumePace) learn(cluster string, d time.Duration) {
	if d <= 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.took == nil {
		p.took = map[string]time.Duration{}
	}
	if prev, ok := p.took[cluster]; ok {
		d = prev + (d-prev)/4
	}
	p.took[cluster] = d
}

// next is when to look at a resume on cluster that was asked for since
// ago: when resumes there have been taking, or resumePoll once that is
// past.
func (p *resumePace) next(cluster string, since time.Duration) time.Duration {
	p.mu.Lock()
	expected, ok := p.took[cluster]
	p.mu.Unlock()
	if !ok {
		expected = firstResumeGuess
	}
	if since < expected-resumePoll {
		return expected - since
	}
	return resumePoll
}
