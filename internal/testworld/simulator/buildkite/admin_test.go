package buildkitesim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAgentTarball: the tarball carries the configured binary, and the
// checksum file names its SHA-256, as a VM checks it.
func TestAgentTarball(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "agent")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho agent\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	sim := New(Config{AgentBinary: bin, AgentVersion: "3.138.1"})
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	get := func(name string) (int, []byte) {
		resp, err := http.Get(srv.URL + "/_sim/agent/" + name)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, tb := get("buildkite-agent-linux-amd64-3.138.1.tar.gz")
	if code != 200 {
		t.Fatalf("tarball: %d", code)
	}
	_, sums := get("buildkite-agent-3.138.1.SHA256SUMS")
	sum := sha256.Sum256(tb)
	if want := hex.EncodeToString(sum[:]) + "  buildkite-agent-linux-amd64-3.138.1.tar.gz\n"; string(sums) != want {
		t.Errorf("SHA256SUMS = %q, want %q", sums, want)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "buildkite-agent" || hdr.Mode != 0o755 {
		t.Fatalf("tar entry: %+v, %v", hdr, err)
	}
	if body, _ := io.ReadAll(tr); string(body) != "#!/bin/sh\necho agent\n" {
		t.Errorf("tar entry holds %q", body)
	}
	if code, _ := get("buildkite-agent-linux-amd64-3.0.0.tar.gz"); code != 404 {
		t.Errorf("another version: %d, want 404", code)
	}
}

// TestAdminHTTP: the admin API is off unless enabled, and with it a test
// outside Go sets up a build and reads its job back.
func TestAdminHTTP(t *testing.T) {
	off := httptest.NewServer(New(Config{}))
	defer off.Close()
	if resp, err := http.Post(off.URL+"/_sim/clusters", "application/json", strings.NewReader(`{"name":"c"}`)); err != nil || resp.StatusCode != 404 {
		t.Fatalf("admin API without WithAdmin: %v %v", resp.StatusCode, err)
	}
	sim := New(Config{}, WithAdmin(true))
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	post := func(path, body string, out any) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/_sim/"+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		if out != nil {
			if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var c Cluster
	post("clusters", `{"name":"c"}`, &c)
	post("pipelines", `{"slug":"p","clusterId":"`+c.ID+`"}`, nil)
	var b Build
	post("builds", `{"pipeline":"p","steps":[{"key":"k","command":"true","agents":["queue=default"]}]}`, &b)
	resp, err := http.Get(srv.URL + "/_sim/jobs/" + b.JobIDs[0])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info JobInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || info.State != stateScheduled {
		t.Fatalf("job: %+v, %v", info, err)
	}
}
