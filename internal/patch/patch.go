// Package patch writes what one reconcile changed on one object, the one
// way every HyperFleet reconciler writes: metadata and spec in one JSON
// merge patch, status in another through the status subresource, each only
// when something in it changed, each on a copy so that the caller's object
// keeps its in-memory changes. Cluster API's util/patch is the model.
//
// Two writers may share one object's conditions (the RunnerPool controller
// and the RunnerPool resync): a merge patch replaces the whole condition
// list, so a writer that names the conditions it owns has its status patch
// built on the server's current list, with only its own conditions
// changed, under an optimistic lock retried on conflict.
//
// A status read with keys of an earlier spelling (api/v1alpha1/spelling.go:
// vmId for vmID ...) is written with the new ones at the next status write,
// whatever else it changes: the decoded object holds the value under its
// new name only, so a patch computed from it alone would never remove the
// old key, nor add the new one while the value stays the same.
package patch

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Conditioned is an object whose status carries conditions.
type Conditioned interface {
	client.Object
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
}

// Helper remembers an object as read and writes the difference.
type Helper struct {
	c client.Client
	// doc is the object as last read or written, as a JSON document.
	doc  map[string]any
	opts options
	err  error
	// gone is set once a write found the object deleted (Gone).
	gone bool
	// respell are the status keys read under an earlier spelling, until a
	// status write moved them.
	respell []hfv1.OldSpelling
}

// respelled is an object whose status may have been read with keys of an
// earlier spelling (api/v1alpha1/spelling.go).
type respelled interface {
	OldStatusSpellings() []hfv1.OldSpelling
}

type options struct {
	lock  bool
	owned []string
}

// Option changes how a Helper writes.
type Option func(*options)

// WithOptimisticLock makes the metadata and spec patch carry the object's
// resourceVersion: a merge patch replaces whole lists (finalizers), so a
// copy read from a stale cache must fail with a conflict instead of
// dropping what someone added since.
func WithOptimisticLock() Option { return func(o *options) { o.lock = true } }

// WithOwnedConditions names the condition types this writer owns; the
// others are left as the server has them. Without it the writer owns all.
func WithOwnedConditions(types ...string) Option {
	return func(o *options) { o.owned = append(o.owned, types...) }
}

// NewHelper remembers obj as read.
func NewHelper(c client.Client, obj client.Object, opts ...Option) *Helper {
	h := &Helper{c: c}
	h.doc, h.err = toDocument(obj)
	if r, ok := obj.(respelled); ok {
		h.respell = r.OldStatusSpellings()
	}
	for _, o := range opts {
		o(&h.opts)
	}
	return h
}

// Patch writes obj's metadata and spec changes, then its status changes.
// A NotFound (the object is gone) is not an error.
func (h *Helper) Patch(ctx context.Context, obj client.Object) error {
	if err := h.PatchMetadata(ctx, obj); err != nil {
		return err
	}
	return h.PatchStatus(ctx, obj)
}

// PatchMetadata writes obj's metadata and spec changes now, before the
// rest of the pass (a claim's finalizer and VM reservation must be stored
// before its clone request).
func (h *Helper) PatchMetadata(ctx context.Context, obj client.Object) error {
	after, err := h.document(obj)
	if err != nil {
		return err
	}
	data, err := mergePatch(without(h.doc, "status"), without(after, "status"))
	if err != nil || data == nil {
		return err
	}
	if h.opts.lock {
		if data, err = withResourceVersion(data, resourceVersion(h.doc)); err != nil {
			return err
		}
	}
	cp := obj.DeepCopyObject().(client.Object)
	if err := h.c.Patch(ctx, cp, client.RawPatch(types.MergePatchType, data)); err != nil {
		if apierrors.IsNotFound(err) {
			h.gone = true
			return nil
		}
		return fmt.Errorf("patch %s metadata: %w", kindOf(obj), err)
	}
	obj.SetResourceVersion(cp.GetResourceVersion())
	status := h.doc["status"]
	if h.doc, err = toDocument(obj); err != nil {
		return err
	}
	h.doc["status"] = status
	return nil
}

// Gone reports whether a write found the object deleted: the write was
// dropped without an error, and whatever it was to guard (a finalizer
// before a VM is cloned) is not in place.
func (h *Helper) Gone() bool { return h.gone }

// PatchStatus writes obj's status changes.
func (h *Helper) PatchStatus(ctx context.Context, obj client.Object) error {
	return h.patchStatus(ctx, obj, false)
}

// PatchStatusLocked writes obj's status changes now, under an optimistic
// lock on the version last read or written: a status that records
// something about to be done (a claim's VM reservation, before its clone
// request) must not be written over a newer one that a copy from a stale
// cache did not see. A conflict is an error.
func (h *Helper) PatchStatusLocked(ctx context.Context, obj client.Object) error {
	return h.patchStatus(ctx, obj, true)
}

func (h *Helper) patchStatus(ctx context.Context, obj client.Object, lock bool) error {
	after, err := h.document(obj)
	if err != nil {
		return err
	}
	data, err := mergePatch(only(h.doc, "status"), only(after, "status"))
	if err != nil {
		return err
	}
	if data, err = respell(data, after, h.respell); err != nil || data == nil {
		return err
	}
	cond, owned := obj.(Conditioned)
	switch {
	case lock:
		if data, err = withResourceVersion(data, resourceVersion(h.doc)); err == nil {
			err = h.writeStatus(ctx, obj, data)
		}
	case owned && len(h.opts.owned) > 0:
		err = h.writeOwnedStatus(ctx, cond)
	default:
		err = h.writeStatus(ctx, obj, data)
	}
	if err != nil {
		return err
	}
	h.respell = nil
	written, err := toDocument(obj)
	if err != nil {
		return err
	}
	h.doc["status"] = written["status"]
	setResourceVersion(h.doc, obj.GetResourceVersion())
	return nil
}

// document is obj as a JSON document, or the error NewHelper met.
func (h *Helper) document(obj client.Object) (map[string]any, error) {
	if h.err != nil {
		return nil, h.err
	}
	return toDocument(obj)
}

// writeStatus sends one status patch, on a copy of obj.
func (h *Helper) writeStatus(ctx context.Context, obj client.Object, data []byte) error {
	cp := obj.DeepCopyObject().(client.Object)
	if err := h.c.Status().Patch(ctx, cp, client.RawPatch(types.MergePatchType, data)); err != nil {
		if apierrors.IsNotFound(err) {
			h.gone = true
			return nil
		}
		return fmt.Errorf("patch %s status: %w", kindOf(obj), err)
	}
	obj.SetResourceVersion(cp.GetResourceVersion())
	return nil
}

// conflictBackoff paces the retries of an owned-conditions status patch
// that lost a race with the other writer (the cache catches up within
// milliseconds).
var conflictBackoff = wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 6}

// writeOwnedStatus writes obj's status with the server's current
// conditions, changed only in the types this writer owns, under an
// optimistic lock: the other status fields patch against what this writer
// read, the conditions against the server's list.
func (h *Helper) writeOwnedStatus(ctx context.Context, obj Conditioned) error {
	mine := obj.GetConditions()
	var lost error
	err := wait.ExponentialBackoffWithContext(ctx, conflictBackoff, func(ctx context.Context) (bool, error) {
		fresh := obj.DeepCopyObject().(Conditioned)
		if err := h.c.Get(ctx, client.ObjectKeyFromObject(obj), fresh); err != nil {
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			return false, fmt.Errorf("read %s before patching its status: %w", kindOf(obj), err)
		}
		want := obj.DeepCopyObject().(Conditioned)
		want.SetConditions(h.mergeConditions(fresh.GetConditions(), mine))
		base := obj.DeepCopyObject().(Conditioned)
		base.SetConditions(fresh.GetConditions())
		baseDoc, err := toDocument(base)
		if err != nil {
			return false, err
		}
		wantDoc, err := toDocument(want)
		if err != nil {
			return false, err
		}
		before := only(h.doc, "status")
		st, _ := before["status"].(map[string]any)
		st = copyMap(st)
		if bst, ok := baseDoc["status"].(map[string]any); ok {
			st["conditions"] = bst["conditions"]
		}
		data, err := mergePatch(map[string]any{"status": st}, only(wantDoc, "status"))
		if err != nil || data == nil {
			return err == nil, err
		}
		if data, err = withResourceVersion(data, fresh.GetResourceVersion()); err != nil {
			return false, err
		}
		switch err := h.writeStatus(ctx, want, data); {
		case apierrors.IsConflict(err):
			lost = err
			return false, nil
		case err != nil:
			return false, err
		}
		obj.SetConditions(want.GetConditions())
		obj.SetResourceVersion(want.GetResourceVersion())
		return true, nil
	})
	if wait.Interrupted(err) && lost != nil {
		return lost
	}
	return err
}

// mergeConditions is current with this writer's owned conditions as it
// holds them.
func (h *Helper) mergeConditions(current, mine []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(current)+len(h.opts.owned))
	out = append(out, current...)
	for _, t := range h.opts.owned {
		if c := meta.FindStatusCondition(mine, t); c != nil {
			meta.SetStatusCondition(&out, *c)
		} else {
			meta.RemoveStatusCondition(&out, t)
		}
	}
	return out
}

func without(doc map[string]any, key string) map[string]any {
	out := copyMap(doc)
	delete(out, key)
	return out
}

func only(doc map[string]any, key string) map[string]any {
	return map[string]any{key: doc[key]}
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func resourceVersion(doc map[string]any) string {
	md, _ := doc["metadata"].(map[string]any)
	rv, _ := md["resourceVersion"].(string)
	return rv
}

func setResourceVersion(doc map[string]any, rv string) {
	md, _ := doc["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		doc["metadata"] = md
	}
	md["resourceVersion"] = rv
}

func toDocument(obj client.Object) (map[string]any, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", kindOf(obj), err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("decode %s: %w", kindOf(obj), err)
	}
	return doc, nil
}

// mergePatch is the JSON merge patch from before to after; nil when they
// are equal.
func mergePatch(before, after map[string]any) ([]byte, error) {
	b, err := json.Marshal(before)
	if err != nil {
		return nil, err
	}
	a, err := json.Marshal(after)
	if err != nil {
		return nil, err
	}
	data, err := jsonpatch.CreateMergePatch(b, a)
	if err != nil {
		return nil, fmt.Errorf("compute merge patch: %w", err)
	}
	if string(data) == "{}" {
		return nil, nil
	}
	return data, nil
}

// respell adds to the merge patch data (nil: none) the moves of the keys
// in old: each old key removed, and its new key written with the value
// after holds (none when the value was cleared). An object after no longer
// holds is removed whole by the patch already.
func respell(data []byte, after map[string]any, old []hfv1.OldSpelling) ([]byte, error) {
	if len(old) == 0 {
		return data, nil
	}
	p := map[string]any{}
	if data != nil {
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, fmt.Errorf("decode merge patch: %w", err)
		}
	}
	moved := false
	for _, o := range old {
		src, ok := lookup(after, o.Path)
		if !ok {
			continue
		}
		dst, ok := descend(p, o.Path)
		if !ok {
			continue
		}
		dst[o.Old] = nil
		if v, ok := src[o.New]; ok {
			dst[o.New] = v
		}
		moved = true
	}
	if !moved {
		return data, nil
	}
	return json.Marshal(p)
}

// lookup is the object at path in doc.
func lookup(doc map[string]any, path []string) (map[string]any, bool) {
	for _, k := range path {
		next, ok := doc[k].(map[string]any)
		if !ok {
			return nil, false
		}
		doc = next
	}
	return doc, true
}

// descend is the object at path in the merge patch p, made where the patch
// leaves it unchanged; false where the patch replaces or removes it.
func descend(p map[string]any, path []string) (map[string]any, bool) {
	for _, k := range path {
		v, present := p[k]
		if !present {
			v = map[string]any{}
			p[k] = v
		}
		next, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		p = next
	}
	return p, true
}

// withResourceVersion adds metadata.resourceVersion to a merge patch: the
// API server then refuses it with a conflict if the object changed since.
func withResourceVersion(data []byte, rv string) ([]byte, error) {
	var p map[string]any
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, err
	}
	md, _ := p["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
	}
	md["resourceVersion"] = rv
	p["metadata"] = md
	return json.Marshal(p)
}

func kindOf(obj client.Object) string {
	return fmt.Sprintf("%T %s", obj, client.ObjectKeyFromObject(obj))
}
