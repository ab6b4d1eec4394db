package proxmox

import (
	"context"
	"encoding/pem"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/selfsigned"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

func certPEM(srv *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}

// otherCert makes a certificate that is not the test server's (every
// httptest server shares one built-in certificate): its CA and fingerprint.
func otherCert(t *testing.T) ([]byte, string) {
	t.Helper()
	c, err := selfsigned.NewWith(selfsigned.Options{CommonName: "other-pve", Hosts: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return c.CAPEM, proxmoxsim.FormatFingerprint(c.Fingerprint())
}

// TestTLS covers fingerprint pinning in every spelling, a CA bundle,
// insecure mode (flagged) and the failures of each.
func TestTLS(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	fp := fingerprint(e.srv)
	otherPEM, otherFP := otherCert(t)

	base := e.cfg
	base.FingerprintSHA256 = ""
	ok := func(name string, mutate func(*provider.ClusterConfig), insecure bool) {
		t.Run(name, func(t *testing.T) {
			cfg := base
			mutate(&cfg)
			p, err := New(cfg, provider.Deps{Signer: e.signer, Clock: e.clock})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			info, err := p.Probe(ctx)
			if err != nil {
				t.Fatalf("Probe: %v", err)
			}
			if info.InsecureTLS != insecure {
				t.Fatalf("InsecureTLS = %v, want %v", info.InsecureTLS, insecure)
			}
		})
	}
	ok("fingerprint with colons", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = fp }, false)
	ok("fingerprint lower-case", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = strings.ToLower(fp) }, false)
	ok("fingerprint without colons", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = strings.ReplaceAll(fp, ":", "") }, false)
	ok("CA bundle", func(c *provider.ClusterConfig) { c.CABundle = certPEM(e.srv) }, false)
	ok("insecure", func(c *provider.ClusterConfig) { c.InsecureSkipVerify = true }, true)

	untrusted := func(name string, mutate func(*provider.ClusterConfig)) {
		t.Run(name, func(t *testing.T) {
			cfg := base
			mutate(&cfg)
			p, err := New(cfg, provider.Deps{Signer: e.signer, Clock: e.clock})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			_, err = p.Probe(ctx)
			if provider.Classify(err) != provider.ClassConfiguration || provider.ReasonOf(err) != "TLSVerificationFailed" {
				t.Fatalf("Probe: %s/%s %v", provider.Classify(err), provider.ReasonOf(err), err)
			}
		})
	}
	untrusted("wrong fingerprint", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = otherFP })
	untrusted("wrong CA", func(c *provider.ClusterConfig) { c.CABundle = otherPEM })
	untrusted("system roots", func(*provider.ClusterConfig) {})

	invalid := func(name, field string, mutate func(*provider.ClusterConfig)) {
		t.Run(name, func(t *testing.T) {
			cfg := base
			mutate(&cfg)
			_, err := New(cfg, provider.Deps{Signer: e.signer})
			if err == nil || !strings.Contains(err.Error(), field) || provider.Classify(err) != provider.ClassConfiguration {
				t.Fatalf("New: %v, want a Configuration error naming %s", err, field)
			}
		})
	}
	invalid("malformed fingerprint", "fingerprintSHA256", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = "AB:CD:zz" })
	invalid("short fingerprint", "fingerprintSHA256", func(c *provider.ClusterConfig) { c.FingerprintSHA256 = fp[:60] })
	invalid("bad PEM", "caBundle", func(c *provider.ClusterConfig) { c.CABundle = []byte("-----BEGIN CERTIFICATE-----\nnot base64\n") })
	invalid("two TLS modes", "at most one", func(c *provider.ClusterConfig) { c.CABundle, c.InsecureSkipVerify = certPEM(e.srv), true })
	invalid("bad endpoint", "endpoint", func(c *provider.ClusterConfig) { c.Endpoint = "pve:8006" })
	invalid("no credentials", "credentials", func(c *provider.ClusterConfig) { c.TokenID, c.TokenSecret = "", "" })
	invalid("bad token id", "tokenID", func(c *provider.ClusterConfig) { c.TokenID = "operator" })
	invalid("bad range", "vmidRange", func(c *provider.ClusterConfig) { c.VMIDStart, c.VMIDEnd = 50, 10 })
	invalid("bad tag", "tags", func(c *provider.ClusterConfig) { c.Tags = []string{"hyperfleet.io/managed-by=x"} })
}

// TestAuth covers the API token, the ticket login with CSRF on writes, and
// rejected credentials of both kinds.
func TestAuth(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	t.Run("token", func(t *testing.T) {
		if _, err := e.p.Probe(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("password", func(t *testing.T) {
		cfg := e.cfg
		cfg.TokenID, cfg.TokenSecret, cfg.Username, cfg.Password = "", "", opUser, opPassword
		obs := &recorder{}
		p, err := New(cfg, provider.Deps{Signer: e.signer, Clock: e.clock, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		// A write exercises the CSRF token: drive a VM to Running.
		spec := testSpec("runner-t", "uid-tttt")
		d := e.ensure(p, spec, provider.Progress{}, provider.PhaseRunning, 200)
		if n := obs.count("POST", "/access/ticket"); n != 1 {
			t.Fatalf("%d logins, want 1", n)
		}
		// Renewed before the 2 h lifetime: the session never lapses.
		e.advance(95 * time.Minute)
		if _, err := p.ListVMs(ctx); err != nil {
			t.Fatal(err)
		}
		if n := obs.count("POST", "/access/ticket"); n != 2 {
			t.Fatalf("%d logins after 95 minutes, want 2 (one renewal)", n)
		}
		// Long idle: the ticket expired on both sides; log in again.
		e.advance(3 * time.Hour)
		if _, err := p.SetPower(ctx, spec.Owner, d.prog.VMRef(), provider.PowerOff); err != nil {
			t.Fatalf("SetPower after 3 h idle: %v", err)
		}
		if n := obs.count("", "/access/ticket"); n < 3 {
			t.Fatalf("%d logins after the ticket expired, want 3 or more", n)
		}
		for _, c := range obs.snapshot() {
			if c.code == 401 && c.endpoint != "/access/ticket" {
				t.Fatalf("a request was rejected: %+v", c)
			}
		}
	})
	reject := func(name string, mutate func(*provider.ClusterConfig)) {
		t.Run(name, func(t *testing.T) {
			cfg := e.cfg
			mutate(&cfg)
			p, err := New(cfg, provider.Deps{Signer: e.signer, Clock: e.clock})
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Probe(ctx)
			if !errors.Is(err, provider.ErrUnauthorized) || provider.Classify(err) != provider.ClassConfiguration {
				t.Fatalf("Probe: %s %v", provider.Classify(err), err)
			}
			for _, secret := range []string{opTokenSecret, "wrong-secret", opPassword, "wrong-password"} {
				if strings.Contains(err.Error(), secret) {
					t.Fatalf("error leaks a secret: %v", err)
				}
			}
		})
	}
	reject("wrong token secret", func(c *provider.ClusterConfig) { c.TokenSecret = "wrong-secret" })
	reject("unknown token", func(c *provider.ClusterConfig) { c.TokenID = "nobody@pve!x" })
	reject("wrong password", func(c *provider.ClusterConfig) {
		c.TokenID, c.TokenSecret, c.Username, c.Password = "", "", opUser, "wrong-password"
	})
}

// TestPermissionDenied: a token without rights on VMs gets 403, reported as
// a Configuration error naming the privilege.
func TestPermissionDenied(t *testing.T) {
	e := newEnv(t, func(sim *proxmoxsim.Config, cfg *provider.ClusterConfig) {
		yes := true
		sim.Users = append(sim.Users, proxmoxsim.UserConfig{
			ID: "auditor@pve", Privileges: proxmoxsim.Privileges{"/": {"PVEAuditor"}},
			Tokens: []proxmoxsim.TokenConfig{{ID: "ro", Secret: "ro-secret", Privsep: &yes, Privileges: proxmoxsim.Privileges{"/": {"PVEAuditor"}}}},
		})
		cfg.TokenID, cfg.TokenSecret = "auditor@pve!ro", "ro-secret"
	})
	d := outcome{}
	res, err := e.p.EnsureVM(context.Background(), testSpec("runner-r", "uid-rrrr"), provider.Progress{})
	if err != nil {
		t.Fatal(err)
	}
	d.prog = res.Progress
	_, err = e.p.EnsureVM(context.Background(), testSpec("runner-r", "uid-rrrr"), d.prog)
	if !errors.Is(err, provider.ErrUnauthorized) || provider.Classify(err) != provider.ClassConfiguration || !strings.Contains(err.Error(), "VM.") {
		t.Fatalf("clone without rights: %s %v", provider.Classify(err), err)
	}
}

// TestRequestTimeout: a request the API never answers (parked on the
// simulator's clock, which the test does not advance) ends after
// RequestTimeout as a transient Unreachable error; a cancelled context ends
// it at once.
func TestRequestTimeout(t *testing.T) {
	e := newEnv(t, func(_ *proxmoxsim.Config, cfg *provider.ClusterConfig) { cfg.RequestTimeout = 200 * time.Millisecond })
	if err := e.sim.SetFaults(proxmoxsim.Faults{Classes: map[string]proxmoxsim.FaultSpec{
		"*": {SpikeRate: 1, SpikeLatency: proxmoxsim.Duration(time.Hour)},
	}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := e.p.ListVMs(context.Background())
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("ListVMs took %s with a 200ms request timeout", took)
	}
	if !errors.Is(err, provider.ErrUnreachable) || provider.Classify(err) != provider.ClassTransient {
		t.Fatalf("ListVMs: %s %v", provider.Classify(err), err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	p := e.newProvider(func() provider.ClusterConfig { c := e.cfg; c.RequestTimeout = time.Hour; return c }())
	start = time.Now()
	_, err = p.Probe(ctx)
	if took := time.Since(start); took > 5*time.Second || err == nil || provider.Classify(err) != provider.ClassTransient {
		t.Fatalf("Probe with a cancelled context: %s after %s", err, took)
	}
}
