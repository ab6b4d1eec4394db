package workload

import (
	"context"
	"errors"
	"testing"
)

// TestParseNumericJobID: only what FormatNumericJobID writes reads back.
func TestParseNumericJobID(t *testing.T) {
	for id, want := range map[string]int64{"1": 1, "9007199254740993": 9007199254740993, "": 0, "0": 0, "007": 0, "-3": 0, "+3": 0, "3a": 0, "0190f5a2-7a1d": 0} {
		got, ok := ParseNumericJobID(id)
		if ok != (want != 0) || got != want {
			t.Errorf("ParseNumericJobID(%q) = %d, %v; want %d", id, got, ok, want)
		}
		if ok && FormatNumericJobID(got) != id {
			t.Errorf("FormatNumericJobID(%d) = %q, want %q", got, FormatNumericJobID(got), id)
		}
	}
}

// TestRunnerToRemove: an id is used as given; a name is looked up, its
// absence is "already gone", any other error is returned.
func TestRunnerToRemove(t *testing.T) {
	ctx := context.Background()
	down := errors.New("platform down")
	get := func(_ context.Context, name string) (Runner, error) {
		switch name {
		case "hf-1":
			return Runner{ID: 41, Name: name}, nil
		case "down":
			return Runner{}, down
		}
		return Runner{}, ErrNotFound
	}
	for _, tc := range []struct {
		id    int64
		name  string
		want  int64
		found bool
		err   error
	}{
		{7, "ignored", 7, true, nil},
		{0, "hf-1", 41, true, nil},
		{0, "gone", 0, false, nil},
		{0, "down", 0, false, down},
	} {
		id, found, err := RunnerToRemove(ctx, get, tc.id, tc.name)
		if id != tc.want || found != tc.found || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("RunnerToRemove(%d, %q) = %d, %v, %v; want %d, %v, %v", tc.id, tc.name, id, found, err, tc.want, tc.found, tc.err)
		}
	}
}
