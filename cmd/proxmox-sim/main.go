// Command proxmox-sim serves a simulated Proxmox VE cluster API.
//
// It speaks HTTPS with a freshly generated self-signed certificate (its
// SHA-256 fingerprint is printed at start-up, as Proxmox shows it) unless
// --insecure-http is given. The API is under /api2/json/; the admin API
// under /_sim/ is off unless --admin is given, and answers loopback
// clients only.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simcmd"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

func main() { simcmd.Main("proxmox-sim", run) }

func run() error {
	var f simcmd.Flags
	f.Define("127.0.0.1:8006", "YAML or JSON cluster description (default: one node pve1, storages local and local-lvm, template 9000, root@pam/root, token root@pam!sim)", "state dump, latency, faults")
	timings := flag.String("timings", "", "timing preset ("+strings.Join(proxmoxsim.PresetNames(), ", ")+"): task latencies, status refresh and storage lock wait; empty keeps the config's (realistic by default)")
	flag.Parse()

	cfg, err := simcmd.World(&f, proxmoxsim.DefaultConfig, proxmoxsim.LoadConfig)
	if err != nil {
		return err
	}
	if *timings != "" {
		t, err := proxmoxsim.Preset(*timings)
		if err != nil {
			return fmt.Errorf("--timings: %w", err)
		}
		cfg.ApplyTimings(t)
	}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(f.Admin), proxmoxsim.WithLogger(simcmd.Logger()))
	if err != nil {
		return err
	}
	defer sim.Close()

	ln, err := net.Listen("tcp", f.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.Listen, err)
	}
	srv := &http.Server{
		Handler:           sim,
		ReadHeaderTimeout: 10 * time.Second,
		// pveproxy speaks HTTP/1.1 only; an empty TLSNextProto keeps Go
		// from negotiating HTTP/2, under which error reasons would be lost.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	scheme := "http"
	if !f.Insecure {
		host, _, _ := net.SplitHostPort(ln.Addr().String())
		cert, fp, err := proxmoxsim.SelfSignedCertificate(host, "localhost", "127.0.0.1")
		if err != nil {
			return fmt.Errorf("generate TLS certificate: %w", err)
		}
		sim.SetFingerprint(fp)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		ln = tls.NewListener(ln, srv.TLSConfig)
		scheme = "https"
		fmt.Printf("TLS certificate SHA-256 fingerprint: %s\n", fp)
	}
	fmt.Printf("Proxmox VE simulator listening on %s://%s/api2/json/ (admin API %s)\n", scheme, ln.Addr(), f.AdminAPI())

	return simcmd.Serve(srv, ln)
}
