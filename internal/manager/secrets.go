package manager

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConfigureSecretReads sets o so that the manager keeps no Secret contents
// in memory (docs/security.md, "What the operator can read"):
//
//   - the client reads Secrets straight from the API server (GET), so
//     only the Secrets HyperFleet objects reference are ever fetched;
//   - the only Secret informer is the controllers' metadata-only watch,
//     which wakes the objects referencing a Secret when it changes; its
//     cache keeps each Secret's namespace, name, UID and resource version,
//     nothing else: no data, and no labels or annotations either (kubectl
//     apply copies a Secret's whole content into an annotation);
//   - that watch covers namespaces only (the manager's --secret-namespaces),
//     so that the ServiceAccount needs list and watch on Secrets there and
//     nowhere else; none (nil) watches every namespace.
//
// The operator binary, the dev environment and the tests all call it on the
// options they build the manager with.
func ConfigureSecretReads(o *ctrl.Options, namespaces []string) {
	if o.Cache.ByObject == nil {
		o.Cache.ByObject = map[client.Object]cache.ByObject{}
	}
	by := cache.ByObject{Transform: secretIdentityOnly}
	if len(namespaces) > 0 {
		by.Namespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			by.Namespaces[ns] = cache.Config{}
		}
	}
	o.Cache.ByObject[&corev1.Secret{}] = by
	if o.Client.Cache == nil {
		o.Client.Cache = &client.CacheOptions{}
	}
	o.Client.Cache.DisableFor = append(o.Client.Cache.DisableFor, &corev1.Secret{})
}

// secretIdentityOnly is the Secret informers' transform: it keeps what
// mapping a change to its referrers needs and drops everything else,
// whether the informer is metadata-only or (should one ever be started)
// typed.
func secretIdentityOnly(obj any) (any, error) {
	switch o := obj.(type) {
	case *metav1.PartialObjectMetadata:
		return &metav1.PartialObjectMetadata{TypeMeta: o.TypeMeta, ObjectMeta: identityMeta(o.ObjectMeta)}, nil
	case *corev1.Secret:
		return &corev1.Secret{TypeMeta: o.TypeMeta, ObjectMeta: identityMeta(o.ObjectMeta)}, nil
	default:
		// Tombstones and anything unexpected pass through unchanged;
		// client-go does not hand tombstones to transforms.
		return obj, nil
	}
}

func identityMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
	}
}
