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
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simcmd"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "proxmox-sim:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:8006", "address to listen on")
	configPath := flag.String("config", "", "YAML or JSON cluster description (default: one node pve1, storages local and local-lvm, template 9000, root@pam/root, token root@pam!sim)")
	insecure := flag.Bool("insecure-http", false, "serve plain HTTP instead of HTTPS")
	admin := flag.Bool("admin", false, "enable the /_sim/ admin API (state dump, latency, faults); it answers loopback clients only")
	timings := flag.String("timings", "", "timing preset ("+strings.Join(proxmoxsim.PresetNames(), ", ")+"): task latencies, status refresh and storage lock wait; empty keeps the config's (realistic by default)")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := proxmoxsim.DefaultConfig()
	if *configPath != "" {
		var err error
		if cfg, err = proxmoxsim.LoadConfig(*configPath); err != nil {
			return err
		}
	}
	if *timings != "" {
		t, err := proxmoxsim.Preset(*timings)
		if err != nil {
			return fmt.Errorf("--timings: %w", err)
		}
		cfg.ApplyTimings(t)
	}
	sim, err := proxmoxsim.New(cfg, proxmoxsim.WithAdmin(*admin), proxmoxsim.WithLogger(logger))
	if err != nil {
		return err
	}
	defer sim.Close()

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	srv := &http.Server{
		Handler:           sim,
		ReadHeaderTimeout: 10 * time.Second,
		// pveproxy speaks HTTP/1.1 only; an empty TLSNextProto keeps Go
		// from negotiating HTTP/2, under which error reasons would be lost.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	scheme := "http"
	if !*insecure {
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
	fmt.Printf("Proxmox VE simulator listening on %s://%s/api2/json/ (admin API %s)\n", scheme, ln.Addr(), map[bool]string{true: "enabled under /_sim/", false: "disabled"}[*admin])

	return simcmd.Serve(srv, ln)
}
