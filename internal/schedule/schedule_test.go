package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/ptr"
)

func mustCompile(t *testing.T, now time.Time, specs ...Spec) []Schedule {
	t.Helper()
	s, errs := Compile(specs, now)
	if len(errs) > 0 {
		t.Fatalf("compile: %v", errors.Join(errs...))
	}
	return s
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UTC()
}

func names(ws []Window) string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Name)
	}
	return strings.Join(out, ",")
}

// TestWorkingHoursAcrossSpringForward: Mon–Fri 08:00–18:00 Europe/Berlin
// opens at 08:00 wall clock on each side of the change (07:00 UTC on
// Friday, 06:00 UTC on Monday), once a day, for ten hours.
func TestWorkingHoursAcrossSpringForward(t *testing.T) {
	now := utc("2026-03-27T06:00:00Z") // Friday 07:00 CET
	s := mustCompile(t, now, Spec{Name: "office", Cron: "0 8 * * 1-5", TimeZone: "Europe/Berlin", Duration: 10 * time.Hour, MinReplicas: ptr.To[int32](3)})
	for _, c := range []struct {
		at, next   string
		active     string
		minReplica int32
	}{
		{"2026-03-27T06:00:00Z", "2026-03-27T07:00:00Z", "", 1},
		{"2026-03-27T07:00:00Z", "2026-03-27T17:00:00Z", "office", 3},
		{"2026-03-27T16:59:59Z", "2026-03-27T17:00:00Z", "office", 3},
		{"2026-03-27T17:00:00Z", "2026-03-30T06:00:00Z", "", 1},       // the weekend, across the change
		{"2026-03-29T12:00:00Z", "2026-03-30T06:00:00Z", "", 1},       // Sunday, clocks went forward
		{"2026-03-30T06:00:00Z", "2026-03-30T16:00:00Z", "office", 3}, // Monday 08:00 CEST
		{"2026-03-30T15:59:00Z", "2026-03-30T16:00:00Z", "office", 3}, // 17:59 CEST
		{"2026-03-30T16:00:00Z", "2026-03-31T06:00:00Z", "", 1},       // 18:00 CEST
	} {
		a := Evaluate(utc(c.at), 1, 0, s)
		if names(a.Active) != c.active || a.MinReplicas != c.minReplica || !a.NextChange.Equal(utc(c.next)) {
			t.Errorf("at %s: active %q min %d next %s, want %q %d %s", c.at, names(a.Active), a.MinReplicas, a.NextChange.UTC().Format(time.RFC3339), c.active, c.minReplica, c.next)
		}
	}
}

// TestSkippedHour: a start at 02:30 Europe/Berlin does not happen on the
// day clocks skip from 02:00 to 03:00 (robfig/cron's behaviour), and is
// back the next day; a window spanning the change lasts its elapsed
// duration.
func TestSkippedHour(t *testing.T) {
	now := utc("2026-03-28T12:00:00Z")
	s := mustCompile(t, now,
		Spec{Name: "night", Cron: "30 2 * * *", TimeZone: "Europe/Berlin", Duration: time.Hour, MinReplicas: ptr.To[int32](2)},
		Spec{Name: "midnight", Cron: "0 0 * * *", TimeZone: "Europe/Berlin", Duration: 10 * time.Hour, MinIdle: ptr.To[int32](4)})
	a := Evaluate(utc("2026-03-29T00:45:00Z"), 0, 0, s) // 01:45 CET, just before the change
	if names(a.Active) != "midnight" || a.MinIdle != 4 || a.MinReplicas != 0 {
		t.Fatalf("before the change: %+v", a)
	}
	if want := utc("2026-03-29T09:00:00Z"); !a.Active[0].End.Equal(want) || !a.Active[0].Start.Equal(utc("2026-03-28T23:00:00Z")) {
		t.Errorf("midnight window %s–%s, want 23:00–09:00 UTC (ten hours elapsed, 11:00 CEST)", a.Active[0].Start, a.Active[0].End)
	}
	if want := utc("2026-03-29T09:00:00Z"); !a.NextChange.Equal(want) {
		t.Errorf("next change %s, want %s: no 02:30 start on the day it is skipped", a.NextChange, want)
	}
	if got, want := s[0].Next(utc("2026-03-28T12:00:00Z")), utc("2026-03-30T00:30:00Z"); !got.Equal(want) {
		t.Errorf("next night start %s, want %s (02:30 CEST the day after)", got, want)
	}
	a = Evaluate(utc("2026-03-30T00:30:00Z"), 0, 0, s)
	if names(a.Active) != "midnight,night" || a.MinReplicas != 2 || a.MinIdle != 4 {
		t.Errorf("the day after: %+v", a)
	}
}

// TestRepeatedHour: a start in the repeated hour happens in both
// occurrences (robfig/cron's behaviour); the two windows overlap and the
// minimum is one window's, not twice it, and the schedule stays open until
// the later window closes.
func TestRepeatedHour(t *testing.T) {
	for _, c := range []struct {
		zone, cron              string
		first, second, duringAt string
	}{
		{"Europe/Berlin", "30 2 * * *", "2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-25T01:45:00Z"},
		{"America/New_York", "30 1 * * *", "2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-01T06:45:00Z"},
	} {
		s := mustCompile(t, utc("2026-10-20T00:00:00Z"), Spec{Name: "n", Cron: c.cron, TimeZone: c.zone, Duration: 2 * time.Hour, MinReplicas: ptr.To[int32](3)})
		if got := s[0].Next(utc(c.first).Add(-time.Second)); !got.Equal(utc(c.first)) {
			t.Errorf("%s: first start %s, want %s", c.zone, got, c.first)
		}
		if got := s[0].Next(utc(c.first)); !got.Equal(utc(c.second)) {
			t.Errorf("%s: second start %s, want %s (the repeated hour)", c.zone, got, c.second)
		}
		a := Evaluate(utc(c.duringAt), 1, 0, s)
		if a.MinReplicas != 3 || len(a.Active) != 1 || !a.Active[0].Start.Equal(utc(c.first)) || !a.Active[0].End.Equal(utc(c.second).Add(2*time.Hour)) {
			t.Errorf("%s: %+v, want min 3 from %s to %s", c.zone, a, c.first, utc(c.second).Add(2*time.Hour))
		}
		// The next day the start happens once.
		if got, want := s[0].Next(utc(c.second)), utc(c.second).Add(24*time.Hour); !got.Equal(want) {
			t.Errorf("%s: start after the change %s, want %s", c.zone, got, want)
		}
	}
}

// TestMonthEnds: the 31st fires only in months that have one, and
// February 29th only in leap years.
func TestMonthEnds(t *testing.T) {
	now := utc("2026-04-15T00:00:00Z")
	s := mustCompile(t, now,
		Spec{Name: "thirty-first", Cron: "0 0 31 * *", Duration: time.Hour, MinReplicas: ptr.To[int32](1)},
		Spec{Name: "leap", Cron: "0 12 29 2 *", TimeZone: "Asia/Kolkata", Duration: time.Hour, MinReplicas: ptr.To[int32](1)})
	if got, want := s[0].Next(now), utc("2026-05-31T00:00:00Z"); !got.Equal(want) {
		t.Errorf("31st after April 15th: %s, want %s", got, want)
	}
	if got, want := s[0].Next(utc("2026-05-31T00:00:00Z")), utc("2026-07-31T00:00:00Z"); !got.Equal(want) {
		t.Errorf("31st after May: %s, want %s (June has 30 days)", got, want)
	}
	if got, want := s[1].Next(now), utc("2028-02-29T06:30:00Z"); !got.Equal(want) {
		t.Errorf("February 29th: %s, want %s (12:00 IST)", got, want)
	}
	if a := Evaluate(now, 0, 0, s); !a.NextChange.Equal(utc("2026-05-31T00:00:00Z")) {
		t.Errorf("next change %s", a.NextChange)
	}
}

// TestOverlappingSchedulesTakeTheMax: two schedules' windows overlap; the
// floor is the larger, never the sum, and minIdle and minReplicas are
// raised separately.
func TestOverlappingSchedulesTakeTheMax(t *testing.T) {
	now := utc("2026-06-01T00:00:00Z")
	s := mustCompile(t, now,
		Spec{Name: "day", Cron: "0 8 * * *", Duration: 10 * time.Hour, MinReplicas: ptr.To[int32](2), MinIdle: ptr.To[int32](1)},
		Spec{Name: "peak", Cron: "0 12 * * *", Duration: 2 * time.Hour, MinReplicas: ptr.To[int32](5)},
		Spec{Name: "warm", Cron: "30 12 * * *", Duration: time.Hour, MinIdle: ptr.To[int32](3)})
	for _, c := range []struct {
		at, active, next string
		minR, minI       int32
	}{
		{"2026-06-01T07:00:00Z", "", "2026-06-01T08:00:00Z", 1, 0},
		{"2026-06-01T09:00:00Z", "day", "2026-06-01T12:00:00Z", 2, 1},
		{"2026-06-01T12:00:00Z", "day,peak", "2026-06-01T12:30:00Z", 5, 1},
		{"2026-06-01T12:45:00Z", "day,peak,warm", "2026-06-01T13:30:00Z", 5, 3},
		{"2026-06-01T13:30:00Z", "day,peak", "2026-06-01T14:00:00Z", 5, 1},
		{"2026-06-01T14:00:00Z", "day", "2026-06-01T18:00:00Z", 2, 1},
	} {
		a := Evaluate(utc(c.at), 1, 0, s)
		if names(a.Active) != c.active || a.MinReplicas != c.minR || a.MinIdle != c.minI || !a.NextChange.Equal(utc(c.next)) {
			t.Errorf("at %s: active %q min %d/%d next %s, want %q %d/%d %s", c.at, names(a.Active), a.MinReplicas, a.MinIdle, a.NextChange.Format(time.RFC3339), c.active, c.minR, c.minI, c.next)
		}
	}
	// A base above every window stays.
	if a := Evaluate(utc("2026-06-01T12:45:00Z"), 7, 9, s); a.MinReplicas != 7 || a.MinIdle != 9 {
		t.Errorf("base 7/9 under windows 5/3: %d/%d", a.MinReplicas, a.MinIdle)
	}
}

// TestWindowsThatNeverClose: a window every minute lasting an hour keeps
// the schedule open; the answer is reported to change at the horizon.
func TestWindowsThatNeverClose(t *testing.T) {
	now := utc("2026-06-01T00:00:30Z")
	s := mustCompile(t, now, Spec{Name: "always", Cron: "* * * * *", Duration: time.Hour, MinReplicas: ptr.To[int32](1)})
	a := Evaluate(now, 0, 0, s)
	if len(a.Active) != 1 || !a.NextChange.Equal(now.Add(Horizon)) || !a.Active[0].End.Equal(now.Add(Horizon)) {
		t.Errorf("%+v, want open until now+Horizon", a)
	}
}

// TestCompileRefuses: every unusable schedule is named with its error;
// the others are kept.
func TestCompileRefuses(t *testing.T) {
	now := utc("2026-06-01T00:00:00Z")
	ok := Spec{Name: "ok", Cron: "0 8 * * 1-5", TimeZone: "America/New_York", Duration: time.Hour}
	got, errs := Compile([]Spec{
		{Name: "range", Cron: "61 * * * *", Duration: time.Hour},
		ok,
		{Name: "zone", Cron: "0 8 * * *", TimeZone: "Mars/Olympus_Mons", Duration: time.Hour},
		{Name: "never", Cron: "0 0 30 2 *", Duration: time.Hour},
		{Name: "descriptor", Cron: "@daily", Duration: time.Hour},
		{Name: "fields", Cron: "0 8 * *", Duration: time.Hour},
		{Name: "zero", Cron: "0 8 * * *", Duration: 0},
	}, now)
	if len(got) != 1 || got[0].Name != "ok" {
		t.Errorf("kept %+v, want only ok", got)
	}
	want := []string{`schedule "range": cron "61 * * * *"`, `schedule "zone": timeZone "Mars/Olympus_Mons"`, `schedule "never"`, `schedule "descriptor"`, `schedule "fields"`, `schedule "zero": duration`}
	if len(errs) != len(want) {
		t.Fatalf("errors %v, want %d", errs, len(want))
	}
	for i, w := range want {
		if !strings.Contains(errs[i].Error(), w) {
			t.Errorf("error %d: %v, want it to contain %s", i, errs[i], w)
		}
	}
	if !errors.Is(errs[2], ErrNeverFires) {
		t.Errorf("February 30th: %v, want ErrNeverFires", errs[2])
	}
}

// TestStandbySize: the tier's size is its base raised to the largest open
// window's standby; a closed window or one without standby changes
// nothing.
func TestStandbySize(t *testing.T) {
	four, nine := int32(4), int32(9)
	a := Answer{Active: []Window{{Name: "a", Standby: &four}, {Name: "b"}, {Name: "c", Standby: &nine}}}
	for _, c := range []struct {
		a          Answer
		base, want int32
	}{
		{Answer{}, 2, 2},
		{a, 2, 9},
		{a, 12, 12},
		{Answer{Active: []Window{{Name: "b"}}}, 3, 3},
	} {
		if got := c.a.StandbySize(c.base); got != c.want {
			t.Errorf("StandbySize(%d) with %d open windows = %d, want %d", c.base, len(c.a.Active), got, c.want)
		}
	}
}
