package sweeper

import (
	"maps"
	"slices"
	"strings"
	"time"
)

// The sweeps remember what they found (a stray VM, ISO, runner, DNS name or
// SPIRE entry) in maps of records by key, "<cluster or scope>/<what>",
// guarded by Sweeper.mu. A record is made when the thing is first seen
// without a claim, so that it is reported once and removed only after the
// grace period counted from then; it is dropped when the thing is removed,
// adopted, or no longer listed. The functions below are that bookkeeping,
// one for every kind of record.

// sighting returns the record of key k in m, made with fresh when there is
// none, and whether this call made it.
func sighting[R any](s *Sweeper, m map[string]*R, k string, fresh func() *R) (*R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o := m[k]; o != nil {
		return o, false
	}
	o := fresh()
	m[k] = o
	return o, true
}

// forget drops the record of key k.
func forget[R any](s *Sweeper, m map[string]*R, k string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(m, k)
}

// forgetUnlisted drops the records under prefix ("" for all) that the
// latest listing did not show: the thing is gone, removed by its claim or
// by hand. A record that unfinished holds (a removal this sweeper started,
// which must be finished and reported even after the thing left the
// listing) is kept and returned, by key; unfinished may be nil.
func forgetUnlisted[R any](s *Sweeper, m map[string]*R, prefix string, listed map[string]bool, unfinished func(*R) bool) map[string]*R {
	kept := map[string]*R{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, o := range m {
		if !strings.HasPrefix(k, prefix) || listed[k] {
			continue
		}
		if unfinished != nil && unfinished(o) {
			kept[k] = o
			continue
		}
		delete(m, k)
	}
	return kept
}

// keepListed marks the records under prefix as listed: a sweep that could
// not list them (the DNS zones or the SPIRE server did not answer) must
// not forget them, which would restart their grace period.
func keepListed[R any](s *Sweeper, m map[string]*R, prefix string, listed map[string]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			listed[k] = true
		}
	}
}

// known returns the keys of the records in m.
func known[R any](s *Sweeper, m map[string]*R) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(m))
}

// removable reports whether the thing of record k in m, first seen without
// a live claim at firstSeen, is to be removed at now: it is due (the grace
// period has passed, not in dry-run mode) and the claims read from the API
// server (confirm) still do not own it; the cache the sweep began from may
// not show a claim created since. A thing a confirmed claim owns is
// forgotten, so that its grace period starts again if it is ever orphaned.
func removable[R, C any](s *Sweeper, m map[string]*R, k string, firstSeen, now time.Time, confirm func() (C, error), owns func(C) bool) (bool, error) {
	if !s.due(firstSeen, now) {
		return false, nil
	}
	claims, err := confirm()
	if err != nil {
		return false, err
	}
	if owns(claims) {
		forget(s, m, k)
		return false, nil
	}
	return true, nil
}
