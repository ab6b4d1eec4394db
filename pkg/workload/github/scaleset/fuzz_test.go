package scaleset

import (
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
