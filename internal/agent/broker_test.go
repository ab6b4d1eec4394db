package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const testSVIDID = "spiffe://example.org/vm/ns/claim/uid"

// selfSignedSVID is a self-signed certificate with id as its URI SAN, in
// PEM, and its key: what `spire-agent api fetch x509 -write` leaves, as far
// as the broker client is concerned.
func selfSignedSVID(t *testing.T, ids ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var uris []*url.URL
	for _, id := range ids {
		u, err := url.Parse(id)
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, u)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{Organization: []string{"SPIRE"}},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth},
		URIs:         uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})
}

// brokerServer is an httptest TLS broker that requires a client
// certificate (clientAuth) and answers with handle; bad counts the calls
// that were not an empty POST with the test SVID.
type brokerServer struct {
	srv   *httptest.Server
	caPEM string
	calls atomic.Int32
	bad   atomic.Int32 // calls without the expected client certificate
}

func newBrokerServer(t *testing.T, clientAuth tls.ClientAuthType, handle func(n int, w http.ResponseWriter)) *brokerServer {
	t.Helper()
	b := &brokerServer{}
	b.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(b.calls.Add(1))
		if r.Method != http.MethodPost || r.ContentLength > 0 || len(r.TLS.PeerCertificates) == 0 ||
			len(r.TLS.PeerCertificates[0].URIs) != 1 || r.TLS.PeerCertificates[0].URIs[0].String() != testSVIDID {
			b.bad.Add(1)
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		handle(n, w)
	}))
	// The refused handshakes are the point of some cases, not noise.
	b.srv.Config.ErrorLog = stdlog.New(io.Discard, "", 0)
	b.srv.TLS = &tls.Config{ClientAuth: clientAuth}
	if clientAuth == tls.RequireAndVerifyClientCert {
		b.srv.TLS.ClientCAs = x509.NewCertPool() // trusts no client
	}
	b.srv.StartTLS()
	t.Cleanup(b.srv.Close)
	b.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b.srv.Certificate().Raw}))
	return b
}

func jsonCredential(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, body)
}

// brokerCredentialFor runs the broker client against b with timeout as the
// deadline, returning the credential, the log and the error.
func brokerCredentialFor(t *testing.T, brokerURL, caPEM string, timeout time.Duration) (Credential, string, error) {
	t.Helper()
	certPEM, keyPEM := selfSignedSVID(t, testSVIDID)
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newBrokerClient(brokerURL, caPEM, cert, "hyperfleet-agent/test", nil)
	if err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	c.log = slog.New(slog.NewTextHandler(log, nil))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cred, err := c.credential(ctx)
	return cred, log.String(), err
}

func TestBrokerClient(t *testing.T) {
	t.Parallel()
	const jit = "JIT-SECRET-FROM-BROKER-0123456789"
	okBody := `{"method":"jit-config","jitConfig":"` + jit + `","expiresAt":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `"}`
	for _, tc := range []struct {
		name       string
		clientAuth tls.ClientAuthType
		handle     func(n int, w http.ResponseWriter) bool // false: hand out the credential
		timeout    time.Duration
		untrusted  bool // no brokerCA: the system roots do not know httptest's CA
		wantCode   int
		wantCalls  int32 // 0: any
		wantErr    []string
		maxElapsed time.Duration
	}{
		{name: "ok", handle: func(int, http.ResponseWriter) bool { return false }, wantCode: ExitOK, wantCalls: 1},
		{name: "refused", handle: func(_ int, w http.ResponseWriter) bool {
			w.WriteHeader(http.StatusForbidden)
			jsonCredential(w, `{"reason":"ClaimReleased","message":"the claim was released\nforged line"}`)
			return true
		}, wantCode: ExitBrokerRefused, wantCalls: 1, wantErr: []string{"403 Forbidden", "reason ClaimReleased: the claim was released forged line"}},
		{name: "server error without JSON", handle: func(_ int, w http.ResponseWriter) bool {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, "<html>oops</html>")
			return true
		}, wantCode: ExitBrokerRefused, wantCalls: 1, wantErr: []string{"500 Internal Server Error"}},
		{name: "busy then ok", handle: func(n int, w http.ResponseWriter) bool {
			if n < 3 {
				w.Header().Set("Retry-After", "1")
				w.WriteHeader([]int{http.StatusServiceUnavailable, http.StatusTooManyRequests}[n-1])
				return true
			}
			return false
		}, wantCode: ExitOK, wantCalls: 3},
		{name: "busy past the deadline", handle: func(_ int, w http.ResponseWriter) bool {
			w.WriteHeader(http.StatusServiceUnavailable)
			return true
		}, timeout: 2500 * time.Millisecond, wantCode: ExitBrokerUnavailable, wantErr: []string{"before the deadline", "503"}, maxElapsed: 10 * time.Second},
		{name: "retry after past the deadline", handle: func(_ int, w http.ResponseWriter) bool {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}, wantCode: ExitBrokerUnavailable, wantCalls: 1, wantErr: []string{"429"}, maxElapsed: 5 * time.Second},
		{name: "not JSON", handle: func(_ int, w http.ResponseWriter) bool {
			fmt.Fprint(w, jit+"}")
			return true
		}, wantCode: ExitBrokerRefused, wantCalls: 1, wantErr: []string{"not JSON"}},
		{name: "no credential", handle: func(_ int, w http.ResponseWriter) bool {
			jsonCredential(w, `{"method":"runner-token","registrationToken":"`+jit+`"}`)
			return true
		}, wantCode: ExitBrokerRefused, wantErr: []string{"without a token or registration URL"}},
		{name: "http registration URL", handle: func(_ int, w http.ResponseWriter) bool {
			jsonCredential(w, `{"method":"runner-token","registrationToken":"`+jit+`","registrationURL":"http://github.com/o"}`)
			return true
		}, wantCode: ExitBrokerRefused, wantErr: []string{"https://"}},
		{name: "expired", handle: func(_ int, w http.ResponseWriter) bool {
			jsonCredential(w, `{"method":"jit-config","jitConfig":"`+jit+`","expiresAt":"2020-01-01T00:00:00Z"}`)
			return true
		}, wantCode: ExitExpired, wantErr: []string{"expired at 2020-01-01T00:00:00Z"}},
		{name: "too large", handle: func(_ int, w http.ResponseWriter) bool {
			fmt.Fprint(w, `{"method":"jit-config","jitConfig":"`+strings.Repeat("x", maxBrokerResponse)+`"}`)
			return true
		}, wantCode: ExitBrokerRefused, wantErr: []string{"larger than 64 KiB"}},
		{name: "untrusted broker", handle: func(int, http.ResponseWriter) bool { return false }, untrusted: true,
			wantCode: ExitBrokerUnavailable, wantErr: []string{"certificate is not trusted", "spiffe.brokerCA"}, maxElapsed: 5 * time.Second},
		{name: "SVID rejected", clientAuth: tls.RequireAndVerifyClientCert, handle: func(int, http.ResponseWriter) bool { return false },
			wantCode: ExitBrokerRefused, wantErr: []string{"refused the TLS handshake"}, maxElapsed: 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clientAuth := tc.clientAuth
			if clientAuth == 0 {
				clientAuth = tls.RequireAnyClientCert
			}
			handle := tc.handle
			b := newBrokerServer(t, clientAuth, func(n int, w http.ResponseWriter) {
				if !handle(n, w) {
					jsonCredential(w, okBody)
				}
			})
			ca := b.caPEM
			if tc.untrusted {
				ca = ""
			}
			timeout := tc.timeout
			if timeout == 0 {
				timeout = time.Minute
			}
			start := time.Now()
			cred, log, err := brokerCredentialFor(t, b.srv.URL+"/v1/credential", ca, timeout)
			if code := exitCode(err); code != tc.wantCode {
				t.Fatalf("exit code %d (%v), want %d\n%s", code, err, tc.wantCode, log)
			}
			if tc.maxElapsed > 0 && time.Since(start) > tc.maxElapsed {
				t.Errorf("took %s, want at most %s", time.Since(start), tc.maxElapsed)
			}
			if tc.wantCalls != 0 && b.calls.Load() != tc.wantCalls {
				t.Errorf("broker called %d times, want %d", b.calls.Load(), tc.wantCalls)
			}
			if n := b.bad.Load(); n != 0 {
				t.Errorf("%d calls were not an empty POST with the SVID as client certificate", n)
			}
			for _, w := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v lacks %q", err, w)
				}
			}
			if err == nil && (cred.Method != "jit-config" || cred.JITConfig != jit) {
				t.Errorf("credential %#v, want the broker's", cred)
			}
			for what, s := range map[string]string{"log": log, "error": fmt.Sprint(err)} {
				if strings.Contains(s, jit[:16]) {
					t.Errorf("the credential is in the %s: %s", what, s)
				}
			}
		})
	}
}

// TestBrokerUnreachable: a broker that does not answer is retried until
// the deadline, then ExitBrokerUnavailable.
func TestBrokerUnreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	addr := srv.URL
	srv.Close()
	start := time.Now()
	_, log, err := brokerCredentialFor(t, addr, "", 2*time.Second)
	if code := exitCode(err); code != ExitBrokerUnavailable {
		t.Fatalf("exit code %d (%v), want ExitBrokerUnavailable\n%s", code, err, log)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("took %s", elapsed)
	}
	if !strings.Contains(log, "trying again") {
		t.Errorf("no retry logged:\n%s", log)
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]time.Duration{"": 0, "3": 3 * time.Second, " 7 ": 7 * time.Second, "-1": 0, "soon": 0,
		time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat): 0} {
		if got := retryAfter(h); got != want {
			t.Errorf("retryAfter(%q) = %s, want %s", h, got, want)
		}
	}
	if got := retryAfter(time.Now().Add(time.Minute).UTC().Format(http.TimeFormat)); got < 50*time.Second || got > time.Minute {
		t.Errorf("retryAfter(in a minute) = %s", got)
	}
}
