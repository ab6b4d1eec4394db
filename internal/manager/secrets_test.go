package manager

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// secretGets counts the Secret reads that reach the API server.
type secretGets struct {
	client.Client
	n int
}

func (c *secretGets) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if _, ok := obj.(*corev1.Secret); ok {
		c.n++
	}
	return c.Client.Get(ctx, key, obj, opts...)
}

// TestCredentialReadsOncePerVersion: a credentials Secret is read from the
// API server once per version the watch shows, and a rotation or a
// deletion is seen at the next read.
//
// Mutation: credentialReads.held returning the Secret read last without
// comparing its resource version with the watch's fails this test (the
// rotated credential is never read); no test covered the cache before.
func TestCredentialReadsOncePerVersion(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "github", UID: "u1"}, Data: map[string][]byte{"token": []byte("one")}}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
	gets := &secretGets{Client: api}
	// The fake client stands in for the metadata-only watch too: it
	// answers metadata reads with the Secret's current version.
	c := newCredentialReads(gets, api)
	key := client.ObjectKeyFromObject(secret)
	read := func() string {
		t.Helper()
		var s corev1.Secret
		if err := c.Get(ctx, key, &s); err != nil {
			t.Fatal(err)
		}
		return string(s.Data["token"])
	}
	for range 3 {
		if got := read(); got != "one" {
			t.Fatalf("token %q, want one", got)
		}
	}
	if gets.n != 1 {
		t.Fatalf("%d reads of the API server for three reads of one version, want 1", gets.n)
	}

	var cur corev1.Secret
	if err := api.Get(ctx, key, &cur); err != nil {
		t.Fatal(err)
	}
	cur.Data["token"] = []byte("two")
	if err := api.Update(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != "two" {
		t.Fatalf("after the rotation: token %q, want two", got)
	}
	read()
	if gets.n != 2 {
		t.Fatalf("%d reads of the API server after one rotation, want 2", gets.n)
	}

	if err := api.Delete(ctx, &cur); err != nil {
		t.Fatal(err)
	}
	var s corev1.Secret
	if err := c.Get(ctx, key, &s); !apierrors.IsNotFound(err) {
		t.Fatalf("after the deletion: %v, want NotFound", err)
	}
}
