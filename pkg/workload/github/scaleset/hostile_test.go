package scaleset_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	githubsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github"
	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/github/githubsimtest"
	"github.com/hyperfleet/hyperfleet/pkg/workload/github/scaleset"
)

// thief is a server that takes whatever a client sends it: the host a
// hostile answer of the scale-set protocol points the client at.
type thief struct {
	URL string
	mu  sync.Mutex
	got []string
}

func (th *thief) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	th.mu.Lock()
	th.got = append(th.got, r.Method+" "+r.URL.Path+" Authorization="+r.Header.Get("Authorization"))
	th.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"count": 0, "value": []}`))
}

func (th *thief) requests() []string {
	th.mu.Lock()
	defer th.mu.Unlock()
	return append([]string(nil), th.got...)
}

// startThief runs a thief over HTTPS (a certificate the client trusts,
// added to pool: the attack must not fail for want of trust) or, with
// plain, over HTTP.
func startThief(t *testing.T, pool *x509.CertPool, plain bool) *thief {
	t.Helper()
	th := &thief{}
	srv := httptest.NewUnstartedServer(th)
	if plain {
		srv.Start()
	} else {
		cert, caPEM, err := githubsim.SelfSignedCertificate("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(caPEM)
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		srv.StartTLS()
	}
	t.Cleanup(srv.Close)
	th.URL = srv.URL
	return th
}

// TestHostileAnswersDoNotCarryTokens performs the attack of a hostile or
// tampered Actions service answer: the registration exchange names a
// service URL on another host or over http, a session a message queue on
// another host, or a call is redirected to another host. The client
// refuses each without sending anything there, its tokens least of all,
// and says why (ErrUntrustedURL), without retrying.
func TestHostileAnswersDoNotCarryTokens(t *testing.T) {
	cases := []struct {
		name string
		// hostile builds the answers from the thief's URL.
		hostile func(thief string) githubsim.HostileScaleSetAnswers
		plain   bool
		// session: the attack is on the message session (the scale set
		// is created before the answers turn hostile).
		session bool
		want    string
	}{
		{name: "service URL on another host", hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{ServiceBase: u}
		}, want: "is not on 127.0.0.1:"},
		{name: "service URL over http", plain: true, hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{ServiceBase: u}
		}, want: "is not an https:// URL"},
		{name: "registration exchange redirected", hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{RedirectRegistration: u}
		}, want: "follows no redirects"},
		{name: "message queue on another host", session: true, hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{QueueBase: u}
		}, want: "messageQueueUrl"},
		{name: "message queue over http", session: true, plain: true, hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{QueueBase: u}
		}, want: "is not an https:// URL"},
		{name: "message poll redirected", session: true, hostile: func(u string) githubsim.HostileScaleSetAnswers {
			return githubsim.HostileScaleSetAnswers{RedirectQueue: u}
		}, want: "follows no redirects"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			gs := githubsimtest.Start(t, simConfig(), githubsim.WithScaleSetPollWait(time.Second))
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(gs.CAPEM)
			th := startThief(t, pool, tc.plain)
			tr := gs.Transport.Clone()
			tr.TLSClientConfig.RootCAs = pool
			c, err := scaleset.New(scaleset.Config{
				ConfigURL: gs.URL + "/octo-org", APIURL: gs.URL,
				Token:      func(context.Context) (string, error) { return testPAT, nil },
				HTTPClient: &http.Client{Transport: tr}, RetryWaitMin: 10 * time.Millisecond, RetryWaitMax: 50 * time.Millisecond,
				PollTimeout: 10 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			var ss *scaleset.ScaleSet
			if tc.session {
				if ss, err = c.EnsureScaleSet(ctx, "hyperfleet", "hf-hostile", nil); err != nil {
					t.Fatal(err)
				}
			}
			gs.Sim.SetHostileScaleSetAnswers(tc.hostile(th.URL))
			if tc.session {
				var s *scaleset.Session
				s, err = c.CreateSession(ctx, ss.ID, "hyperfleet-test")
				if err == nil {
					// The queue URL was taken: the poll is where the
					// token would go.
					_, err = s.GetMessage(ctx, 0, 1)
				}
			} else {
				_, err = c.EnsureScaleSet(ctx, "hyperfleet", "hf-hostile", nil)
			}
			if !errors.Is(err, scaleset.ErrUntrustedURL) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v; want ErrUntrustedURL saying %q", err, tc.want)
			}
			if got := th.requests(); len(got) > 0 {
				t.Errorf("the client called the hostile host: %q", got)
			}
		})
	}
}

// TestAllowedHosts: the hosts the client calls with its tokens. On
// GitHub.com those of its Actions service, over https on the default
// port; on GitHub Enterprise Server the server's own host and port.
func TestAllowedHosts(t *testing.T) {
	cases := []struct {
		api  string
		url  string
		want bool
	}{
		{"https://api.github.com", "https://pipelinesghubeus22.actions.githubusercontent.com/abc/", true},
		{"https://api.github.com", "https://broker.actions.githubusercontent.com/message?sessionId=1", true},
		{"https://api.github.com", "https://actions.githubusercontent.com/", true},
		{"https://api.github.com", "https://PIPELINES.Actions.GitHubUserContent.com:443/x", true},
		{"https://api.github.com", "http://pipelines.actions.githubusercontent.com/x", false},
		{"https://api.github.com", "https://pipelines.actions.githubusercontent.com:8443/x", false},
		{"https://api.github.com", "https://actions.githubusercontent.com.example.net/x", false},
		{"https://api.github.com", "https://evilactions.githubusercontent.com/x", false},
		{"https://api.github.com", "https://user:pw@pipelines.actions.githubusercontent.com/x", false},
		{"https://api.github.com", "https://api.github.com/_services/pipelines/", false},
		{"https://api.github.com", "//pipelines.actions.githubusercontent.com/x", false},
		{"https://ghes.example.com/api/v3", "https://ghes.example.com/_services/pipelines/", true},
		{"https://ghes.example.com/api/v3", "https://GHES.example.com:443/_services/pipelines/", true},
		{"https://ghes.example.com/api/v3", "https://ghes.example.com:8443/_services/pipelines/", false},
		{"https://ghes.example.com/api/v3", "http://ghes.example.com/_services/pipelines/", false},
		{"https://ghes.example.com/api/v3", "https://pipelines.actions.githubusercontent.com/x", false},
		{"https://ghes.example.com/api/v3", "https://ghes.example.com.evil.example/_services/", false},
		{"https://ghes.example.com:8443/api/v3", "https://ghes.example.com:8443/_services/pipelines/", true},
		{"https://ghes.example.com:8443/api/v3", "https://ghes.example.com/_services/pipelines/", false},
	}
	for _, tc := range cases {
		c, err := scaleset.New(scaleset.Config{ConfigURL: "https://github.com/octo-org", APIURL: tc.api, Token: func(context.Context) (string, error) { return "", nil }})
		if err != nil {
			t.Fatal(err)
		}
		err = scaleset.AllowedHost(c, tc.url)
		if (err == nil) != tc.want || err != nil && !errors.Is(err, scaleset.ErrUntrustedURL) {
			t.Errorf("API %s, URL %s: %v; want allowed %v", tc.api, tc.url, err, tc.want)
		}
	}
	if _, err := scaleset.New(scaleset.Config{ConfigURL: "https://github.com/octo-org", APIURL: "http://ghes.example.com/api/v3", Token: func(context.Context) (string, error) { return "", nil }}); err == nil {
		t.Error("an http:// APIURL was accepted")
	}
}
