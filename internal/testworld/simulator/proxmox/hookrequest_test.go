package proxmoxsim

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCloneRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body, contentType string
	}{
		{"form", "newid=1042&name=runners-x7k2q&full=0", "application/x-www-form-urlencoded"},
		{"json", `{"newid":1042,"name":"runners-x7k2q","full":0}`, "application/json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/api2/json/nodes/pve1/qemu/9000/clone", strings.NewReader(tc.body))
			r.Header.Set("Content-Type", tc.contentType)
			id, name, ok := CloneRequest(r)
			if !ok || id != 1042 || name != "runners-x7k2q" {
				t.Fatalf("CloneRequest = %d, %q, %v; want 1042, runners-x7k2q, true", id, name, ok)
			}
			// The simulator still reads the whole body.
			if rest, _ := io.ReadAll(r.Body); string(rest) != tc.body {
				t.Fatalf("body left for the simulator: %q", rest)
			}
		})
	}
	if _, _, ok := CloneRequest(httptest.NewRequest("POST", "/api2/json/nodes/pve1/qemu/9000/config", strings.NewReader("name=x"))); ok {
		t.Fatal("a config request read as a clone")
	}
	if _, _, ok := CloneRequest(httptest.NewRequest("GET", "/api2/json/nodes/pve1/qemu/9000/clone", nil)); ok {
		t.Fatal("a GET read as a clone")
	}
}
