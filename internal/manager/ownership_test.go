package manager

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	fakeclient "sigs.k8s.io/controller-runtime/pkg/client/fake"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/provider/fake"
)

const (
	testNamespace = "hyperfleet-system"
	testSecret    = "hyperfleet-ownership"
)

// world is an API server (a fake client) holding one HypervisorCluster
// whose hypervisor is a fake cluster.
type world struct {
	client    client.Client
	hv        *fake.Cluster
	factories map[hfv1.HypervisorProvider]provider.Factory
}

func newWorld(t *testing.T, objs ...client.Object) *world {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := hfv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ref := func(key string) *hfv1.SecretKeySelector {
		return &hfv1.SecretKeySelector{Namespace: testNamespace, Name: "pve-token", Key: key}
	}
	hc := &hfv1.HypervisorCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "pve-a"},
		Spec: hfv1.HypervisorClusterSpec{
			Provider: hfv1.ProviderProxmox, Endpoint: "https://pve.example.com:8006/api2/json",
			Credentials: hfv1.HypervisorCredentials{TokenID: ref("tokenId"), TokenSecret: ref("tokenSecret")},
		},
	}
	token := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "pve-token"},
		Data:       map[string][]byte{"tokenId": []byte("root@pam!hf"), "tokenSecret": []byte("s3cret")},
	}
	c := fakeclient.NewClientBuilder().WithScheme(scheme).WithObjects(append([]client.Object{hc, token}, objs...)...).Build()
	hv, err := fake.NewCluster(nil, fake.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	w := &world{client: c, hv: hv}
	w.factories = map[hfv1.HypervisorProvider]provider.Factory{
		hfv1.ProviderProxmox: provider.FactoryFunc(func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
			return hv.NewProvider(cfg, deps)
		}),
	}
	return w
}

func (w *world) addVM(t *testing.T, tags ...string) {
	t.Helper()
	if _, err := w.hv.AddForeignVM(fake.ForeignVM{Tags: tags}); err != nil {
		t.Fatal(err)
	}
}

func (w *world) secretExists(t *testing.T) bool {
	t.Helper()
	err := w.client.Get(t.Context(), client.ObjectKey{Namespace: testNamespace, Name: testSecret}, &corev1.Secret{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func TestMissingOwnershipSecretWithInstallVMsRefusesUnlessAllowed(t *testing.T) {
	cases := []struct {
		name       string
		operatorID string
		tags       []string
	}{
		{"VM tagged with --operator-id's tag", "prod", []string{"hyperfleet", "hf-prod"}},
		// Without --operator-id the lost Secret took the id with it: any
		// HyperFleet VM may be the install's.
		{"HyperFleet VM and no --operator-id", "", []string{"hyperfleet", "hf-0badc0de"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.addVM(t, tc.tags...)
			w.addVM(t, "unrelated")
			opts := SignerOptions{Namespace: testNamespace, Name: testSecret, OperatorID: tc.operatorID, Factories: w.factories}
			_, err := LoadOrCreateSigner(t.Context(), w.client, opts)
			if err == nil || !strings.Contains(err.Error(), AllowNewOwnershipKeyFlag) || !strings.Contains(err.Error(), "cluster pve-a has 1 VMs tagged") {
				t.Fatalf("LoadOrCreateSigner = %v; want a refusal naming the cluster, the count and %s", err, AllowNewOwnershipKeyFlag)
			}
			if w.secretExists(t) {
				t.Fatal("the refused start created an ownership Secret")
			}
			opts.AllowNewKey = true
			s, err := LoadOrCreateSigner(t.Context(), w.client, opts)
			if err != nil {
				t.Fatalf("with AllowNewKey: %v", err)
			}
			if !w.secretExists(t) || (tc.operatorID != "" && s.OperatorID() != tc.operatorID) {
				t.Errorf("with AllowNewKey: Secret exists %v, operator id %q", w.secretExists(t), s.OperatorID())
			}
		})
	}
}

func TestMissingOwnershipSecretWithoutInstallVMsCreatesKey(t *testing.T) {
	w := newWorld(t)
	w.addVM(t, "hyperfleet", "hf-other") // another install's, checked by id
	w.addVM(t)
	s, err := LoadOrCreateSigner(t.Context(), w.client, SignerOptions{Namespace: testNamespace, Name: testSecret, OperatorID: "prod", Factories: w.factories})
	if err != nil {
		t.Fatal(err)
	}
	if s.OperatorID() != "prod" || !w.secretExists(t) {
		t.Errorf("operator id %q, Secret exists %v", s.OperatorID(), w.secretExists(t))
	}
	// The next start reads the same key.
	again, err := LoadOrCreateSigner(t.Context(), w.client, SignerOptions{Namespace: testNamespace, Name: testSecret, Factories: w.factories})
	if err != nil {
		t.Fatal(err)
	}
	rec := ownership.Record{Name: "c", UID: "u", VMID: 100}
	if _, err := again.Verify(s.Block(rec), 100); err != nil {
		t.Errorf("a block signed before the restart does not verify after it: %v", err)
	}
}

func TestMissingOwnershipSecretWithUnreachableClusterRefuses(t *testing.T) {
	w := newWorld(t)
	w.factories[hfv1.ProviderProxmox] = provider.FactoryFunc(func(cfg provider.ClusterConfig, deps provider.Deps) (provider.Provider, error) {
		return nil, errors.New("connection refused")
	})
	_, err := LoadOrCreateSigner(t.Context(), w.client, SignerOptions{Namespace: testNamespace, Name: testSecret, OperatorID: "prod", Factories: w.factories})
	if err == nil || !strings.Contains(err.Error(), "cluster pve-a could not be listed (connection refused)") || !strings.Contains(err.Error(), AllowNewOwnershipKeyFlag) {
		t.Fatalf("LoadOrCreateSigner = %v; want a refusal naming the unreachable cluster and %s", err, AllowNewOwnershipKeyFlag)
	}
	if w.secretExists(t) {
		t.Fatal("the refused start created an ownership Secret")
	}
}

func TestOwnershipSecretKeyRing(t *testing.T) {
	key := func(b byte) []byte { return bytes.Repeat([]byte{b}, ownership.MinKeyLength) }
	secret := func(data map[string][]byte) *corev1.Secret {
		data[OwnershipOperatorIDField] = []byte("prod")
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: testSecret}, Data: data}
	}
	opts := func(w *world) SignerOptions {
		return SignerOptions{Namespace: testNamespace, Name: testSecret, Factories: w.factories}
	}
	before, err := LoadOrCreateSigner(t.Context(), newWorld(t, secret(map[string][]byte{OwnershipKeyField: key(1)})).client,
		SignerOptions{Namespace: testNamespace, Name: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, secret(map[string][]byte{OwnershipKeyField: key(1), "hmac-key-2": key(2), "hmac-key-10": key(10)}))
	rotated, err := LoadOrCreateSigner(t.Context(), w.client, opts(w))
	if err != nil {
		t.Fatal(err)
	}
	if got := rotated.KeyIDs(); len(got) != 3 || rotated.SigningKeyID() != 10 {
		t.Fatalf("key ids %v, signing with %d; want [0 2 10] signing with 10", got, rotated.SigningKeyID())
	}
	rec := ownership.Record{Name: "c", UID: "u", VMID: 100}
	if _, err := rotated.Verify(before.Block(rec), 100); err != nil {
		t.Errorf("a block of the first key after rotation: %v", err)
	}
	for field, want := range map[string]string{"hmac-key-x": `key "hmac-key-x"`, "hmac-key-0": `key "hmac-key-0"`, "hmac-key-02": `key "hmac-key-02"`} {
		w := newWorld(t, secret(map[string][]byte{OwnershipKeyField: key(1), field: key(3)}))
		if _, err := LoadOrCreateSigner(t.Context(), w.client, opts(w)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("field %s: %v, want an error naming it", field, err)
		}
	}
	w = newWorld(t, secret(map[string][]byte{}))
	if _, err := LoadOrCreateSigner(t.Context(), w.client, opts(w)); err == nil || !strings.Contains(err.Error(), "restore the Secret") {
		t.Errorf("Secret without keys: %v", err)
	}
}
