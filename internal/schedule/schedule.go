// Package schedule answers, for an instant and a RunnerPool's
// spec.scaling.schedules, which scheduled windows are open, the pool's
// effective minimums (minReplicas, minIdle) and the next instant that
// answer changes. It is pure: the caller passes the time, so every rule is
// checked by unit and property tests (schedule_test.go, property_test.go).
//
// # Windows
//
// A schedule opens a window at every instant its cron expression fires in
// its time zone, and each window stays open for the schedule's duration of
// elapsed time: [start, start+duration). While any window of any schedule
// is open, the pool's minimum is the largest of its base value and every
// open window's value: overlapping windows take the max, never the sum.
//
// # Daylight saving time
//
// The fire instants are robfig/cron v3's (SpecSchedule.Next evaluated in
// the schedule's zone), whose behaviour at a change is:
//
//   - a start in the hour that is skipped when clocks go forward does not
//     happen that day (02:30 Europe/Berlin on the last Sunday of March);
//   - a start in the hour that is repeated when clocks go back happens in
//     both occurrences (02:30 CEST and 02:30 CET on the last Sunday of
//     October); both windows are open together for all but an hour, and the
//     max rule keeps the pool's minimum what one window asks for.
//
// Every other start happens exactly once at its wall-clock time, and a
// window that spans a change lasts its duration of elapsed time, neither cut
// short nor split.
package schedule

import (
	"errors"
	"fmt"
	"sort"
	"time"
	_ "time/tzdata" // the image is built from scratch, without zoneinfo: the zones are compiled in (about 450 KB)

	"github.com/robfig/cron/v3"
)

// Horizon bounds how far ahead Evaluate follows a schedule whose windows
// keep overlapping (a window every minute lasting an hour never closes).
// Past it the answer is reported as changing at now+Horizon, which makes
// the caller look again then; a week and a day covers the longest window
// (7 days) and a weekly start.
const Horizon = 8 * 24 * time.Hour

// maxSteps bounds the work of following overlapping windows to Horizon.
// Each step takes a later start, and starts are whole minutes between
// now-duration and now+Horizon, so a window of up to a Horizon needs
// fewer; the bound only guards the loop.
const maxSteps = int(2 * Horizon / time.Minute)

// parser reads the standard five fields (minute hour day-of-month month
// day-of-week). Descriptors (@daily, @every) are refused: @every counts
// from whenever it is asked and so has no fixed windows.
var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// Spec is one schedule as the API gives it.
type Spec struct {
	Name     string
	Cron     string
	TimeZone string // IANA name; empty means UTC
	Duration time.Duration
	// MinReplicas and MinIdle are the floors a window raises the pool to;
	// nil leaves that floor to the base value. Standby is the standby
	// tier's size a window raises the pool's to (StandbySize).
	MinReplicas, MinIdle, Standby *int32
}

// Schedule is a parsed Spec.
type Schedule struct {
	Spec
	sched *cron.SpecSchedule
}

// Error is a schedule that cannot be used, and why.
type Error struct {
	Name string
	Err  error
}

func (e *Error) Error() string { return fmt.Sprintf("schedule %q: %v", e.Name, e.Err) }
func (e *Error) Unwrap() error { return e.Err }

// ErrNeverFires is a cron expression with no instant in the five years
// after the time it is checked at (February 30th).
var ErrNeverFires = errors.New("the cron expression matches no time in the next five years")

// Compile parses specs at now: the cron expression, the time zone (loaded
// from the compiled-in zoneinfo), a positive duration, and at least one
// start in the next five years. It returns the usable schedules and an
// *Error for each of the others, in the specs' order.
func Compile(specs []Spec, now time.Time) ([]Schedule, []error) {
	var out []Schedule
	var errs []error
	for _, sp := range specs {
		s, err := compile(sp, now)
		if err != nil {
			errs = append(errs, &Error{Name: sp.Name, Err: err})
			continue
		}
		out = append(out, s)
	}
	return out, errs
}

func compile(sp Spec, now time.Time) (Schedule, error) {
	zone := sp.TimeZone
	if zone == "" {
		zone = "UTC"
	}
	loc, err := time.LoadLocation(zone)
	if err != nil {
		return Schedule{}, fmt.Errorf("timeZone %q: %w", zone, err)
	}
	parsed, err := parser.Parse(sp.Cron)
	if err != nil {
		return Schedule{}, fmt.Errorf("cron %q: %w", sp.Cron, err)
	}
	spec, ok := parsed.(*cron.SpecSchedule)
	if !ok {
		return Schedule{}, fmt.Errorf("cron %q: not a five-field expression", sp.Cron)
	}
	if sp.Duration <= 0 {
		return Schedule{}, fmt.Errorf("duration %s: must be positive", sp.Duration)
	}
	spec.Location = loc
	if spec.Next(now).IsZero() {
		return Schedule{}, fmt.Errorf("cron %q: %w", sp.Cron, ErrNeverFires)
	}
	return Schedule{Spec: sp, sched: spec}, nil
}

// Next is the schedule's first start strictly after t (zero when there is
// none within robfig/cron's five-year search).
//
// A start is a whole minute whose wall clock in the zone matches the
// fields (fires). robfig/cron finds them by walking the fields forward,
// building wall-clock times with time.Date; near an offset change those
// times are ambiguous or skipped, and after a change of other than whole
// hours (Australia/Lord_Howe's half hour) its walk lands between the
// fields' values and skips starts (the property test found it). So its
// answer is taken only when it lies well before the next change; around
// a change the minutes are checked one by one, for a day after it.
func (s Schedule) Next(t time.Time) time.Time {
	// Each pass moves past one offset change; robfig/cron gives up after
	// five years, in which a zone changes offset a dozen times at most.
	for range 64 {
		start, end := t.In(s.sched.Location).ZoneBounds()
		if !start.IsZero() && t.Before(start.Add(nearChange)) {
			if m := s.scan(t, start.Add(nearChange)); !m.IsZero() {
				return m
			}
			t = start.Add(nearChange)
			continue
		}
		r := s.sched.Next(t)
		if r.IsZero() || end.IsZero() || r.Before(end.Add(-nearChange)) {
			return r
		}
		// robfig/cron found nothing before the span around the change,
		// where its walk is still sound.
		if m := s.scan(later(t, end.Add(-nearChange-time.Minute)), end.Add(nearChange)); !m.IsZero() {
			return m
		}
		t = end.Add(nearChange)
	}
	return time.Time{}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// scan returns the first start after from and not after to, checking each
// minute (zero when there is none).
func (s Schedule) scan(from, to time.Time) time.Time {
	for m := from.Truncate(time.Minute).Add(time.Minute); !m.After(to); m = m.Add(time.Minute) {
		if s.fires(m) {
			return m
		}
	}
	return time.Time{}
}

// starBit marks a field written as * (robfig/cron's spec.go, unexported).
const starBit = 1 << 63

// nearChange is the span on each side of an offset change in which
// robfig/cron's answer is not taken: more than a wall-clock day after it
// (a daily start is found on the day after a change) and more than the
// largest offset change before it.
const nearChange = 26 * time.Hour

// fires reports whether t is a start: a whole minute whose wall clock in
// the schedule's zone has every field's value. Day of month and day of
// week both have to match when either is *, and either does otherwise
// (classic cron, and robfig/cron's dayMatches).
func (s Schedule) fires(t time.Time) bool {
	spec := s.sched
	w := t.In(spec.Location)
	in := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	if w.Second() != 0 || w.Nanosecond() != 0 || !in(spec.Minute, w.Minute()) || !in(spec.Hour, w.Hour()) || !in(spec.Month, int(w.Month())) {
		return false
	}
	dom, dow := in(spec.Dom, w.Day()), in(spec.Dow, int(w.Weekday()))
	if spec.Dom&starBit != 0 || spec.Dow&starBit != 0 {
		return dom && dow
	}
	return dom || dow
}

// Window is a schedule's open window at an instant.
type Window struct {
	Name string
	// Start is the start of the window in effect: the earliest start whose
	// window is open at the instant.
	Start time.Time
	// End is when the schedule stops holding the pool: its windows open
	// back to back or overlapping count as one (capped at the instant plus
	// Horizon).
	End time.Time
	// MinReplicas, MinIdle and Standby are the schedule's floors (nil:
	// none).
	MinReplicas, MinIdle, Standby *int32
}

// Answer is the pool's schedule at an instant.
type Answer struct {
	// MinReplicas and MinIdle are the effective minimums: the base values
	// raised to every open window's.
	MinReplicas, MinIdle int32
	// Active are the open windows, by schedule name.
	Active []Window
	// NextChange is the first instant after now at which a window opens or
	// closes (a schedule open past now+Horizon counts as closing then);
	// zero when no schedule ever changes.
	NextChange time.Time
}

// Evaluate answers for now, with the base minimums baseReplicas and
// baseIdle (spec.scaling.minReplicas and minIdle).
func Evaluate(now time.Time, baseReplicas, baseIdle int32, schedules []Schedule) Answer {
	a := Answer{MinReplicas: baseReplicas, MinIdle: baseIdle}
	limit := now.Add(Horizon)
	for _, s := range schedules {
		w, open := s.window(now, limit)
		change := w.End
		if !open {
			change = s.Next(now)
		} else {
			a.Active = append(a.Active, w)
			if s.MinReplicas != nil {
				a.MinReplicas = max(a.MinReplicas, *s.MinReplicas)
			}
			if s.MinIdle != nil {
				a.MinIdle = max(a.MinIdle, *s.MinIdle)
			}
		}
		if !change.IsZero() && (a.NextChange.IsZero() || change.Before(a.NextChange)) {
			a.NextChange = change
		}
	}
	sort.Slice(a.Active, func(i, j int) bool { return a.Active[i].Name < a.Active[j].Name })
	return a
}

// window reports whether one of the schedule's windows is open at now and,
// if so, the window in effect and when the schedule's open windows end.
// A window [s, s+d) is open at now when s is in (now-d, now]: the first
// start after now-d, if it is not after now.
func (s Schedule) window(now, limit time.Time) (Window, bool) {
	d := s.Duration
	first := s.Next(now.Add(-d))
	if first.IsZero() || first.After(now) {
		return Window{}, false
	}
	end := first.Add(d)
	// Follow windows that open before (or as) the current one closes: the
	// latest start after end-d is the only one that can extend end, and
	// starts at or before end-d close no later than end.
	for range maxSteps {
		if end.After(limit) {
			end = limit
			break
		}
		next := s.Next(end.Add(-d))
		if next.IsZero() || next.After(end) {
			break
		}
		end = next.Add(d)
	}
	return Window{Name: s.Name, Start: first, End: end, MinReplicas: s.MinReplicas, MinIdle: s.MinIdle, Standby: s.Standby}, true
}

// StandbySize is a pool's standby tier size in answer a: base
// (spec.standby.size) raised to every open window's standby, as the
// minimums are.
func (a Answer) StandbySize(base int32) int32 {
	for _, w := range a.Active {
		if w.Standby != nil {
			base = max(base, *w.Standby)
		}
	}
	return base
}
