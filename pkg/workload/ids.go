package workload

import (
	"context"
	"errors"
	"strconv"
)

// FormatNumericJobID is a platform's numeric job id (GitHub's, GitLab's)
// as Job.ID's text.
func FormatNumericJobID(id int64) string { return strconv.FormatInt(id, 10) }

// ParseNumericJobID reads a job id FormatNumericJobID wrote: decimal digits
// without a sign or leading zero, greater than zero. Anything else is not
// the id of a platform with numeric job ids, and asking the platform about
// it would only cost a call.
func ParseNumericJobID(id string) (int64, bool) {
	if id == "" || id[0] < '1' || id[0] > '9' {
		return 0, false
	}
	n, err := strconv.ParseInt(id, 10, 64)
	return n, err == nil && n > 0 && FormatNumericJobID(n) == id
}

// RunnerToRemove is the id of the runner Provider.DeregisterRunner(id,
// name) removes: id, else the id of the runner named name, found with get
// (the provider's GetRunner). found is false when there is no runner of
// that name: already gone, which DeregisterRunner takes as success.
func RunnerToRemove(ctx context.Context, get func(context.Context, string) (Runner, error), id int64, name string) (_ int64, found bool, _ error) {
	if id != 0 {
		return id, true, nil
	}
	r, err := get(ctx, name)
	switch {
	case errors.Is(err, ErrNotFound):
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	return r.ID, true, nil
}
