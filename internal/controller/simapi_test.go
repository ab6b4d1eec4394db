package controller_test

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// simCall calls the simulator's Proxmox API as an administrator would by
// hand, for tests that set up VMs the operator did not create.
func simCall(t *testing.T, sim *simulator, method, path string, form url.Values) json.RawMessage {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, sim.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "PVEAPIToken="+simTokenID+"="+simTokenSecret)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	// Test-only client for a loopback server with a throwaway certificate.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec
	res, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("%s %s: %s %s", method, path, res.Status, raw)
	}
	var out struct {
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return out.Data
}

// handMadeVM clones template 9000 to vmid by hand and sets its description
// and tags, waiting for the clone to finish.
func handMadeVM(t *testing.T, sim *simulator, vmid int, description, tags string) {
	t.Helper()
	var upid string
	if err := json.Unmarshal(simCall(t, sim, "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {fmt.Sprint(vmid)}, "name": {fmt.Sprintf("hand-%d", vmid)}}), &upid); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "hand-made clone done", func() error {
		var st struct {
			Status     string `json:"status"`
			ExitStatus string `json:"exitstatus"`
		}
		if err := json.Unmarshal(simCall(t, sim, "GET", "/nodes/pve1/tasks/"+url.PathEscape(upid)+"/status", nil), &st); err != nil {
			return err
		}
		if st.Status != "stopped" {
			return fmt.Errorf("clone %s", st.Status)
		}
		if st.ExitStatus != "OK" {
			t.Fatalf("hand-made clone failed: %s", st.ExitStatus)
		}
		return nil
	})
	simCall(t, sim, "PUT", fmt.Sprintf("/nodes/pve1/qemu/%d/config", vmid), url.Values{"description": {description}, "tags": {tags}})
}
