package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/mtlsproxy"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// TestClusterClientCertificate: a cluster whose Proxmox API sits behind a
// real nginx that requires client certificates (ssl_verify_client on)
// says what is wrong at each step of getting its spec.credentials.clientCert
// right: the Secret missing (SecretNotFound), a certificate the proxy does
// not trust (ClientCertificateRefused), a key that is not the
// certificate's (InvalidClientCertificate); with the right one it is Ready,
// and a rotated Secret is presented on the next connection without a
// restart.
func TestClusterClientCertificate(t *testing.T) {
	sim := startSim(t, nil)
	ca := mtlsproxy.NewCA(t, "hyperfleet operators")
	proxy := mtlsproxy.Start(t, mtlsproxy.Options{Upstream: strings.TrimSuffix(sim.url, "/api2/json"), ClientCA: ca.PEM})
	startOperator(t, operatorOptions{})
	ctx := context.Background()
	secretKey := client.ObjectKey{Namespace: secretNamespace, Name: "mtls-" + strings.ToLower(t.Name())}
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.Endpoint = proxy.URL + "/api2/json"
		c.Spec.TLS = &hfv1.HypervisorTLS{FingerprintSHA256: proxmoxsim.FormatFingerprint(proxy.ServerFingerprint)}
		c.Spec.Credentials.ClientCert = &hfv1.ClientCertificateSelector{Namespace: secretKey.Namespace, Name: secretKey.Name}
	})
	waitConnected := func(status metav1.ConditionStatus, reason hfv1.ConditionReason, text string) {
		t.Helper()
		eventually(t, time.Minute, fmt.Sprintf("Connected %s (%s) saying %q", status, reason, text), func() error {
			c := &hfv1.HypervisorCluster{}
			if err := env.Client.Get(ctx, client.ObjectKeyFromObject(f.cluster), c); err != nil {
				return err
			}
			cond := hfv1.FindCondition(c.Status.Conditions, hfv1.HypervisorClusterConnectedCondition)
			if cond == nil || cond.Status != status || (reason != "" && !hfv1.HasReason(cond, reason)) || !strings.Contains(cond.Message, text) {
				return fmt.Errorf("Connected = %+v", cond)
			}
			return nil
		})
	}
	setSecret := func(certPEM, keyPEM []byte) {
		t.Helper()
		s := &corev1.Secret{}
		err := env.Client.Get(ctx, secretKey, s)
		if err != nil {
			s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}, Type: corev1.SecretTypeTLS,
				Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
			if err := env.Client.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), s) })
			return
		}
		s.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
		if err := env.Client.Update(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	waitConnected(metav1.ConditionFalse, hfv1.SecretNotFoundReason, "spec.credentials.clientCert.certificateKey: Secret "+secretKey.String()+" does not exist")

	stranger := mtlsproxy.NewCA(t, "someone else").Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet"})
	setSecret(stranger.CertPEM, stranger.KeyPEM)
	waitConnected(metav1.ConditionFalse, hfv1.ClientCertificateRefusedReason, "The SSL certificate error")

	right := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet"})
	setSecret(right.CertPEM, stranger.KeyPEM)
	waitConnected(metav1.ConditionFalse, hfv1.InvalidClientCertificateReason, "private key does not match public key")

	setSecret(right.CertPEM, right.KeyPEM)
	waitConnected(metav1.ConditionTrue, "", "")
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)

	// Rotation: the next connection presents the new certificate, and the
	// old one is not presented after it (the provider is rebuilt).
	rotated := ca.Issue(t, mtlsproxy.CertOptions{CommonName: "hyperfleet"})
	seen := len(proxy.Requests(t))
	setSecret(rotated.CertPEM, rotated.KeyPEM)
	eventually(t, time.Minute, "a request with the rotated certificate", func() error {
		reqs := proxy.Requests(t)
		for _, r := range reqs[seen:] {
			if r.Serial == rotated.Serial && r.Verify == "SUCCESS" {
				return nil
			}
		}
		return fmt.Errorf("%d requests since the rotation, none with certificate %s", len(reqs)-seen, rotated.Serial)
	})
	// A request sent with the old provider just before it was replaced
	// may end after the first one with the new certificate; a few polls
	// later every request presents the new one.
	settled := len(proxy.Requests(t))
	time.Sleep(3 * time.Second)
	later := proxy.Requests(t)[settled:]
	if len(later) == 0 {
		t.Fatal("no request through the proxy in the 3 s after the rotation settled (the cluster polls every second)")
	}
	for _, r := range later {
		if r.Serial != rotated.Serial || r.Verify != "SUCCESS" {
			t.Fatalf("a request after the rotation presented %s (%s), want the rotated %s: %s", r.Serial, r.Verify, rotated.Serial, r.Line)
		}
	}
	waitConnected(metav1.ConditionTrue, "", "")
}
