package controller

import (
	"context"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hyperfleet/hyperfleet/internal/secretref"
)

// errSecretMissing marks a Secret or key that does not exist; the object
// waits for it (a Secret watch wakes it) instead of retrying in a loop.
var errSecretMissing = secretref.ErrMissing

// secretValue reads one key of a Secret (secretref.Value).
func secretValue(ctx context.Context, c client.Reader, field, namespace, name, key string) ([]byte, error) {
	return secretref.Value(ctx, c, field, namespace, name, key)
}
