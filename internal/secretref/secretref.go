// Package secretref reads the Secret keys HyperFleet objects reference. A
// Secret or key that does not exist is ErrMissing: the object waits for it
// (a Secret watch wakes it) instead of retrying in a loop.
package secretref

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ErrMissing marks a Secret or key that does not exist.
var ErrMissing = errors.New("secret missing")

// missingError is a readable ErrMissing.
type missingError struct{ msg string }

func (e *missingError) Error() string        { return e.msg }
func (e *missingError) Is(target error) bool { return target == ErrMissing }

// Value reads one key of a Secret. The value is returned, never logged;
// errors name the field that points at the Secret.
func Value(ctx context.Context, c client.Reader, field, namespace, name, key string) ([]byte, error) {
	var s corev1.Secret
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &missingError{fmt.Sprintf("%s: Secret %s/%s does not exist; create it or fix the reference", field, namespace, name)}
		}
		return nil, fmt.Errorf("%s: read Secret %s/%s: %w", field, namespace, name, err)
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return nil, &missingError{fmt.Sprintf("%s: Secret %s/%s has no key %q (or it is empty); add it or fix the key", field, namespace, name, key)}
	}
	return v, nil
}
