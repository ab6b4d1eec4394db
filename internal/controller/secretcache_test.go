package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// TestManagerCachesNoSecretContents: the manager reads the Secrets its
// objects reference straight from the API server and caches, for every
// Secret, only its namespace and name (for the watch that wakes the
// referrers): no data, no labels, no annotations, whether the cache is
// asked for metadata or for a typed Secret.
func TestManagerCachesNoSecretContents(t *testing.T) {
	sim := startSim(t, nil)
	op := startOperator(t, operatorOptions{})
	f := newFixture(t, sim, nil)
	// Connected: the referenced token Secret was read (uncached).
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)

	const material = "hunter2-unrelated-secret-material"
	unrelated := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: f.namespace, Name: "someone-elses",
			Labels: map[string]string{"team": "payments"},
			// What kubectl apply leaves on every Secret it writes.
			Annotations: map[string]string{"kubectl.kubernetes.io/last-applied-configuration": `{"data":{"password":"` + material + `"}}`},
		},
		StringData: map[string]string{"password": material},
	}
	f.create(unrelated)
	referenced := client.ObjectKey{Namespace: secretNamespace, Name: f.cluster.Spec.Credentials.TokenSecret.Name}
	ctx := context.Background()

	for _, key := range []client.ObjectKey{client.ObjectKeyFromObject(unrelated), referenced} {
		md := &metav1.PartialObjectMetadata{}
		md.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
		eventually(t, 30*time.Second, "Secret "+key.String()+" in the metadata cache", func() error {
			return op.cache.Get(ctx, key, md)
		})
		if len(md.Labels)+len(md.Annotations)+len(md.ManagedFields) != 0 {
			t.Errorf("cached metadata of Secret %s keeps labels %v, annotations %v, %d managed fields; want namespace and name only",
				key, md.Labels, md.Annotations, len(md.ManagedFields))
		}
		// A typed read of the cache (which would start a typed informer)
		// holds no contents either.
		var typed corev1.Secret
		if err := op.cache.Get(ctx, key, &typed); err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("typed cache read of %s: %v", key, err)
		}
		if len(typed.Data)+len(typed.StringData)+len(typed.Annotations) != 0 || strings.Contains(fmt.Sprint(typed), material) {
			t.Errorf("the cache holds the contents of Secret %s: %d data keys, annotations %v", key, len(typed.Data), typed.Annotations)
		}
	}
}

// TestSecretCreationWakesCluster: a cluster waiting for its Secret (next
// retry in 5 minutes) connects as soon as the Secret is created: the
// metadata-only Secret watch still maps Secrets to their referrers.
func TestSecretCreationWakesCluster(t *testing.T) {
	sim := startSim(t, nil)
	startOperator(t, operatorOptions{})
	f := newFixture(t, sim, func(c *hfv1.HypervisorCluster) {
		c.Spec.Credentials.TokenSecret.Name = "created-later"
	})
	eventually(t, 30*time.Second, "cluster waiting for its Secret", func() error {
		var c hfv1.HypervisorCluster
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(f.cluster), &c); err != nil {
			return err
		}
		if cond := hfv1.FindCondition(c.Status.Conditions, hfv1.ReadyCondition); cond == nil || cond.Reason != string(hfv1.SecretNotFoundReason) {
			return fmt.Errorf("Ready = %+v", cond)
		}
		return nil
	})
	f.create(&corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: "created-later"},
		StringData: map[string]string{"secret": simTokenSecret},
	})
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretNamespace, Name: "created-later"}})
	})
	waitClusterReady(t, f.cluster, metav1.ConditionTrue)
}
