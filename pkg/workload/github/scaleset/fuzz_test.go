package scaleset

import (
	"context"
	"encoding/json"
	"testing"
)

// FuzzDecodeMessage: the decoder never panics, and what it accepts is a
// message with an id whose job messages are all of known types.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(`{"messageId":1,"messageType":"RunnerScaleSetJobMessages","body":"[{\"messageType\":\"JobAvailable\",\"runnerRequestId\":7,\"requestLabels\":[\"x\"]}]","statistics":{"totalAvailableJobs":1}}`))
	f.Add([]byte(`{"messageId":2,"messageType":"RunnerScaleSetJobMessages","body":"[{\"messageType\":\"JobCompleted\",\"result\":\"succeeded\",\"runnerId\":3},{\"messageType\":\"Other\"}]"}`))
	f.Add([]byte(`{"messageId":3,"messageType":"RunnerScaleSetJobMessages","body":""}`))
	f.Add([]byte(`{"messageId":4,"messageType":"SomethingElse"}`))
	f.Add([]byte(`{"messageId":5,"messageType":"RunnerScaleSetJobMessages","body":"not json"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeMessage(data)
		if err != nil {
			if m != nil {
				t.Fatal("message returned with an error")
			}
			return
		}
		if m.ID <= 0 {
			t.Fatalf("accepted message without id: %q", data)
		}
		for _, j := range m.Jobs {
			switch j.Type {
			case JobAvailable, JobAssigned, JobStarted, JobCompleted:
			default:
				t.Fatalf("unknown job message type %q kept", j.Type)
			}
		}
	})
}

// TestDecodeMessage checks the decoder's answers on the seeds.
func TestDecodeMessage(t *testing.T) {
	m, err := DecodeMessage([]byte(`{"messageId":2,"messageType":"RunnerScaleSetJobMessages","body":"[{\"messageType\":\"JobCompleted\",\"result\":\"failed\",\"runnerId\":3,\"runnerName\":\"r\",\"runnerRequestId\":9},{\"messageType\":\"Other\"}]","statistics":{"totalAssignedJobs":4}}`))
	if err != nil || m.ID != 2 || len(m.Jobs) != 1 || m.Jobs[0].Result != "failed" || m.Jobs[0].RunnerID != 3 || m.Jobs[0].RunnerRequestID != 9 || m.Statistics.TotalAssignedJobs != 4 {
		t.Fatalf("decode = %+v, %v", m, err)
	}
	for _, bad := range []string{`{"messageId":4,"messageType":"SomethingElse"}`, `{"messageId":5,"messageType":"RunnerScaleSetJobMessages","body":"[1]"}`, `{"messageType":"RunnerScaleSetJobMessages"}`, `[`} {
		if _, err := DecodeMessage([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// TestUserAgent: the user agent is JSON with ARC's fields.
func TestUserAgent(t *testing.T) {
	c, err := New(Config{ConfigURL: "https://github.com/octo-org", APIURL: "https://api.github.com", Token: func(context.Context) (string, error) { return "", nil }})
	if err != nil {
		t.Fatal(err)
	}
	var ua map[string]string
	if err := json.Unmarshal([]byte(c.userAgent), &ua); err != nil {
		t.Fatalf("user agent %q: %v", c.userAgent, err)
	}
	if ua["system"] != "hyperfleet" || ua["subsystem"] != "listener" || ua["version"] == "" || ua["commit_sha"] == "" {
		t.Fatalf("user agent = %v", ua)
	}
	for _, bad := range []string{"", "https://github.com/", "not a url", "https://github.com/a/b/c"} {
		if _, err := New(Config{ConfigURL: bad, APIURL: "https://api.github.com", Token: func(context.Context) (string, error) { return "", nil }}); err == nil {
			t.Errorf("ConfigURL %q accepted", bad)
		}
	}
	for url, want := range map[string]string{
		"https://github.com/octo-org":          "/orgs/octo-org/actions/runners/registration-token",
		"https://github.com/octo-org/app":      "/repos/octo-org/app/actions/runners/registration-token",
		"https://github.com/enterprises/acme":  "/enterprises/acme/actions/runners/registration-token",
		"https://ghe.example.com/octo-org/app": "/repos/octo-org/app/actions/runners/registration-token",
	} {
		if got, err := scopePath(url); err != nil || got != want {
			t.Errorf("scopePath(%s) = %q, %v", url, got, err)
		}
	}
}
