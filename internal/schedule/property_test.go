package schedule

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
	"pgregory.net/rapid"

	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
)

// Zones with daylight saving time at 02:00 (Europe/Berlin), at 02:00 local
// on other dates (America/New_York), by half an hour (Australia/Lord_Howe),
// at midnight until 2019 (America/Sao_Paulo), at a 45-minute offset
// (Pacific/Chatham), and without it (UTC, Asia/Kolkata).
var propZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Sao_Paulo", "Pacific/Chatham", "Asia/Kolkata"}

var (
	cronMinutes = []string{"0", "30", "*/15", "5,35", "*", "59"}
	cronHours   = []string{"*", "0", "1", "2", "3", "8-17", "*/6", "0,12", "2-3", "23"}
	cronDoms    = []string{"*", "*", "1", "15", "29-31", "31"}
	cronMonths  = []string{"*", "*", "2,3", "10,11", "4,9,10"}
	cronDows    = []string{"*", "*", "1-5", "0", "6"}
)

var (
	transitionsMu sync.Mutex
	transitionsOf = map[string][]time.Time{}
)

// transitions lists the instants between 2015 and 2030 at which loc's
// offset changes (hour resolution is enough to aim near them).
func transitions(loc *time.Location) []time.Time {
	transitionsMu.Lock()
	defer transitionsMu.Unlock()
	if ts, ok := transitionsOf[loc.String()]; ok {
		return ts
	}
	var ts []time.Time
	t := time.Date(2015, 1, 1, 0, 0, 0, 0, time.UTC)
	_, prev := t.In(loc).Zone()
	for ; t.Year() < 2031; t = t.Add(time.Hour) {
		if _, off := t.In(loc).Zone(); off != prev {
			ts, prev = append(ts, t), off
		}
	}
	transitionsOf[loc.String()] = ts
	return ts
}

// scan is how far ahead the brute force evaluates, minute by minute, and
// maxDuration the longest window generated.
const (
	scan        = 2 * 24 * time.Hour
	maxDuration = 6 * time.Hour
)

// Feature: hyperfleet-operator, Property: scheduled minimum
//
// TestScheduledMinimumProperty: for generated schedules (cron fields,
// zones with and without daylight saving time, durations, floors) and
// instants near the zones' offset changes and month ends, Evaluate's
// effective minimums and open windows (each with the start of the window
// in effect and its end) equal a brute-force evaluation,
// minute by minute, over the starts robfig/cron enumerates; and its next
// change is exactly the first minute at which that answer differs (or
// lies beyond the two days scanned when none does).
func TestScheduledMinimumProperty(t *testing.T) {
	proptest.Check(t, 200, func(rt *rapid.T) {
		zone := rapid.SampledFrom(propZones).Draw(rt, "zone")
		loc, err := time.LoadLocation(zone)
		if err != nil {
			rt.Fatal(err)
		}
		var now time.Time
		if ts := transitions(loc); len(ts) > 0 && rapid.Bool().Draw(rt, "nearChange") {
			now = rapid.SampledFrom(ts).Draw(rt, "change").Add(time.Duration(rapid.IntRange(-36*60, 12*60).Draw(rt, "minutesFromChange")) * time.Minute)
		} else {
			// Around a month's end, in the zone.
			y, m := rapid.IntRange(2015, 2030).Draw(rt, "year"), rapid.IntRange(1, 12).Draw(rt, "month")
			now = time.Date(y, time.Month(m), rapid.IntRange(26, 32).Draw(rt, "day"), rapid.IntRange(0, 23).Draw(rt, "hour"), rapid.IntRange(0, 59).Draw(rt, "minute"), 0, 0, loc)
		}
		now = now.UTC().Truncate(time.Minute)
		baseR, baseI := int32(rapid.IntRange(0, 3).Draw(rt, "baseReplicas")), int32(rapid.IntRange(0, 3).Draw(rt, "baseIdle"))
		n := rapid.IntRange(1, 3).Draw(rt, "schedules")
		var specs []Spec
		for i := range n {
			sp := Spec{
				Name: fmt.Sprintf("s%d", i),
				Cron: strings.Join([]string{rapid.SampledFrom(cronMinutes).Draw(rt, "minute"), rapid.SampledFrom(cronHours).Draw(rt, "hour"),
					rapid.SampledFrom(cronDoms).Draw(rt, "dom"), rapid.SampledFrom(cronMonths).Draw(rt, "month"), rapid.SampledFrom(cronDows).Draw(rt, "dow")}, " "),
				TimeZone: zone,
				Duration: time.Duration(rapid.IntRange(1, int(maxDuration/time.Minute)).Draw(rt, "durationMinutes")) * time.Minute,
			}
			if i > 0 && rapid.Bool().Draw(rt, "otherZone") {
				sp.TimeZone = rapid.SampledFrom(propZones).Draw(rt, "zone")
			}
			if rapid.Bool().Draw(rt, "raisesReplicas") {
				sp.MinReplicas = ptrTo(int32(rapid.IntRange(0, 6).Draw(rt, "minReplicas")))
			}
			if sp.MinReplicas == nil || rapid.Bool().Draw(rt, "raisesIdle") {
				sp.MinIdle = ptrTo(int32(rapid.IntRange(0, 6).Draw(rt, "minIdle")))
			}
			specs = append(specs, sp)
		}
		schedules, errs := Compile(specs, now.Add(-maxDuration))
		for _, err := range errs {
			// A combination that never fires (the 31st of February) is
			// refused, and is no window.
			if !strings.Contains(err.Error(), ErrNeverFires.Error()) {
				rt.Fatalf("compile: %v", err)
			}
		}

		// Ends past the scan are known to be past it, not where.
		cutoff := now.Add(scan)
		brute := bruteForce(schedules, now, cutoff, baseR, baseI)
		got := Evaluate(now, baseR, baseI, schedules)
		if want := brute(now, true); got.withStart(cutoff) != want {
			rt.Fatalf("at %s: Evaluate says %s, minute by minute %s", now, got.withStart(cutoff), want)
		}
		// Within the minute nothing changes: starts are whole minutes and
		// durations whole minutes.
		mid := now.Add(time.Duration(rapid.IntRange(1, 59).Draw(rt, "seconds")) * time.Second)
		if g := Evaluate(mid, baseR, baseI, schedules); g.withStart(cutoff) != got.withStart(cutoff) {
			rt.Fatalf("at %s: %s, at %s: %s", now, got.withStart(cutoff), mid, g.withStart(cutoff))
		}
		first := time.Time{}
		for m := now.Add(time.Minute); !m.After(now.Add(scan)); m = m.Add(time.Minute) {
			if brute(m, false) != got.key(cutoff) {
				first = m
				break
			}
		}
		switch {
		case first.IsZero() && !got.NextChange.IsZero() && !got.NextChange.After(now.Add(scan)):
			rt.Fatalf("at %s (%s): next change %s, but minute by minute nothing changes for %s", now, got.key(cutoff), got.NextChange, scan)
		case !first.IsZero() && !got.NextChange.Equal(first):
			rt.Fatalf("at %s (%s): next change %s, minute by minute %s (%s)", now, got.key(cutoff), got.NextChange, first, brute(first, false))
		}
	})
}

func ptrTo[T any](v T) *T { return &v }

// key is an answer without its next change: the minimums and the open
// windows (name and end); withStart adds the start of each window in
// effect, which moves from window to window while the answer stays.
func (a Answer) key(cutoff time.Time) string { return a.format(false, cutoff) }

func (a Answer) withStart(cutoff time.Time) string { return a.format(true, cutoff) }

// beyond stands for an end after the brute force's reach (cutoff).
var beyond = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

func (a Answer) format(start bool, cutoff time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "min %d/%d", a.MinReplicas, a.MinIdle)
	for _, w := range a.Active {
		end := w.End
		if end.After(cutoff) {
			end = beyond
		}
		fmt.Fprintf(&b, " %s[", w.Name)
		if start {
			b.WriteString(w.Start.UTC().Format("01-02T15:04"))
		}
		fmt.Fprintf(&b, ",%s)", end.UTC().Format("01-02T15:04"))
	}
	return b.String()
}

// bruteForce returns an evaluation, minute by minute, over the starts of
// each schedule (matches) from before now to after the scan: a minute m is in a schedule's window when
// a start s has s <= m < s+duration; the window's end is the first later
// minute in none.
func bruteForce(schedules []Schedule, now, cutoff time.Time, baseR, baseI int32) func(time.Time, bool) string {
	from, to := now.Add(-maxDuration), now.Add(scan+maxDuration)
	n := int(to.Sub(from) / time.Minute)
	type minute struct {
		open  bool
		start time.Time // the earliest start open then
		end   time.Time
	}
	per := make([][]minute, len(schedules))
	for i, s := range schedules {
		// Every minute whose wall clock in the zone matches the fields is
		// a start: none in a skipped hour, two in a repeated one.
		var starts []time.Time
		for m := from.Add(-s.Duration); m.Before(to); m = m.Add(time.Minute) {
			if matches(s.sched, m) {
				starts = append(starts, m)
			}
		}
		per[i] = make([]minute, n+1)
		p := 0
		for k := range n {
			m := from.Add(time.Duration(k) * time.Minute)
			for p < len(starts) && !starts[p].Add(s.Duration).After(m) {
				p++
			}
			if p < len(starts) && !starts[p].After(m) {
				per[i][k] = minute{open: true, start: starts[p]}
			}
		}
		for k := n - 1; k >= 0; k-- {
			if per[i][k].open {
				// An end at the scan's far side is past it: unknown.
				per[i][k].end = beyond
				if k+1 < n {
					per[i][k].end = from.Add(time.Duration(k+1) * time.Minute)
				}
				if per[i][k+1].open {
					per[i][k].end = per[i][k+1].end
				}
			}
		}
	}
	return func(at time.Time, start bool) string {
		a := Answer{MinReplicas: baseR, MinIdle: baseI}
		k := int(at.Sub(from) / time.Minute)
		for i, s := range schedules {
			if x := per[i][k]; x.open {
				a.Active = append(a.Active, Window{Name: s.Name, Start: x.start, End: x.end})
				if s.MinReplicas != nil {
					a.MinReplicas = max(a.MinReplicas, *s.MinReplicas)
				}
				if s.MinIdle != nil {
					a.MinIdle = max(a.MinIdle, *s.MinIdle)
				}
			}
		}
		slices.SortFunc(a.Active, func(x, y Window) int { return strings.Compare(x.Name, y.Name) })
		return a.format(start, cutoff)
	}
}

// matches is the cron rule read off the parsed fields, independently of
// robfig/cron's search: t's wall clock in the schedule's zone has each
// field's value; day of month and day of week are ANDed when either is *,
// ORed otherwise (robfig/cron's dayMatches, as in classic cron).
func matches(s *cron.SpecSchedule, t time.Time) bool {
	const star = 1 << 63
	w := t.In(s.Location)
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	if w.Second() != 0 || !bit(s.Minute, w.Minute()) || !bit(s.Hour, w.Hour()) || !bit(s.Month, int(w.Month())) {
		return false
	}
	dom, dow := bit(s.Dom, w.Day()), bit(s.Dow, int(w.Weekday()))
	if s.Dom&star != 0 || s.Dow&star != 0 {
		return dom && dow
	}
	return dom || dow
}
