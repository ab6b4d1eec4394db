package monitoring

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Prometheus is Debian's prometheus run by a test (StartPrometheus).
type Prometheus struct {
	// Base is its HTTP API's base URL.
	Base string
}

// StartPrometheus runs prometheus with config (its prometheus.yml) on a
// free loopback port, storing into a temporary directory, and returns once
// it is ready; the test's cleanup stops it and prints its log when the
// test failed.
func StartPrometheus(t *testing.T, config string) *Prometheus {
	t.Helper()
	bin := Program(t, "prometheus")
	dir := t.TempDir()
	configFile := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logFile, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
		if t.Failed() {
			if data, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("prometheus log:\n%s", data)
			}
		}
	})
	p := &Prometheus{Base: "http://" + addr}
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-exited:
			t.Fatalf("prometheus exited at start: %v", waitErr)
		default:
		}
		res, err := http.Get(p.Base + "/-/ready")
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				t.Logf("prometheus ready on %s", addr)
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within a minute: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Get calls an HTTP API endpoint and decodes its data into out.
func (p *Prometheus) Get(path string, params url.Values, out any) error {
	res, err := http.Get(p.Base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Data   json.RawMessage `json:"data"`
		Error  string          `json:"error"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, res.StatusCode, body)
	}
	if env.Status != "success" {
		return errors.New(env.Error)
	}
	return json.Unmarshal(env.Data, out)
}

// Query runs an instant query now and returns its result: the series of a
// vector, or one element for a scalar.
func (p *Prometheus) Query(q string) ([]json.RawMessage, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.Get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	if data.ResultType != "vector" && data.ResultType != "matrix" {
		return []json.RawMessage{data.Result}, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(data.Result, &series); err != nil {
		return nil, fmt.Errorf("query %s: %w", q, err)
	}
	return series, nil
}

// Value runs an instant query whose result is one series and returns its
// value.
func (p *Prometheus) Value(q string) (float64, error) {
	res, err := p.Query(q)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("query %s: %d series, want 1", q, len(res))
	}
	var s struct {
		Value [2]json.RawMessage `json:"value"`
	}
	var text string
	if err := json.Unmarshal(res[0], &s); err != nil {
		return 0, err
	}
	if err := json.Unmarshal(s.Value[1], &text); err != nil {
		return 0, err
	}
	return strconv.ParseFloat(text, 64)
}
