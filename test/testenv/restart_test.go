package testenv

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestRestartAPIServer: the API server is down after the kill, comes back
// with the same address and certificates (the client made before works
// again), keeps what etcd held, and is stopped with the environment.
func TestRestartAPIServer(t *testing.T) {
	env, err := StartWithoutCRDs()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	before := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "before"}, Data: map[string]string{"k": "v"}}
	if err := env.Client.Create(ctx, before); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 1)
	go func() { errs <- env.RestartAPIServer(ctx, 2*time.Second) }()
	// While it is down, calls fail.
	sawDown := false
	for i := 0; i < 100 && !sawDown; i++ {
		time.Sleep(20 * time.Millisecond)
		sawDown = env.Client.Get(ctx, client.ObjectKeyFromObject(before), &corev1.ConfigMap{}) != nil
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if !sawDown {
		t.Error("the API server answered throughout its restart")
	}
	got := &corev1.ConfigMap{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(before), got); err != nil || got.Data["k"] != "v" {
		t.Fatalf("after the restart: %v %v; want the ConfigMap made before", err, got.Data)
	}
	if err := env.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "after"}}); err != nil {
		t.Fatalf("create after the restart: %v", err)
	}
}
