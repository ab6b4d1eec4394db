package proxmoxsim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/luthermonson/go-proxmox"
)

const rootToken = "PVEAPIToken=root@pam!sim=00000000-0000-0000-0000-000000000000"

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// testConfig is DefaultConfig with zero latency and no 401 delay.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.Latency = Latency{}
	cfg.AuthFailureDelay = 0
	cfg.RefreshInterval = 0
	return cfg
}

type simEnv struct {
	t     *testing.T
	sim   *Simulator
	srv   *httptest.Server
	clock *FakeClock
	auth  string
}

// newEnv starts a simulator on a fake clock behind a loopback httptest
// server; both are closed when the test ends.
func newEnv(t *testing.T, mutate func(*Config), opts ...Option) *simEnv {
	t.Helper()
	cfg := testConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	clock := NewFakeClock(t0)
	sim, err := New(cfg, append([]Option{WithClock(clock)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(func() {
		srv.Close()
		if err := sim.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return &simEnv{t: t, sim: sim, srv: srv, clock: clock, auth: rootToken}
}

type apiResp struct {
	code   int
	status string // full status line text, e.g. "500 VM is locked (clone)"
	raw    []byte
	body   map[string]any
}

func (r apiResp) data() any { return r.body["data"] }

func (r apiResp) dataMap(t *testing.T) map[string]any {
	t.Helper()
	m, ok := r.body["data"].(map[string]any)
	if !ok {
		t.Fatalf("data is %T, not an object: %s", r.body["data"], r.raw)
	}
	return m
}

func (r apiResp) dataList(t *testing.T) []map[string]any {
	t.Helper()
	l, ok := r.body["data"].([]any)
	if !ok {
		t.Fatalf("data is %T, not a list: %s", r.body["data"], r.raw)
	}
	out := make([]map[string]any, len(l))
	for i, e := range l {
		out[i] = e.(map[string]any)
	}
	return out
}

func (r apiResp) errors() map[string]any {
	m, _ := r.body["errors"].(map[string]any)
	return m
}

// call sends a form-encoded request (query for GET/DELETE).
func (e *simEnv) call(method, path string, params url.Values, hdr ...string) apiResp {
	e.t.Helper()
	var body io.Reader
	target := e.srv.URL + "/api2/json" + path
	if method == http.MethodGet || method == http.MethodDelete {
		if len(params) > 0 {
			target += "?" + params.Encode()
		}
	} else if params != nil {
		body = strings.NewReader(params.Encode())
	}
	req, err := http.NewRequest(method, target, body)
	if err != nil {
		e.t.Fatalf("new request: %v", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if e.auth != "" {
		req.Header.Set("Authorization", e.auth)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.send(req)
}

func (e *simEnv) send(req *http.Request) apiResp {
	e.t.Helper()
	res, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatalf("read body: %v", err)
	}
	r := apiResp{code: res.StatusCode, status: res.Status, raw: raw}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.t.Fatalf("%s %s: body is not JSON: %q", req.Method, req.URL.Path, raw)
		}
	}
	return r
}

func (e *simEnv) upload(node, storage, content, filename string, data []byte, extra map[string]string) apiResp {
	e.t.Helper()
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	_ = w.WriteField("content", content)
	for k, v := range extra {
		_ = w.WriteField(k, v)
	}
	fw, _ := w.CreateFormFile("filename", filename)
	_, _ = fw.Write(data)
	_ = w.Close()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/api2/json/nodes/"+node+"/storage/"+storage+"/upload", &b)
	req.Header.Set("Content-Type", w.FormDataContentType())
	req.Header.Set("Authorization", e.auth)
	return e.send(req)
}

// mustOK fails unless the response is 200.
func (e *simEnv) mustOK(r apiResp) apiResp {
	e.t.Helper()
	if r.code != http.StatusOK {
		e.t.Fatalf("want 200, got %s: %s", r.status, r.raw)
	}
	return r
}

// task returns the status object of a UPID.
func (e *simEnv) task(upid string) map[string]any {
	e.t.Helper()
	node := strings.Split(upid, ":")[1]
	return e.mustOK(e.call(http.MethodGet, "/nodes/"+node+"/tasks/"+upid+"/status", nil)).dataMap(e.t)
}

// upid extracts the UPID string of a successful async call.
func (e *simEnv) upid(r apiResp) string {
	e.t.Helper()
	e.mustOK(r)
	s, ok := r.data().(string)
	if !ok || !upidRE.MatchString(s) {
		e.t.Fatalf("not a UPID: %s", r.raw)
	}
	return s
}

// wantExit asserts a stopped task with the given exit status.
func (e *simEnv) wantExit(upid, exit string) {
	e.t.Helper()
	st := e.task(upid)
	if st["status"] != "stopped" || st["exitstatus"] != exit {
		e.t.Fatalf("task %s: want stopped/%q, got %v/%v", upid, exit, st["status"], st["exitstatus"])
	}
}

// clone clones template 9000 to newid and returns the UPID.
func (e *simEnv) clone(newid string, extra url.Values) string {
	e.t.Helper()
	p := url.Values{"newid": {newid}}
	for k, v := range extra {
		p[k] = v
	}
	return e.upid(e.call(http.MethodPost, "/nodes/pve1/qemu/9000/clone", p))
}

func form(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v
}

// templateOnPVE1 returns node pve1 and its template 9000 through go-proxmox.
func templateOnPVE1(ctx context.Context, t *testing.T, c *proxmox.Client) (*proxmox.Node, *proxmox.VirtualMachine) {
	t.Helper()
	node, err := c.Node(ctx, "pve1")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := node.VirtualMachine(ctx, 9000)
	if err != nil {
		t.Fatal(err)
	}
	return node, tmpl
}
