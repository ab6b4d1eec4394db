package devenv

import (
	"context"
	"fmt"

	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// SetStandby sizes the world's pool's standby tier (spec.standby.size;
// 0 removes the tier): VMs booted once and suspended to disk, resumed
// per job (docs/runnerpool.md, "Standby").
func (w *World) SetStandby(ctx context.Context, size int32) error {
	var pool hfv1.RunnerPool
	if err := w.API.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: PoolName}, &pool); err != nil {
		return fmt.Errorf("devenv: read RunnerPool %s: %w", PoolName, err)
	}
	orig := pool.DeepCopy()
	if size == 0 {
		pool.Spec.Standby = nil
	} else {
		pool.Spec.Standby = &hfv1.Standby{Size: size}
	}
	if err := w.API.Client.Patch(ctx, &pool, client.MergeFrom(orig)); err != nil {
		return fmt.Errorf("devenv: size the standby tier of RunnerPool %s to %d: %w", PoolName, size, err)
	}
	return nil
}
