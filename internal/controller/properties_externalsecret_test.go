package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"pgregory.net/rapid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
)

// externalSecretMeta is what the external-secrets controller puts on a
// Secret it writes for an ExternalSecret: its labels, its annotation with
// the data's hash, and the ExternalSecret as controlling owner.
func externalSecretMeta(s *corev1.Secret, owner string, hash string) {
	s.Labels = map[string]string{
		"reconcile.external-secrets.io/created-by": owner,
		"reconcile.external-secrets.io/managed":    "true",
	}
	s.Annotations = map[string]string{"reconcile.external-secrets.io/data-hash": hash}
	s.OwnerReferences = []metav1.OwnerReference{{
		APIVersion: "external-secrets.io/v1beta1", Kind: "ExternalSecret", Name: owner,
		UID: types.UID("00000000-0000-4000-8000-" + fmt.Sprintf("%012d", len(owner))), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
}

// Feature: hyperfleet-operator, Property 23: External Secret Integration
//
// TestExternalSecretProperty: for a template whose GitHub credentials (a
// PAT, or a GitHub App's id, installation id and private key, under
// generated key names) come from a Secret an external-secrets controller
// writes (its labels, data-hash annotation and ExternalSecret owner), over
// generated sequences of syncs (the Secret not yet written, written with
// every key, with keys missing, rotated to new values, deleted), the
// operator follows each sync without being told: the template is Valid
// exactly when the Secret holds every key, and otherwise not Valid with
// reason SecretNotFound and a message naming the Secret, every missing key
// and the fix; no value the Secret ever held appears in the template's
// status, in events or in the operator's log.
func TestExternalSecretProperty(t *testing.T) {
	longScenario(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	f := newFixture(t, sim, nil)
	ctx := context.Background()
	n := 0
	proptest.Check(t, proptest.Minimum, func(rt *rapid.T) {
		n++
		app := rapid.Bool().Draw(rt, "GitHub App")
		keyName := rapid.StringMatching(`[a-z][a-z0-9_.-]{0,10}`)
		var keys []string
		if app {
			keys = rapid.SliceOfNDistinct(keyName, 3, 3, func(s string) string { return s }).Draw(rt, "App keys")
		} else {
			keys = []string{keyName.Draw(rt, "PAT key")}
		}
		secretName := fmt.Sprintf("p23-gh-%d", n)
		tmpl := f.template.DeepCopy()
		tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: fmt.Sprintf("p23-%d", n)}
		ref := func(i int) hfv1.LocalSecretKeySelector {
			return hfv1.LocalSecretKeySelector{Name: secretName, Key: keys[i]}
		}
		if app {
			tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{AppID: ref(0), InstallationID: ref(1), PrivateKey: ref(2)}}
		} else {
			tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{PAT: ptr.To(ref(0))}
		}
		if err := env.Client.Create(ctx, tmpl); err != nil {
			rt.Fatalf("template: %v", err)
		}
		secretKey := client.ObjectKey{Namespace: f.namespace, Name: secretName}
		defer func() {
			_ = env.Client.Delete(ctx, tmpl)
			_ = env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}})
		}()
		var values []string // every value the Secret held
		for step := range rapid.IntRange(1, 5).Draw(rt, "syncs") {
			// A sync: the Secret deleted (or not yet written), or written
			// with each key present (a new value when rotated) or missing.
			deleted := rapid.IntRange(0, 4).Draw(rt, "deleted") == 0
			var missing []string
			if deleted {
				if err := env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}}); err != nil && !apierrors.IsNotFound(err) {
					rt.Fatal(err)
				}
			} else {
				data := map[string][]byte{}
				for _, k := range keys {
					if rapid.IntRange(0, 3).Draw(rt, "key missing") == 0 {
						missing = append(missing, k)
						continue
					}
					v := fmt.Sprintf("ext-%s-%d-%d-%s", k, n, step, rapid.StringMatching(`[A-Za-z0-9]{12}`).Draw(rt, "value"))
					values = append(values, v)
					data[k] = []byte(v)
				}
				s := &corev1.Secret{}
				err := env.Client.Get(ctx, secretKey, s)
				if apierrors.IsNotFound(err) {
					s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}}
				} else if err != nil {
					rt.Fatal(err)
				}
				externalSecretMeta(s, "gh-"+secretName, fmt.Sprintf("h%d-%d", n, step))
				s.Data = data
				if s.ResourceVersion == "" {
					err = env.Client.Create(ctx, s)
				} else {
					err = env.Client.Update(ctx, s)
				}
				if err != nil {
					rt.Fatalf("sync %d: %v", step, err)
				}
			}
			valid := !deleted && len(missing) == 0
			within(rt, 30*time.Second, fmt.Sprintf("sync %d: template Valid=%v (Secret deleted %v, keys missing %v)", step, valid, deleted, missing), func() error {
				got := &hfv1.HypervisorMachineTemplate{}
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
					return err
				}
				c := hfv1.FindCondition(got.Status.Conditions, hfv1.HypervisorMachineTemplateValidCondition)
				if c == nil {
					return fmt.Errorf("no Valid condition")
				}
				if valid {
					if c.Status != metav1.ConditionTrue {
						return fmt.Errorf("Valid %s %s: %s", c.Status, c.Reason, c.Message)
					}
					return nil
				}
				if c.Status != metav1.ConditionFalse || c.Reason != string(hfv1.SecretNotFoundReason) {
					return fmt.Errorf("Valid %s %s: %s", c.Status, c.Reason, c.Message)
				}
				if deleted {
					if !strings.Contains(c.Message, "Secret "+f.namespace+"/"+secretName+" does not exist; create it") {
						return fmt.Errorf("the message does not name the missing Secret and the fix: %s", c.Message)
					}
					return nil
				}
				for _, k := range missing {
					if !strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) || !strings.Contains(c.Message, "add it or fix the key") {
						return fmt.Errorf("the message does not name the missing key %q and the fix: %s", k, c.Message)
					}
				}
				for _, k := range keys {
					if !slices.Contains(missing, k) && strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) {
						return fmt.Errorf("the message names key %q, which the Secret has: %s", k, c.Message)
					}
				}
				return nil
			})
		}
		// No value the Secret held is in the template, events or log.
		got := &hfv1.HypervisorMachineTemplate{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
			rt.Fatal(err)
		}
		var events corev1.EventList
		if err := env.Client.List(ctx, &events, client.InNamespace(f.namespace)); err != nil {
			rt.Fatal(err)
		}
		places := map[string]string{"the template": mustJSON(rt, got), "events": mustJSON(rt, events.Items), "the operator's log": op.logs.String()}
		for where, text := range places {
			for _, v := range values {
				if strings.Contains(text, v) {
					rt.Fatalf("the Secret's value %q is in %s", v, where)
				}
			}
		}
	})
}
