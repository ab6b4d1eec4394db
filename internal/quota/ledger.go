package quota

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/hyperfleet/hyperfleet/internal/metrics"
)

// Claim is one claim of a namespace as the cache shows it: Cluster is the
// cluster its VM is on (or being built on), empty while it has none; Use
// is what that VM counts, from its signed placement record.
type Claim struct {
	UID     types.UID
	Cluster string
	Use     Use
}

// Source lists a namespace's claims from the operator's cache. The cache
// must only move forward: a claim it once showed with a VM it shows so
// until that VM is destroyed.
type Source func(ctx context.Context, namespace string) ([]Claim, error)

// key is one namespace on one cluster: what a quota bounds.
type key struct{ cluster, namespace string }

// charge is a claim admitted by this ledger whose placement record the
// cache does not show yet.
type charge struct {
	key
	use Use
}

// Ledger decides whether a claim may be placed. A namespace's usage on a
// cluster is counted from the cache (every claim with a VM there, from its
// placement record) and from the claims this ledger admitted whose record
// the cache does not show yet; both are read and the claim charged under
// one lock, so that concurrent reconciles never admit two claims into the
// same room. After a restart the ledger starts empty: the cache, synced
// before the first reconcile, shows every record written, since a record
// is written before its VM's clone request.
type Ledger struct {
	source Source

	mu sync.Mutex
	// pending are the charges of admitted claims, by claim UID, until the
	// cache shows their record (or them gone), or the caller releases one
	// whose record was not written.
	pending map[types.UID]charge
	// waiting are the claims refused, by namespace and cluster, until they
	// are admitted or forgotten: they are woken when room is freed.
	waiting map[key]map[types.UID]types.NamespacedName
	// limits are each namespace's limits on each cluster as last applied,
	// for the metrics.
	limits map[key][]Rule
}

// NewLedger returns an empty ledger over source.
func NewLedger(source Source) *Ledger {
	return &Ledger{source: source, pending: map[types.UID]charge{}, waiting: map[key]map[types.UID]types.NamespacedName{}, limits: map[key][]Rule{}}
}

// Admit decides whether claim (its UID and name) may place a VM needing
// need on cluster under rules (the limits of the tenancy rules that apply;
// every one is enforced). Admitted, the claim is charged until the cache
// shows its placement record; the caller releases the charge (Release)
// when it does not write the record. Refused, it returns the first limit
// exceeded, and the claim waits (Waiters) until it is admitted or
// forgotten. An error is a failed read of the cache: nothing is charged.
func (l *Ledger) Admit(ctx context.Context, cluster string, claim types.NamespacedName, uid types.UID, rules []Rule, need Use) (*Exceeded, error) {
	k := key{cluster: cluster, namespace: claim.Namespace}
	l.mu.Lock()
	defer l.mu.Unlock()
	usage, err := l.usageLocked(ctx, k, uid)
	if err != nil {
		return nil, err
	}
	l.limits[k] = rules
	if ex := exceeded(rules, usage, need); ex != nil {
		ex.Cluster, ex.Namespace = cluster, claim.Namespace
		w := l.waiting[k]
		if w == nil {
			w = map[types.UID]types.NamespacedName{}
			l.waiting[k] = w
		}
		w[uid] = claim
		// A charge of its own from an earlier admission (its record not
		// written yet) would hold room it does not use while it waits.
		delete(l.pending, uid)
		l.recordLocked(k, usage)
		return ex, nil
	}
	l.unwaitLocked(uid)
	l.pending[uid] = charge{key: k, use: need}
	usage.add(need)
	l.recordLocked(k, usage)
	return nil, nil
}

// usageLocked is what namespace k.namespace uses on k.cluster: the cache's
// claims with a VM there and the pending charges there, each claim once,
// leaving out self (a claim admitted again after a release or a failed
// write replaces its own charge). Pending charges the cache now accounts
// for (their claim shows a VM, or is gone) are dropped.
func (l *Ledger) usageLocked(ctx context.Context, k key, self types.UID) (Use, error) {
	claims, err := l.source(ctx, k.namespace)
	if err != nil {
		return nil, fmt.Errorf("list the claims of namespace %s: %w", k.namespace, err)
	}
	usage := Use{}
	listed := make(map[types.UID]bool, len(claims))
	for _, c := range claims {
		listed[c.UID] = true
		if c.Cluster == "" {
			continue
		}
		delete(l.pending, c.UID)
		if c.Cluster == k.cluster && c.UID != self {
			usage.add(c.Use)
		}
	}
	for uid, ch := range l.pending {
		if ch.namespace != k.namespace {
			continue
		}
		if !listed[uid] {
			// Deleted before the cache showed its record: its VM was
			// never made or is destroyed (the claim's finalizer waits for
			// that).
			delete(l.pending, uid)
			continue
		}
		if ch.cluster == k.cluster && uid != self {
			usage.add(ch.use)
		}
	}
	return usage, nil
}

// Release drops the charge of a claim whose placement record was not
// written after all (the pass did not place it, or the write failed), and
// returns the claims waiting in its namespace on its cluster, to wake.
func (l *Ledger) Release(uid types.UID) []types.NamespacedName {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.pending[uid]
	if !ok {
		return nil
	}
	delete(l.pending, uid)
	return l.waitersLocked(ch.key)
}

// Forget drops everything the ledger holds of a claim: its VM was
// destroyed, or the claim is gone.
func (l *Ledger) Forget(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.pending, uid)
	l.unwaitLocked(uid)
}

// Freed recounts a namespace's usage on a cluster after one of its VMs
// there was destroyed (the cache shows it so already) and returns the
// claims waiting there, to wake.
func (l *Ledger) Freed(ctx context.Context, cluster, namespace string) ([]types.NamespacedName, error) {
	k := key{cluster: cluster, namespace: namespace}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.limits[k]; known {
		usage, err := l.usageLocked(ctx, k, "")
		if err != nil {
			return l.waitersLocked(k), err
		}
		l.recordLocked(k, usage)
	}
	return l.waitersLocked(k), nil
}

// Waiting reports whether the claim waits for quota.
func (l *Ledger) Waiting(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, w := range l.waiting {
		if _, ok := w[uid]; ok {
			return true
		}
	}
	return false
}

func (l *Ledger) waitersLocked(k key) []types.NamespacedName {
	out := make([]types.NamespacedName, 0, len(l.waiting[k]))
	for _, n := range l.waiting[k] {
		out = append(out, n)
	}
	return out
}

func (l *Ledger) unwaitLocked(uid types.UID) {
	for k, w := range l.waiting {
		if _, ok := w[uid]; !ok {
			continue
		}
		delete(w, uid)
		metrics.QuotaWaitingClaims.WithLabelValues(k.namespace, k.cluster).Set(float64(len(w)))
	}
}

// recordLocked sets the metrics of k: its usage, its limits (the strictest
// of its rules) and how many claims wait.
func (l *Ledger) recordLocked(k key, usage Use) {
	metrics.QuotaWaitingClaims.WithLabelValues(k.namespace, k.cluster).Set(float64(len(l.waiting[k])))
	for _, res := range Resources {
		metrics.QuotaUsage.WithLabelValues(k.namespace, k.cluster, string(res)).Set(float64(usage[res]))
		limit, limited := int64(0), false
		for _, r := range l.limits[k] {
			if n, ok := r.limit(res); ok && (!limited || n < limit) {
				limit, limited = n, true
			}
		}
		if limited {
			metrics.QuotaLimit.WithLabelValues(k.namespace, k.cluster, string(res)).Set(float64(limit))
		} else {
			metrics.QuotaLimit.DeleteLabelValues(k.namespace, k.cluster, string(res))
		}
	}
}
