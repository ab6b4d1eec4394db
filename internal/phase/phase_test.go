package phase

import (
	"context"
	"errors"
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

func TestRun(t *testing.T) {
	boom := errors.New("boom")
	step := func(name string, res Result, err error) Func[*[]string] {
		return func(_ context.Context, ran *[]string) (Result, error) {
			*ran = append(*ran, name)
			return res, err
		}
	}
	for _, tc := range []struct {
		name    string
		phases  []Func[*[]string]
		ran     []string
		want    ctrl.Result
		wantErr error
	}{
		{"every phase goes on", []Func[*[]string]{step("a", Next(), nil), step("b", Next(), nil)}, []string{"a", "b"}, ctrl.Result{}, nil},
		{"a stop ends the pass", []Func[*[]string]{step("a", Stop(), nil), step("b", Next(), nil)}, []string{"a"}, ctrl.Result{}, nil},
		{"the stop's requeue", []Func[*[]string]{step("a", Next(), nil), step("b", StopAndRequeue(time.Minute), nil), step("c", Next(), nil)},
			[]string{"a", "b"}, ctrl.Result{RequeueAfter: time.Minute}, nil},
		{"an earlier recheck is sooner than the stop's requeue", []Func[*[]string]{step("a", Recheck(time.Second), nil), step("b", StopAndRequeue(time.Minute), nil)},
			[]string{"a", "b"}, ctrl.Result{RequeueAfter: time.Second}, nil},
		{"the soonest of several rechecks", []Func[*[]string]{step("a", Recheck(time.Minute), nil), step("b", Recheck(time.Second), nil), step("c", Recheck(time.Hour), nil)},
			[]string{"a", "b", "c"}, ctrl.Result{RequeueAfter: time.Second}, nil},
		{"a recheck kept through a stop without requeue", []Func[*[]string]{step("a", Recheck(time.Second), nil), step("b", Stop(), nil)},
			[]string{"a", "b"}, ctrl.Result{RequeueAfter: time.Second}, nil},
		{"an error ends the pass without a result", []Func[*[]string]{step("a", Recheck(time.Second), nil), step("b", StopAndRequeue(time.Minute), boom), step("c", Next(), nil)},
			[]string{"a", "b"}, ctrl.Result{}, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ran []string
			got, err := Run(context.Background(), &ran, tc.phases...)
			if !errors.Is(err, tc.wantErr) || got != tc.want {
				t.Fatalf("Run = %+v, %v; want %+v, %v", got, err, tc.want, tc.wantErr)
			}
			if len(ran) != len(tc.ran) {
				t.Fatalf("ran %v, want %v", ran, tc.ran)
			}
			for i := range ran {
				if ran[i] != tc.ran[i] {
					t.Fatalf("ran %v, want %v", ran, tc.ran)
				}
			}
		})
	}
}

// TestSequence: a list run as one phase stops when one of its phases
// stopped, with the soonest wish of those that ran, and goes on otherwise.
func TestSequence(t *testing.T) {
	boom := errors.New("boom")
	ran := 0
	step := func(res Result, err error) Func[int] {
		return func(context.Context, int) (Result, error) { ran++; return res, err }
	}
	for _, tc := range []struct {
		name    string
		phases  []Func[int]
		ran     int
		want    Result
		wantErr error
	}{
		{"goes on", []Func[int]{step(Recheck(time.Minute), nil), step(Recheck(time.Second), nil)}, 2, Recheck(time.Second), nil},
		{"stops", []Func[int]{step(Recheck(time.Second), nil), step(StopAndRequeue(time.Minute), nil), step(Next(), nil)}, 2, StopAndRequeue(time.Second), nil},
		{"fails", []Func[int]{step(Recheck(time.Second), nil), step(Stop(), boom), step(Next(), nil)}, 2, Result{}, boom},
		{"empty", nil, 0, Next(), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran = 0
			got, err := Sequence(tc.phases...)(context.Background(), 0)
			if got != tc.want || !errors.Is(err, tc.wantErr) || ran != tc.ran {
				t.Fatalf("Sequence = %+v, %v after %d phases; want %+v, %v after %d", got, err, ran, tc.want, tc.wantErr, tc.ran)
			}
		})
	}
}

func TestResult(t *testing.T) {
	if Next().Stopped() || Recheck(time.Second).Stopped() || !Stop().Stopped() || !StopAndRequeue(time.Second).Stopped() {
		t.Fatal("Stopped: only Stop and StopAndRequeue end the pass")
	}
	if Recheck(-time.Second).After() != 0 || StopAndRequeue(-1).After() != 0 {
		t.Fatal("a negative wish is no wish")
	}
	if got := FromCtrl(ctrl.Result{RequeueAfter: time.Minute}); !got.Stopped() || got.After() != time.Minute {
		t.Fatalf("FromCtrl = %+v", got)
	}
	if got := Recheck(time.Minute).Sooner(time.Second).Sooner(0).Sooner(time.Hour); got.After() != time.Second || got.Stopped() {
		t.Fatalf("Sooner = %+v", got)
	}
	if Soonest() != 0 || Soonest(0, 0) != 0 || Soonest(3, 0, 2) != 2 {
		t.Fatal("Soonest")
	}
}
