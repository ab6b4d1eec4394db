package githubsim

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzParseJITRequest feeds arbitrary bodies to the generate-jitconfig
// parser: it must never panic, and what it accepts must satisfy GitHub's
// schema (name, 1-100 string labels, a work folder).
func FuzzParseJITRequest(f *testing.F) {
	for _, seed := range []string{
		`{"name":"r","runner_group_id":1,"labels":["self-hosted"],"work_folder":"_work"}`,
		`{"name":"r","runner_group_id":"1","labels":["a"]}`,
		`{"name":null,"runner_group_id":1,"labels":[]}`,
		`{"name":"r","runner_group_id":1.5,"labels":[1,2]}`,
		`{"name":"r","runner_group_id":1,"labels":"a"}`,
		`[]`, `{`, `null`, `{"name":"\u0000"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		spec, err := parseJITRequest(body)
		if err != nil {
			if err.code != 400 && err.code != 422 {
				t.Fatalf("status %d for %q", err.code, body)
			}
			if !strings.HasPrefix(err.msg, "Invalid request.") && err.msg != "Problems parsing JSON" && !strings.HasPrefix(err.msg, "Invalid label") {
				t.Fatalf("message %q", err.msg)
			}
			return
		}
		if validateRunnerName(spec.name) != nil || len(spec.labels) < 1 || len(spec.labels) > 100 || spec.workFolder == "" {
			t.Fatalf("accepted invalid request %q: %+v", body, spec)
		}
	})
}

// FuzzParseRegistration feeds arbitrary config.sh forms to the runner
// API's registration parser.
func FuzzParseRegistration(f *testing.F) {
	for _, seed := range []string{
		"url=https://h/octo-org/app&name=r&labels=a,b&ephemeral=true",
		"url=https://h/octo-org&name=r&runnergroup=hyperfleet",
		"url=octo-org&name=r", "url=https://h/&name=", "name=r", "url=https://h/a/b/c&name=r",
		"url=%zz", "labels=,,,&url=https://h/o&name=x",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		form, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		reg, perr := parseRegistration(form)
		if perr != nil {
			return
		}
		if reg.owner == "" || strings.Contains(reg.owner, "/") || strings.Contains(reg.repo, "/") || validateRunnerName(reg.name) != nil || reg.work == "" || len(reg.labels) > 100 {
			t.Fatalf("accepted invalid registration %q: %+v", raw, reg)
		}
		for _, l := range reg.labels {
			if l == "" || strings.Contains(l, ",") {
				t.Fatalf("bad label %q from %q", l, raw)
			}
		}
	})
}
