package bench

import (
	"strings"
	"testing"
	"time"
)

func TestMedianWorst(t *testing.T) {
	for _, tc := range []struct {
		name        string
		rs          []float64
		med, worstW float64
	}{
		{"none", nil, 0, 0},
		{"one", []float64{1.2}, 1.2, 1.2},
		{"odd, unsorted", []float64{1.3, 1.0, 1.1}, 1.1, 1.3},
		{"even: the lower middle, a measured value", []float64{1.4, 1.0, 1.2, 1.1}, 1.1, 1.4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.rs...)
			med, worst := MedianWorst(in)
			if med != tc.med || worst != tc.worstW {
				t.Errorf("MedianWorst(%v) = %v, %v, want %v, %v", tc.rs, med, worst, tc.med, tc.worstW)
			}
			for i := range in {
				if in[i] != tc.rs[i] {
					t.Fatalf("MedianWorst sorted its input in place: %v", in)
				}
			}
		})
	}
}

// start is a standby start of total against a resume of 3 s, no
// placement time and a registration of 500 ms: 3.5 s physically.
func start(total time.Duration) StandbyStart {
	return StandbyStart{Total: total, Resume: 3 * time.Second, Registration: 500 * time.Millisecond}
}

func TestStandbyPhysicalAndRatios(t *testing.T) {
	if got := (StandbyStart{Resume: 3, Placement: 2, Registration: 1}).Physical(); got != 6 {
		t.Errorf("Physical = %v, want 6", got)
	}
	sb := Standby{Size: 2, Starts: []StandbyStart{start(7 * time.Second), start(3500 * time.Millisecond), start(3850 * time.Millisecond)}}
	med, worst := sb.Ratios()
	if med != 1.1 || worst != 2 {
		t.Errorf("Ratios = %v, %v, want 1.1 (median) and 2 (worst)", med, worst)
	}
	if s := sb.Totals(); s.N != 3 || s.P50 != 3850*time.Millisecond || s.P95 != 7*time.Second {
		t.Errorf("Totals = %+v, want 3 jobs, p50 3.85 s, p95 7 s", s)
	}
	if med, worst := (Standby{}).Ratios(); med != 0 || worst != 0 {
		t.Errorf("no starts: ratios %v, %v", med, worst)
	}
}

func standbyRow(t *testing.T, sb Standby, prefix string) Figure {
	t.Helper()
	for _, f := range Figures(Results{Standby: sb}) {
		if strings.HasPrefix(f.Name, prefix) {
			return f
		}
	}
	t.Fatalf("no figure %q", prefix)
	return Figure{}
}

func TestStandbyFigures(t *testing.T) {
	suspended := IdleCost{State: 4596 << 20, Disk: 8 << 30}
	warm := IdleCost{Memory: 2 << 30, Disk: 8 << 30}
	fast := []StandbyStart{start(3600 * time.Millisecond), start(3700 * time.Millisecond)}
	for _, tc := range []struct {
		name     string
		sb       Standby
		wantPass bool
		wantIn   string
	}{
		{"met", Standby{Size: 2, Starts: fast, Idle: suspended, Warm: warm}, true, "p50 3.60 s, p95 3.70 s; first job 3.60 s vs 3.00 s + 0.00 s + 0.50 s; worst ratio 1.057"},
		{"ratio over", Standby{Size: 2, Starts: []StandbyStart{start(4 * time.Second)}}, false, "worst ratio 1.143"},
		{"p50 over", Standby{Size: 1, Starts: []StandbyStart{{Total: 5 * time.Second, Resume: 5 * time.Second}}}, false, "p50 5.00 s"},
		{"p95 over", Standby{Size: 1, Starts: []StandbyStart{{Total: 16 * time.Second, Resume: 16 * time.Second}, start(3500 * time.Millisecond)}}, false, "p95 16.00 s"},
		{"no job served", Standby{Size: 2}, false, "no job served"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := standbyRow(t, tc.sb, "standby: job queued")
			if f.Pass != tc.wantPass || !strings.Contains(f.Value, tc.wantIn) {
				t.Errorf("figure %+v: want pass %v and %q in its value", f, tc.wantPass, tc.wantIn)
			}
		})
	}
	idle := standbyRow(t, Standby{Size: 2, Starts: fast, Idle: suspended, Warm: warm}, "standby: idle cost")
	if !idle.Pass || idle.Value != "standby 0 MiB host memory, 4.5 GiB + 8.0 GiB; warm 2048 MiB host memory, 8.0 GiB" {
		t.Errorf("idle cost %+v", idle)
	}
	slow := standbyRow(t, Standby{Size: 1, Starts: []StandbyStart{
		{Total: 4200 * time.Millisecond, Resume: 3 * time.Second, Registration: 200 * time.Millisecond, ToResume: 20 * time.Millisecond, ToCredential: time.Second},
		{Total: 4300 * time.Millisecond, Resume: 3 * time.Second, Registration: 200 * time.Millisecond, ToResume: 30 * time.Millisecond, ToCredential: 1100 * time.Millisecond},
		{Total: 3400 * time.Millisecond, Resume: 3 * time.Second, Registration: 300 * time.Millisecond, ToResume: 40 * time.Millisecond, ToCredential: 60 * time.Millisecond},
	}}, "standby: job queued")
	if want := "the operator's waits on the jobs' path, medians: job queued -> resume request 0.03 s, the resume's end -> credential written 1.00 s"; slow.Pass || slow.Note != want {
		t.Errorf("a miss: %+v, want its note %q", slow, want)
	}
	if met := standbyRow(t, Standby{Size: 2, Starts: fast, Idle: suspended, Warm: warm}, "standby: job queued"); met.Note != "" {
		t.Errorf("a met figure has a note: %+v", met)
	}
	if held := standbyRow(t, Standby{Size: 2, Idle: IdleCost{Memory: 2 << 30}}, "standby: idle cost"); held.Pass {
		t.Errorf("a suspended VM holding host memory passed: %+v", held)
	}
	for _, f := range Figures(Results{}) {
		if strings.HasPrefix(f.Name, "standby") {
			t.Errorf("a run without a standby tier has its row: %+v", f)
		}
	}
}
