//go:build !windows

package agent

import (
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

func testSPIFFE() *agentconfig.SPIFFE {
	return &agentconfig.SPIFFE{
		AttestationMethod: agentconfig.AttestationJoinToken,
		TrustDomain:       "example.org",
		ServerAddress:     "spire.example.org:8081",
		BrokerURL:         "https://broker.example.org",
	}
}

// TestSPIREAgentConfig: the join token is in the config file, quoted; a
// value that could end its string is refused without being shown.
func TestSPIREAgentConfig(t *testing.T) {
	t.Parallel()
	conf, err := spireAgentConfig(testSPIFFE(), nodeAttestor{joinToken: "0e7a1f6c-5b2d-4f3e-9a8b-1c2d3e4f5a6b"}, "/run/hyperfleet/spire/attest-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`join_token = "0e7a1f6c-5b2d-4f3e-9a8b-1c2d3e4f5a6b"`,
		`server_address = "spire.example.org"`,
		"server_port = 8081",
		`trust_domain = "example.org"`,
		`data_dir = "/run/hyperfleet/spire/attest-1/data"`,
		`socket_path = "/run/hyperfleet/spire/attest-1/api.sock"`,
		`trust_bundle_path = "/run/hyperfleet/spire/attest-1/bundle.pem"`,
		`NodeAttestor "join_token"`, `KeyManager "memory"`, `WorkloadAttestor "unix"`,
	} {
		if !strings.Contains(string(conf), want) {
			t.Errorf("config lacks %s:\n%s", want, conf)
		}
	}

	for _, token := range []string{"tk\"\n}\nplugins {", "tk\\en-ünicode"} {
		_, err := spireAgentConfig(testSPIFFE(), nodeAttestor{joinToken: token}, "/run/x")
		if code := exitCode(err); code != ExitBadConfig {
			t.Errorf("token %q: exit code %d (%v), want ExitBadConfig", token, code, err)
		}
		if err != nil && strings.Contains(err.Error(), "tk") {
			t.Errorf("the error shows the token: %v", err)
		}
	}
	s := testSPIFFE()
	s.ServerAddress = "spire:0"
	if _, err := spireAgentConfig(s, nodeAttestor{joinToken: "x"}, "/run/x"); err == nil || !strings.Contains(err.Error(), "spiffe.serverAddress") {
		t.Errorf("port 0: %v", err)
	}
}

// writeSVIDs writes what `spire-agent api fetch x509 -write` leaves: one
// svid.N.pem/svid.N.key pair per id.
func writeSVIDs(t *testing.T, dir string, ids ...string) {
	t.Helper()
	for i, id := range ids {
		cert, key := selfSignedSVID(t, id)
		for name, b := range map[string][]byte{"svid.%d.pem": cert, "svid.%d.key": key, "bundle.%d.pem": cert} {
			if err := os.WriteFile(filepath.Join(dir, strings.Replace(name, "%d", string(rune('0'+i)), 1)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLoadSVID: the SVID for spiffeID is picked (any one of the trust
// domain without it), and its files are gone afterwards.
func TestLoadSVID(t *testing.T) {
	t.Parallel()
	other := "spiffe://example.org/vm/ns/other/uid"
	for _, tc := range []struct {
		name, spiffeID string
		ids            []string
		want           string // "" : ExitAttestation
	}{
		{"expected", testSVIDID, []string{testSVIDID}, testSVIDID},
		{"second of two", testSVIDID, []string{other, testSVIDID}, testSVIDID},
		{"any in the trust domain", "", []string{other}, other},
		{"wrong id", testSVIDID, []string{other}, ""},
		{"wrong trust domain", "", []string{"spiffe://example.com/vm/ns/claim/uid"}, ""},
		{"none", testSVIDID, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			writeSVIDs(t, dir, tc.ids...)
			r := &spireRun{log: slog.New(slog.DiscardHandler)}
			s := testSPIFFE()
			s.SPIFFEID = tc.spiffeID
			cert, id, err := r.loadSVID(dir, s)
			switch {
			case tc.want == "" && exitCode(err) != ExitAttestation:
				t.Errorf("got %s, %v; want ExitAttestation", id, err)
			case tc.want != "" && (err != nil || id != tc.want || cert.Leaf == nil || cert.PrivateKey == nil):
				t.Errorf("got %s, %v; want %s with its key", id, err, tc.want)
			}
			if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the SVID directory is still there: %v", err)
			}
		})
	}
}

func TestSVIDID(t *testing.T) {
	t.Parallel()
	two, _ := selfSignedSVID(t, testSVIDID, "spiffe://example.org/b")
	none, _ := selfSignedSVID(t)
	https, _ := selfSignedSVID(t, "https://example.org/x")
	for name, pemBytes := range map[string][]byte{"two": two, "none": none, "https": https, "garbage": []byte("x")} {
		if id, err := svidID(pemBytes); err == nil {
			t.Errorf("%s: accepted as an SVID of %s", name, id)
		}
	}
	for id, want := range map[string]bool{
		"spiffe://example.org/vm/a": true, "spiffe://example.org": true,
		"spiffe://example.org.evil/vm": false, "spiffe://example.com/vm": false,
	} {
		if got := inTrustDomain(id, "example.org"); got != want {
			t.Errorf("inTrustDomain(%s) = %v", id, got)
		}
	}
}

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	b := &tailBuffer{max: 16}
	for _, s := range []string{"line one\n", "line two\n", "line three\n"} {
		if _, err := b.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if got := b.lastLines(1); got != "line three" {
		t.Errorf("lastLines(1) = %q", got)
	}
	if got := b.lastLines(5); got != " two\nline three" {
		t.Errorf("lastLines(5) = %q (the buffer keeps 16 bytes)", got)
	}
	if !b.containsAny([]string{"nope", "three"}) || b.containsAny([]string{"one"}) {
		t.Error("containsAny")
	}
}

// TestSPIRELogRedacted: what the agent shows of spire-agent's log and of
// the Workload API's answers never holds the join token, which spire-agent
// prints in its agent ID.
func TestSPIRELogRedacted(t *testing.T) {
	t.Parallel()
	token := "0e7a1f6c-5b2d-4f3e-9a8b-1c2d3e4f5a6b"
	r := &spireRun{token: token, out: &tailBuffer{max: 4096}}
	_, _ = r.out.Write([]byte(`level=info msg="Node attestation was successful" spiffe_id="spiffe://example.org/spire/agent/join_token/` + token + `"` + "\n"))
	for _, s := range []string{r.logTail(), r.logTailSuffix(), r.redact("answer for " + token[:12])} {
		if strings.Contains(s, token[:8]) || !strings.Contains(s, agentconfig.Redacted) {
			t.Errorf("not redacted: %s", s)
		}
	}
}
