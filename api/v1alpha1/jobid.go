package v1alpha1

// CI job ids as text. A platform's job id is a decimal number on GitHub
// Actions and GitLab CI and a UUID on Buildkite; the operator carries it
// as a string (pkg/workload.Job.ID). The API keeps the integer jobID that
// CIJobs and MachineClaims were recorded with (a field's JSON type never
// changes) and adds the string jobKey beside it for ids that are not
// numbers; the accessors here are the one place that chooses between the
// two, so no caller reads or writes them directly.

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// CIJobName is the name of the CIJob of a platform's job id (as text, see
// CIJobSpec.ID): <platform>-<id lower-cased>, such as github-actions-4242
// or buildkite-0190a1b2-...: one object per job, whoever records it first.
//
// For every id ValidateJobID accepts (a positive decimal number, or a key
// of at most MaxJobKeyLength letters, digits and inner hyphens) the name is
// a valid object name: a DNS subdomain of lower-case letters, digits and
// hyphens that starts and ends with a letter or digit, at most
// len(platform)+1+MaxJobKeyLength characters (the longest workload type
// gives 79 of the 253 allowed). Ids that differ only in case name the same
// object: the platforms whose ids are text use UUIDs, which are
// case-insensitive. An id ValidateJobID refuses has no CIJob: the demand
// recorder refuses its job (internal/demand/recorder.go) rather than
// shortening or rewriting the id into a name another job could have.
func CIJobName(platform WorkloadType, id string) string {
	return string(platform) + "-" + strings.ToLower(id)
}

// MaxJobKeyLength is the longest job key (spec.jobKey) a CIJob holds.
const MaxJobKeyLength = 64

// ValidateJobID reports why id cannot be a CI job's id in the API: a
// positive decimal number that fits int64 goes in jobID; anything else
// must be a key that spec.jobKey admits (jobKeyPattern, at most
// MaxJobKeyLength characters), so that it also makes a valid object name
// (CIJobName).
func ValidateJobID(id string) error {
	if _, ok := numericJobID(id); ok {
		return nil
	}
	switch {
	case id == "":
		return errors.New("the job id is empty")
	case len(id) > MaxJobKeyLength:
		return fmt.Errorf("the job id has %d characters, more than the %d a CIJob's spec.jobKey holds", len(id), MaxJobKeyLength)
	case !jobKeyPattern.MatchString(id):
		return fmt.Errorf("the job id %q is neither a positive decimal number nor a key of letters, digits and inner hyphens (spec.jobKey's pattern %s)", id, jobKeyPattern)
	}
	return nil
}

// jobKeyPattern is spec.jobKey's pattern (the kubebuilder marker on
// CIJobSpec.JobKey and BootstrapStatus.JobKey, kept in step by
// TestJobKeyPatternMatchesTheSchema): letters, digits and hyphens, with a
// letter or digit at both ends so that CIJobName ends with one too.
var jobKeyPattern = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`)

// numericJobID is id as the number jobID holds: decimal digits without a
// leading zero, greater than zero, fitting int64. Anything else (a UUID,
// "007", "0") is a key, so that ID gives back exactly the id SetID was
// given.
func numericJobID(id string) (int64, bool) {
	if id == "" || id[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < '0' || id[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(id, 10, 64)
	return n, err == nil && n > 0
}

// jobIDOf is the text of a job id held as jobID or jobKey: the key when
// set, else the number in decimal, else "".
func jobIDOf(number int64, key string) string {
	switch {
	case key != "":
		return key
	case number != 0:
		return strconv.FormatInt(number, 10)
	}
	return ""
}

// jobFieldsOf is the inverse of jobIDOf: id as a number when it is a
// positive decimal without leading zeros that fits int64, else as a key.
func jobFieldsOf(id string) (number int64, key string) {
	if n, ok := numericJobID(id); ok {
		return n, ""
	}
	return 0, id
}

// ID is the platform's id of the job as text: jobKey when set, else jobID
// in decimal; "" when neither is. Callers use ID and SetID rather than the
// two fields, which exist so that CIJobs recorded when every id was a
// number (integer jobID) stay valid.
func (s *CIJobSpec) ID() string { return jobIDOf(s.JobID, s.JobKey) }

// SetID records id: a positive decimal number without leading zeros that
// fits int64 (GitHub's and GitLab's ids) in jobID, anything else (a
// Buildkite UUID) in jobKey; the other field is cleared. ID gives id back.
func (s *CIJobSpec) SetID(id string) { s.JobID, s.JobKey = jobFieldsOf(id) }

// Job is the platform's id of the job the runner took, as text (see
// CIJobSpec.ID); "" before it took one.
func (s *BootstrapStatus) Job() string {
	if s == nil {
		return ""
	}
	return jobIDOf(s.JobID, s.JobKey)
}

// SetJob records the job the runner took, as CIJobSpec.SetID does; ""
// clears it.
func (s *BootstrapStatus) SetJob(id string) { s.JobID, s.JobKey = jobFieldsOf(id) }
