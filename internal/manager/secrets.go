package manager

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConfigureSecretReads sets o so that the manager keeps no Secret contents
// in memory (docs/security.md, "What the operator can read"):
//
//   - the client reads Secrets straight from the API server (GET), so
//     only the Secrets HyperFleet objects reference are ever fetched (the
//     CI platforms' credentials are then kept until the watch shows a new
//     version of them: credentialReads);
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

// credentialReads is the client the CI platforms' back-ends read their
// credentials Secrets through (internal/workloads.Platforms): a job's life
// read its template's credentials three to six times (its JIT
// configuration, its confirmation, its runner's removal, the pool's
// resyncs), each a GET, since the manager caches no Secret contents. It
// keeps the contents of the Secrets it read, keyed by their resource
// version, and asks the API server again only when the metadata-only
// Secret watch (ConfigureSecretReads) shows another version: once per
// rotation. What it holds is what the back-ends already hold (the
// credential they sign in with), only for Secrets a template names, never
// an informer's copy of every Secret (TestManagerCachesNoSecretContents).
// A Secret outside the watched namespaces, or not yet in the watch's
// cache, is read from the API server every time, as before.
type credentialReads struct {
	client.Client
	// versions is the manager's cache, whose Secret informer is
	// metadata-only.
	versions client.Reader

	mu   sync.Mutex
	read map[client.ObjectKey]*corev1.Secret
	// fetch lets one miss at a time go to the API server, so that the
	// claims of a burst, all reading the same new credential, read it
	// once: the others find it held when their turn comes.
	fetch sync.Mutex
}

func newCredentialReads(c client.Client, versions client.Reader) *credentialReads {
	return &credentialReads{Client: c, versions: versions, read: map[client.ObjectKey]*corev1.Secret{}}
}

// Get reads a Secret from memory when the watch shows the version read
// last; anything else goes to the client.
func (c *credentialReads) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	s, ok := obj.(*corev1.Secret)
	if !ok || len(opts) > 0 {
		return c.Client.Get(ctx, key, obj, opts...)
	}
	if held := c.held(ctx, key); held != nil {
		held.DeepCopyInto(s)
		return nil
	}
	c.fetch.Lock()
	defer c.fetch.Unlock()
	if held := c.held(ctx, key); held != nil {
		held.DeepCopyInto(s)
		return nil
	}
	if err := c.Client.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			c.mu.Lock()
			delete(c.read, key)
			c.mu.Unlock()
		}
		return err
	}
	c.mu.Lock()
	c.read[key] = s.DeepCopy()
	c.mu.Unlock()
	return nil
}

// held is the Secret read last, when the watch shows it unchanged since.
func (c *credentialReads) held(ctx context.Context, key client.ObjectKey) *corev1.Secret {
	c.mu.Lock()
	held := c.read[key]
	c.mu.Unlock()
	if held == nil {
		return nil
	}
	md := &metav1.PartialObjectMetadata{}
	md.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Secret"))
	if err := c.versions.Get(ctx, key, md); err != nil || md.ResourceVersion != held.ResourceVersion || md.UID != held.UID {
		return nil
	}
	return held
}
