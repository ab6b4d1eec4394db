package proxmoxsim

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// BenchmarkClusterResources5000 measures GET /cluster/resources?type=vm
// over HTTP with 5,000 VMs.
func BenchmarkClusterResources5000(b *testing.B) {
	// Proxmox serves this call from pvestatd's last broadcast, refreshed
	// every 10 s; the benchmark keeps that default so it measures serving,
	// not sampling.
	cfg := testConfig()
	cfg.RefreshInterval = DefaultConfig().RefreshInterval
	sim, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	sim.mu.Lock()
	tmpl := sim.vms[9000]
	for i := 0; i < 5000; i++ {
		conf := map[string]string{}
		for k, v := range tmpl.conf {
			conf[k] = v
		}
		delete(conf, "template")
		conf["name"] = "vm-" + strconv.Itoa(1000+i)
		sim.vms[1000+i] = &vm{vmid: 1000 + i, node: "pve1", conf: conf, running: i%2 == 0}
	}
	sim.mu.Unlock()
	sim.RefreshResources()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	client := srv.Client()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api2/json/cluster/resources?type=vm", nil)
		req.Header.Set("Authorization", rootToken)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		// Read the whole body like a real client so the connection is
		// reused and the cost of encoding all 5,000 entries is measured.
		n, err := io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if err != nil || res.StatusCode != 200 || n < 5000*100 {
			b.Fatalf("status %s, %d bytes, %v", res.Status, n, err)
		}
		b.SetBytes(n)
	}
}

// BenchmarkCloneThroughput measures linked clones per second (POST clone
// plus task completion) over HTTP with zero latency.
func BenchmarkCloneThroughput(b *testing.B) {
	cfg := testConfig()
	sim, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Close()
	srv := httptest.NewServer(sim)
	defer srv.Close()
	client := srv.Client()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api2/json/nodes/pve1/qemu/9000/clone?newid="+strconv.Itoa(100+i), nil)
		req.Header.Set("Authorization", rootToken)
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			b.Fatalf("clone %d: %s", 100+i, res.Status)
		}
	}
	b.StopTimer()
	if got := len(sim.VMs()); got != b.N+1 {
		b.Fatalf("want %d VMs, got %d", b.N+1, got)
	}
}
