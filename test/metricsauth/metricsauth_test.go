// Package metricsauth checks the manager's secure metrics endpoint against
// the real API server: only a caller whose token authenticates and who may
// get the non-resource URL /metrics reads the metrics.
package metricsauth

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/hyperfleet/hyperfleet/internal/manager"
	"github.com/hyperfleet/hyperfleet/test/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) { os.Exit(testenv.Run(m, &env)) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// token issues a short-lived token of a new ServiceAccount (TokenRequest).
func token(t *testing.T, cs *kubernetes.Clientset, ns, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s: %v", name, err)
	}
	return tr.Status.Token
}

// TestSecureMetrics: without a token 401, with a token not allowed to get
// /metrics 403, with the reader role 200 and the metrics; plain HTTP gets
// no metrics at all.
func TestSecureMetrics(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ns := "metrics-auth"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the Helm chart's hyperfleet-metrics-reader ClusterRole grants.
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-auth-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-auth-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-auth-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "scraper"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scraper, nobody := token(t, cs, ns, "scraper"), token(t, cs, ns, "nobody")

	addr := freeAddr(t)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                manager.MetricsOptions(addr, true, ""),
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	}()

	// The certificate is self-signed at start: this test is about who may
	// read, not about the certificate.
	httpc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // see above
	get := func(tok string) (int, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := httpc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	var code int
	var body string
	deadline := time.Now().Add(time.Minute)
	for {
		if code, body, err = get(scraper); err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reader never got the metrics: %d %q %v", code, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !strings.Contains(body, "controller_runtime_") {
		t.Errorf("the reader's scrape has no controller-runtime metrics:\n%.500s", body)
	}
	for _, tc := range []struct {
		who, tok string
		want     int
	}{
		{"no token", "", http.StatusUnauthorized},
		// controller-runtime answers 500 "Authentication failed" when the
		// TokenReview reports an error for a token that is no JWT at
		// all; what matters is that nothing is served.
		{"a made-up token", "not-a-token", 0},
		{"a ServiceAccount without the reader role", nobody, http.StatusForbidden},
	} {
		code, body, err := get(tc.tok)
		refused := code >= 400 && (tc.want == 0 || code == tc.want)
		if err != nil || !refused || strings.Contains(body, "controller_runtime_") {
			t.Errorf("%s: %d (%v) %q, want %d and no metrics", tc.who, code, err, body, tc.want)
		}
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(fmt.Sprintf("http://%s/metrics", addr))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "controller_runtime_") {
			t.Error("plain HTTP served the metrics")
		}
	}
}
