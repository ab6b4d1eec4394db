package why

import (
	"fmt"
	"net/url"
	"strings"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TargetKind is what a question is about.
type TargetKind string

// The kinds of target.
const (
	TargetJob   TargetKind = "job"
	TargetPool  TargetKind = "pool"
	TargetClaim TargetKind = "claim"
)

// Target is what `hyperfleet why` was asked about.
type Target struct {
	Kind TargetKind
	// Namespace limits the search; "" is every namespace.
	Namespace string
	// Name is the object's name: the pool's, the claim's, or a CIJob's
	// when the job was named by its CIJob.
	Name string
	// JobID is the platform's id of the job (as text, hfv1.CIJobSpec.ID).
	JobID string
	// Platform is the job's platform when its URL tells it; "" matches
	// any.
	Platform hfv1.WorkloadType
	// Repository is the job's repository when its URL tells it.
	Repository string
}

// String prints the target as the user could have typed it.
func (t Target) String() string {
	switch {
	case t.Kind != TargetJob:
		return string(t.Kind) + "/" + t.Name
	case t.Name != "":
		return "job/" + t.Name
	case t.Repository != "":
		return fmt.Sprintf("job %s of %s", t.JobID, t.Repository)
	}
	return "job " + t.JobID
}

// ParseTarget reads the argument of `hyperfleet why`: pool/NAME,
// claim/NAME, job/NAME (a CIJob's name), a job's URL as GitHub, GitLab or
// Buildkite print it, or a job id.
func ParseTarget(arg, namespace string) (Target, error) {
	arg = strings.TrimSpace(arg)
	t := Target{Kind: TargetJob, Namespace: namespace}
	if kind, name, ok := strings.Cut(arg, "/"); ok && !strings.Contains(arg, "://") {
		switch strings.ToLower(kind) {
		case "pool", "runnerpool", "runnerpools", "rp":
			t.Kind, t.Name = TargetPool, name
		case "claim", "machineclaim", "machineclaims", "mc":
			t.Kind, t.Name = TargetClaim, name
		case "job", "cijob", "cijobs", "cij":
			t.Name = name
		default:
			return Target{}, fmt.Errorf("%q: give pool/NAME, claim/NAME, job/NAME, a job's URL or a job id", arg)
		}
		if name == "" || strings.Contains(name, "/") {
			return Target{}, fmt.Errorf("%q: the name after %s/ is missing or has a /", arg, kind)
		}
		return t, nil
	}
	if strings.Contains(arg, "://") {
		return parseJobURL(arg, t)
	}
	if err := hfv1.ValidateJobID(arg); err != nil {
		return Target{}, fmt.Errorf("%q is not a job id, a job's URL, pool/NAME or claim/NAME: %w", arg, err)
	}
	t.JobID = arg
	return t, nil
}

// parseJobURL reads a job's id, platform and repository from the URL of
// its page:
//
//	GitHub:    https://github.com/OWNER/REPO/actions/runs/RUN/job/JOB
//	           https://github.com/OWNER/REPO/runs/JOB (the check run: its id is the job's)
//	GitLab:    https://gitlab.com/GROUP/PROJECT/-/jobs/JOB
//	Buildkite: https://buildkite.com/ORG/PIPELINE/builds/N#JOB-UUID
//	           (or ...?jid=JOB-UUID, or .../jobs/JOB-UUID)
//
// Hosts are not checked: a GitHub Enterprise Server or a self-managed
// GitLab prints the same paths.
func parseJobURL(raw string, t Target) (Target, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Target{}, fmt.Errorf("reading the job's URL %q: %w", raw, err)
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case indexOf(segs, "-") >= 1:
		// GitLab puts /-/ between the project and its pages.
		i := indexOf(segs, "-")
		if i+2 < len(segs) && segs[i+1] == "jobs" {
			t.Platform, t.Repository, t.JobID = hfv1.WorkloadGitLabCI, strings.Join(segs[:i], "/"), segs[i+2]
		}
	case indexOf(segs, "builds") == 2:
		t.Platform, t.Repository = hfv1.WorkloadBuildkite, segs[0]+"/"+segs[1]
		t.JobID = u.Fragment
		if jid := u.Query().Get("jid"); jid != "" {
			t.JobID = jid
		}
		if i := indexOf(segs, "jobs"); i > 0 && i+1 < len(segs) {
			t.JobID = segs[i+1]
		}
	case len(segs) >= 4:
		t.Platform, t.Repository = hfv1.WorkloadGitHubActions, segs[0]+"/"+segs[1]
		if i := indexOf(segs, "job"); i > 0 && i+1 < len(segs) {
			t.JobID = segs[i+1]
		} else if segs[2] == "runs" {
			t.JobID = segs[3]
		}
	}
	if t.JobID == "" {
		return Target{}, fmt.Errorf("the URL %q names no job: give a job's page (GitHub .../actions/runs/RUN/job/JOB, GitLab .../-/jobs/JOB, Buildkite .../builds/N#JOB)", raw)
	}
	if err := hfv1.ValidateJobID(t.JobID); err != nil {
		return Target{}, fmt.Errorf("the URL %q: %w", raw, err)
	}
	return t, nil
}

func indexOf(ss []string, s string) int {
	for i, v := range ss {
		if v == s {
			return i
		}
	}
	return -1
}

// matchesJob reports whether cj is the job t names.
func (t Target) matchesJob(cj *hfv1.CIJob) bool {
	if t.Namespace != "" && cj.Namespace != t.Namespace {
		return false
	}
	if t.Name != "" {
		return cj.Name == t.Name
	}
	if t.Platform != "" && cj.Spec.Platform != t.Platform {
		return false
	}
	if t.Repository != "" && !strings.EqualFold(cj.Spec.Repository, t.Repository) {
		return false
	}
	return strings.EqualFold(cj.Spec.ID(), t.JobID)
}
