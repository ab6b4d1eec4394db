package v1alpha1_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

// platforms are every workload type the API admits (the enum on
// WorkloadType).
var platforms = []hfv1.WorkloadType{hfv1.WorkloadGitHubActions, hfv1.WorkloadGitLabCI, hfv1.WorkloadBuildkite, hfv1.WorkloadGeneric}

// numericID draws a GitHub or GitLab job id: a positive int64 in decimal.
func numericID() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		return strconv.FormatInt(rapid.Int64Range(1, math.MaxInt64).Draw(t, "n"), 10)
	})
}

// uuidID draws a Buildkite job id: a UUID, in either case (UUIDs are
// case-insensitive; Buildkite writes them lower-case).
func uuidID() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		b := rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "bytes")
		id := fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
		if rapid.Bool().Draw(t, "upper") {
			id = strings.ToUpper(id)
		}
		return id
	})
}

// keyID draws any id jobKey's pattern admits: letters, digits and inner
// hyphens, at most MaxJobKeyLength characters.
func keyID() *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		alnum := rapid.SampledFrom([]rune("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"))
		inner := rapid.SampledFrom([]rune("abcXYZ0189-"))
		n := rapid.IntRange(1, hfv1.MaxJobKeyLength).Draw(t, "length")
		r := []rune{alnum.Draw(t, "first")}
		for i := 1; i < n-1; i++ {
			r = append(r, inner.Draw(t, "inner"))
		}
		if n > 1 {
			r = append(r, alnum.Draw(t, "last"))
		}
		return string(r)
	})
}

// anyValidID draws from all three kinds.
func anyValidID() *rapid.Generator[string] {
	return rapid.OneOf(numericID(), uuidID(), keyID())
}

// TestJobIDRoundTrip: SetID then ID gives the id back, whatever its
// kind; a positive decimal number without a leading zero goes in jobID
// (so GitHub's CIJobs keep the shape they were stored with), anything else
// in jobKey; the claim's bootstrap status does the same.
func TestJobIDRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		id := anyValidID().Draw(t, "id")
		var spec hfv1.CIJobSpec
		spec.JobID, spec.JobKey = 99, "stale" // SetID replaces both
		spec.SetID(id)
		if got := spec.ID(); got != id {
			t.Fatalf("SetID(%q) then ID() = %q", id, got)
		}
		n, err := strconv.ParseInt(id, 10, 64)
		numeric := err == nil && n > 0 && strconv.FormatInt(n, 10) == id
		if numeric && (spec.JobID != n || spec.JobKey != "") || !numeric && (spec.JobID != 0 || spec.JobKey != id) {
			t.Fatalf("SetID(%q): jobID %d, jobKey %q", id, spec.JobID, spec.JobKey)
		}
		var st hfv1.BootstrapStatus
		st.SetJob(id)
		if st.Job() != id || st.JobID != spec.JobID || st.JobKey != spec.JobKey {
			t.Fatalf("SetJob(%q): Job() %q, jobID %d, jobKey %q; want as CIJobSpec", id, st.Job(), st.JobID, st.JobKey)
		}
		if err := hfv1.ValidateJobID(id); err != nil {
			t.Fatalf("ValidateJobID(%q) = %v", id, err)
		}
	})
}

func TestJobIDEdges(t *testing.T) {
	for _, tc := range []struct {
		id      string
		jobID   int64
		jobKey  string
		invalid bool
	}{
		{id: "4242", jobID: 4242},
		{id: "9223372036854775807", jobID: math.MaxInt64},
		// Not numbers jobID holds: kept as keys so that ID gives them back.
		{id: "9223372036854775808", jobKey: "9223372036854775808"},
		{id: "0", jobKey: "0"},
		{id: "007", jobKey: "007"},
		{id: "0190A1B2-7C4D-7E8F-9A0B-1C2D3E4F5A6B", jobKey: "0190A1B2-7C4D-7E8F-9A0B-1C2D3E4F5A6B"},
		// Ids no field admits.
		{id: "", invalid: true},
		{id: "-1", invalid: true},
		{id: "+1", invalid: true},
		{id: "abc-", invalid: true},
		{id: "a_b", invalid: true},
		{id: "a.b", invalid: true},
		{id: "é", invalid: true},
		{id: strings.Repeat("a", hfv1.MaxJobKeyLength+1), invalid: true},
	} {
		err := hfv1.ValidateJobID(tc.id)
		if tc.invalid {
			if err == nil {
				t.Errorf("ValidateJobID(%q) accepted it", tc.id)
			}
			continue
		}
		if err != nil {
			t.Errorf("ValidateJobID(%q) = %v", tc.id, err)
		}
		var spec hfv1.CIJobSpec
		spec.SetID(tc.id)
		if spec.JobID != tc.jobID || spec.JobKey != tc.jobKey || spec.ID() != tc.id {
			t.Errorf("SetID(%q): jobID %d, jobKey %q, ID %q", tc.id, spec.JobID, spec.JobKey, spec.ID())
		}
	}
	// Neither field: no id; a nil bootstrap status has no job; SetJob("")
	// clears.
	if id := (&hfv1.CIJobSpec{}).ID(); id != "" {
		t.Errorf("empty spec ID() = %q", id)
	}
	var none *hfv1.BootstrapStatus
	if none.Job() != "" {
		t.Error("nil bootstrap status has a job")
	}
	st := hfv1.BootstrapStatus{JobID: 7}
	if st.Job() != "7" {
		t.Errorf("jobID 7 reads as %q", st.Job())
	}
	st.SetJob("")
	if st.JobID != 0 || st.JobKey != "" || st.Job() != "" {
		t.Errorf("SetJob(\"\") left %+v", st)
	}
}

// TestCIJobName: for every platform and every id ValidateJobID accepts,
// the name is <platform>-<id lower-cased> and a valid object name (a DNS
// subdomain); GitHub's names are what they always were.
func TestCIJobName(t *testing.T) {
	if got := hfv1.CIJobName(hfv1.WorkloadGitHubActions, "4242"); got != "github-actions-4242" {
		t.Fatalf("GitHub job 4242 is named %q, want github-actions-4242 as before", got)
	}
	if got := hfv1.CIJobName(hfv1.WorkloadBuildkite, "0190A1B2-7C4D-7E8F-9A0B-1C2D3E4F5A6B"); got != "buildkite-0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b" {
		t.Fatalf("Buildkite job name %q", got)
	}
	rapid.Check(t, func(t *rapid.T) {
		platform := rapid.SampledFrom(platforms).Draw(t, "platform")
		id := anyValidID().Draw(t, "id")
		name := hfv1.CIJobName(platform, id)
		if name != string(platform)+"-"+strings.ToLower(id) {
			t.Fatalf("CIJobName(%s, %q) = %q", platform, id, name)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Fatalf("CIJobName(%s, %q) = %q is not a valid object name: %v", platform, id, name, errs)
		}
		// Two ids share a name only when they differ in case alone.
		other := anyValidID().Draw(t, "other")
		if hfv1.CIJobName(platform, other) == name && !strings.EqualFold(other, id) {
			t.Fatalf("jobs %q and %q share the name %q", id, other, name)
		}
	})
}

// TestJobKeyPatternMatchesTheSchema: ValidateJobID accepts exactly the
// ids that jobID or jobKey admit in the generated CRDs (the pattern is
// written twice: as kubebuilder markers and in ValidateJobID).
func TestJobKeyPatternMatchesTheSchema(t *testing.T) {
	for _, crd := range []string{"hyperfleet.io_cijobs.yaml", "hyperfleet.io_machineclaims.yaml"} {
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", crd))
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^\s+jobKey:\n(?:\s+.*\n)*?\s+maxLength: (\d+)\n(?:\s+.*\n)*?\s+pattern: (.+)\n`).FindSubmatch(raw)
		if m == nil {
			t.Fatalf("%s: no jobKey with maxLength and pattern", crd)
		}
		if string(m[1]) != strconv.Itoa(hfv1.MaxJobKeyLength) {
			t.Fatalf("%s: jobKey maxLength %s, MaxJobKeyLength %d", crd, m[1], hfv1.MaxJobKeyLength)
		}
		schema := regexp.MustCompile(string(m[2]))
		rapid.Check(t, func(t *rapid.T) {
			id := rapid.OneOf(anyValidID(), rapid.StringOfN(rapid.SampledFrom([]rune("aZ09-_.é ")), 0, 70, -1)).Draw(t, "id")
			n, err := strconv.ParseInt(id, 10, 64)
			admitted := err == nil && n > 0 && strconv.FormatInt(n, 10) == id ||
				len(id) <= hfv1.MaxJobKeyLength && schema.MatchString(id)
			if got := hfv1.ValidateJobID(id) == nil; got != admitted {
				t.Fatalf("%s: ValidateJobID(%q) accepts: %v; the schema admits it: %v", crd, id, got, admitted)
			}
		})
	}
}

// TestCIJobsOfBothShapesAreStored: the API server stores a CIJob with an
// integer jobID (every existing record) and one with a jobKey (a
// Buildkite job), under the names CIJobName gives, and ID reads both.
func TestCIJobsOfBothShapesAreStored(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	for _, tc := range []struct {
		platform hfv1.WorkloadType
		id       string
	}{
		{hfv1.WorkloadGitHubActions, "4242"},
		{hfv1.WorkloadBuildkite, "0190a1b2-7c4d-7e8f-9a0b-1c2d3e4f5a6b"},
		{hfv1.WorkloadBuildkite, strings.Repeat("Ab-9", 15) + "Zz0z"},
	} {
		job := &hfv1.CIJob{Spec: hfv1.CIJobSpec{Platform: tc.platform, Repository: "octo-org/app", RunnerPoolRef: hfv1.ObjectName{Name: "pool"}}}
		job.Namespace, job.Name = ns, hfv1.CIJobName(tc.platform, tc.id)
		job.Spec.SetID(tc.id)
		if err := env.Client.Create(ctx, job, client.FieldValidation("Strict")); err != nil {
			t.Fatalf("job %q of %s: %v", tc.id, tc.platform, err)
		}
		var got hfv1.CIJob
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.ID() != tc.id {
			t.Errorf("job %q of %s reads back as %q", tc.id, tc.platform, got.Spec.ID())
		}
	}
}
