package proxmoxsim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
)

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func httptestRequest(method, path string) *http.Request {
	return httptest.NewRequest(method, path, nil)
}

func newRecorder() *httptest.ResponseRecorder { return httptest.NewRecorder() }

// TestVMsAndVolumeIDsMatchState checks the cheap accessors the tests poll
// against the full State: the same VMs, in the same order, and the ids of
// the ISO volumes (an uploaded one and none of the disks).
func TestVMsAndVolumeIDsMatchState(t *testing.T) {
	e := newEnv(t, nil)
	e.wantExit(e.clone("100", nil), "OK")
	e.mustOK(e.upload("pve1", "local", "iso", "seed-100.iso", []byte("not really an ISO"), nil))
	st := e.sim.State()
	if got := e.sim.VMs(); !reflect.DeepEqual(got, st.VMs) {
		t.Errorf("VMs() = %+v\nState().VMs = %+v", got, st.VMs)
	}
	var want []string
	for _, s := range st.Storages {
		for _, v := range s.Volumes {
			if v.Content == "iso" {
				want = append(want, v.VolID)
			}
		}
	}
	if got := e.sim.VolumeIDs("iso"); len(want) == 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("VolumeIDs(iso) = %v, want %v (from State)", got, want)
	}
	if got := e.sim.VolumeIDs("no-such-content"); got != nil {
		t.Errorf("VolumeIDs of no volume = %v", got)
	}
}
