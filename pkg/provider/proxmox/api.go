package proxmox

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	proxmox "github.com/luthermonson/go-proxmox"

	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// api is the thin layer over go-proxmox's Client: every call is bounded by
// the request timeout and returns a classified error.
type api struct {
	px       *proxmox.Client
	http     *http.Client
	baseURL  string
	basePath string
	timeout  time.Duration
}

// call sends one request. query goes into the URL, body (POST/PUT) is sent
// as JSON, which pveproxy accepts like a form.
func (a *api) call(ctx context.Context, method, path string, query url.Values, body map[string]any, out any) error {
	rctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	x := &exchange{}
	rctx = withExchange(rctx, x)
	full := path
	if len(query) > 0 {
		full += "?" + query.Encode()
	}
	var err error
	switch method {
	case http.MethodGet:
		err = a.px.Get(rctx, full, out)
	case http.MethodPost:
		err = a.px.Post(rctx, full, nilIfEmpty(body), out)
	case http.MethodPut:
		err = a.px.Put(rctx, full, nilIfEmpty(body), out)
	case http.MethodDelete:
		err = a.px.Delete(rctx, full, out)
	default:
		return fmt.Errorf("unsupported method %s", method)
	}
	return a.check(ctx, x, err, method, path)
}

func nilIfEmpty(body map[string]any) any {
	if len(body) == 0 {
		return nil
	}
	return body
}

// check turns the recorded exchange and go-proxmox's error into the
// classified result.
func (a *api) check(ctx context.Context, x *exchange, err error, method, path string) error {
	endpoint := endpointTemplate("", path)
	switch {
	case x.code == 0 && err != nil:
		return transportError(ctx, err, method, endpoint)
	case x.code == 0:
		return provider.Errorf(provider.ClassTransient, "Unreachable", "%w: %s %s: no answer", provider.ErrUnreachable, method, endpoint)
	case x.code < 200 || x.code >= 300:
		return httpError(x, method, endpoint)
	case err != nil:
		return provider.Errorf(provider.ClassTransient, "BadResponse", "%s %s: the answer could not be read: %w", method, endpoint, err)
	}
	return nil
}

// upload posts a file to a storage (multipart, as the web UI does). It does
// not use go-proxmox's UploadReader, which ignores the context. A SHA-256
// checksum makes the upload task verify what arrived.
func (a *api) upload(ctx context.Context, node, storage, filename string, data []byte) (string, error) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	sum := sha256.Sum256(data)
	for _, kv := range [][2]string{{"content", "iso"}, {"checksum-algorithm", "sha256"}, {"checksum", hex.EncodeToString(sum[:])}} {
		if err := w.WriteField(kv[0], kv[1]); err != nil {
			return "", err
		}
	}
	fw, err := w.CreateFormFile("filename", filename)
	if err != nil {
		return "", err
	}
	if _, err := fw.Write(data); err != nil {
		return "", err
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	path := fmt.Sprintf("/nodes/%s/storage/%s/upload", node, storage)
	rctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	x := &exchange{}
	req, err := http.NewRequestWithContext(withExchange(rctx, x), http.MethodPost, a.baseURL+path, bytes.NewReader(b.Bytes()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", w.FormDataContentType())
	req.Header.Set("Accept", "application/json")
	res, err := a.http.Do(req)
	if err != nil {
		return "", a.check(ctx, x, err, http.MethodPost, path)
	}
	defer func() { _ = res.Body.Close() }()
	raw, rerr := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err := a.check(ctx, x, rerr, http.MethodPost, path); err != nil {
		return "", err
	}
	var out struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Data == "" {
		return "", provider.Errorf(provider.ClassTransient, "BadResponse", "POST %s: the answer holds no task id", endpointTemplate("", path))
	}
	return out.Data, nil
}

// upidNode returns the node field of a UPID
// ("UPID:<node>:<pid>:<pstart>:<starttime>:<type>:<id>:<user>:").
func upidNode(upid string) (string, bool) {
	parts := strings.Split(upid, ":")
	if len(parts) < 8 || parts[0] != "UPID" || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

// taskStatus is GET /nodes/{node}/tasks/{upid}/status.
type taskStatus struct {
	Status     string `json:"status"`
	ExitStatus string `json:"exitstatus"`
	Type       string `json:"type"`
}

func (t taskStatus) running() bool { return t.Status == "running" }

// ok is true for a stopped task that succeeded: "OK" and "WARNINGS: N"
// are both success (go-proxmox's Task.Wait counts warnings as failure).
func (t taskStatus) ok() bool {
	return t.ExitStatus == "OK" || strings.HasPrefix(t.ExitStatus, "WARNINGS")
}

func (a *api) task(ctx context.Context, upid string) (taskStatus, error) {
	var st taskStatus
	node, ok := upidNode(upid)
	if !ok {
		return st, provider.Errorf(provider.ClassPermanent, "NotFound", "%w: %q is not a Proxmox task id", provider.ErrNotFound, upid)
	}
	err := a.call(ctx, http.MethodGet, "/nodes/"+node+"/tasks/"+upid+"/status", nil, nil, &st)
	return st, err
}

// vmConfig is a VM's config with every value as a string (GET config
// returns numbers for some keys).
type vmConfig map[string]string

func (a *api) config(ctx context.Context, node string, vmid int) (vmConfig, error) {
	var raw map[string]any
	if err := a.call(ctx, http.MethodGet, fmt.Sprintf("/nodes/%s/qemu/%d/config", node, vmid), nil, nil, &raw); err != nil {
		// provider.ErrNotFound from here means the VM's config file is
		// missing on node, nothing else.
		return nil, aboutVM(err, vmid)
	}
	cfg := vmConfig{}
	for k, v := range raw {
		switch t := v.(type) {
		case string:
			cfg[k] = t
		case float64:
			cfg[k] = strconv.FormatFloat(t, 'f', -1, 64)
		case bool:
			cfg[k] = map[bool]string{true: "1", false: "0"}[t]
		case nil:
		default:
			b, _ := json.Marshal(t)
			cfg[k] = string(b)
		}
	}
	return cfg, nil
}

// vmStatus is GET .../status/current.
type vmStatus struct {
	Status   string `json:"status"`
	Lock     string `json:"lock"`
	Name     string `json:"name"`
	Tags     string `json:"tags"`
	Uptime   int64  `json:"uptime"`
	Template int    `json:"template"`
}

func (a *api) status(ctx context.Context, node string, vmid int) (vmStatus, error) {
	var st vmStatus
	err := a.call(ctx, http.MethodGet, fmt.Sprintf("/nodes/%s/qemu/%d/status/current", node, vmid), nil, nil, &st)
	return st, aboutVM(err, vmid)
}

// resource is one entry of GET /cluster/resources (go-proxmox's
// ClusterResource lacks the lock).
type resource struct {
	ID         string  `json:"id"`
	Type       string  `json:"type"`
	Node       string  `json:"node"`
	Status     string  `json:"status"`
	Name       string  `json:"name"`
	VMID       int     `json:"vmid"`
	Template   int     `json:"template"`
	Uptime     int64   `json:"uptime"`
	MaxCPU     float64 `json:"maxcpu"`
	Mem        int64   `json:"mem"`
	MaxMem     int64   `json:"maxmem"`
	Disk       int64   `json:"disk"`
	MaxDisk    int64   `json:"maxdisk"`
	Lock       string  `json:"lock"`
	Tags       string  `json:"tags"`
	Pool       string  `json:"pool"`
	Storage    string  `json:"storage"`
	PluginType string  `json:"plugintype"`
	Shared     int     `json:"shared"`
	Content    string  `json:"content"`
}

func (a *api) resources(ctx context.Context, typ string) ([]resource, error) {
	var out []resource
	var q url.Values
	if typ != "" {
		q = url.Values{"type": {typ}}
	}
	err := a.call(ctx, http.MethodGet, "/cluster/resources", q, nil, &out)
	// A failed listing never means "not listed": callers read a VM's
	// absence from a listing that succeeded.
	return out, withoutNotFound(err, "the cluster's resource listing failed")
}

// agentInterfaces is GET .../agent/network-get-interfaces.
func (a *api) agentInterfaces(ctx context.Context, node string, vmid int) ([]*proxmox.AgentNetworkIface, error) {
	var out struct {
		Result []*proxmox.AgentNetworkIface `json:"result"`
	}
	err := a.call(ctx, http.MethodGet, fmt.Sprintf("/nodes/%s/qemu/%d/agent/network-get-interfaces", node, vmid), nil, nil, &out)
	return out.Result, err
}

// volumeExists is GET /nodes/{node}/storage/{storage}/content/{volume}.
func (a *api) volumeExists(ctx context.Context, node, storage, volid string) (bool, error) {
	var out map[string]any
	err := a.call(ctx, http.MethodGet, fmt.Sprintf("/nodes/%s/storage/%s/content/%s", node, storage, volid), nil, nil, &out)
	switch {
	case err == nil:
		return true, nil
	case isNotFound(err):
		return false, nil
	}
	return false, err
}

// upid runs an async call and returns its task id.
func (a *api) upid(ctx context.Context, method, path string, query url.Values, body map[string]any) (string, error) {
	var upid string
	if err := a.call(ctx, method, path, query, body, &upid); err != nil {
		return "", err
	}
	if !strings.HasPrefix(upid, "UPID:") {
		return "", provider.Errorf(provider.ClassTransient, "BadResponse", "%s %s: the answer holds no task id", method, endpointTemplate("", path))
	}
	return upid, nil
}
