package proxmoxsim

import (
	"io"
	"net/http"
	"net/http/httptest"
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
