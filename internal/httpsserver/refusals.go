package httpsserver

import (
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// refusedLogInterval is the least time between two Info lines of one
// RefusalLog: a flood must not become a flood of log lines.
const refusedLogInterval = 10 * time.Second

// RefusalLog logs what a server refuses (connections beyond a cap,
// requests without a valid proof or token) so that a flood of refusals is
// not a flood of log lines: each refusal at debug level (V(1)), and at
// most one Info line every 10 s saying how many were refused since the
// previous one, by reason, with the latest refusal's details. The metrics
// count every refusal. The zero value is ready to use; it is safe for
// concurrent use.
type RefusalLog struct {
	// Message is the Info line's message, such as "Credential broker
	// refused requests".
	Message string
	// now is the clock (time.Now when nil; tests set it).
	now func() time.Time

	mu sync.Mutex
	// last is when the Info line was last written, counts what was
	// refused since, by reason.
	last   time.Time
	counts map[string]int
}

// Refused logs one refusal: msg and keysAndValues at V(1), and, unless one
// was written within the last 10 s, the Info line.
func (l *RefusalLog) Refused(log logr.Logger, reason, msg string, keysAndValues ...any) {
	kv := append([]any{"reason", reason}, keysAndValues...)
	log.V(1).Info(msg, kv...)
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	l.mu.Lock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[reason]++
	t := now()
	if !l.last.IsZero() && t.Sub(l.last) < refusedLogInterval {
		l.mu.Unlock()
		return
	}
	counts, total := l.counts, 0
	for _, n := range counts {
		total += n
	}
	l.last, l.counts = t, nil
	l.mu.Unlock()
	log.Info(l.Message, append([]any{"refusedSinceLastLine", total, "byReason", counts, "latest", msg}, kv...)...)
}
