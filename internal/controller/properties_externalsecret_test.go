package controller_test

import (
	"context"
	"encoding/json"
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
	"sigs.k8s.io/controller-runtime/pkg/client"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
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

// externalSecretSync is one sync of the external-secrets controller in
// TestExternalSecretScenario: the Secret deleted (or not yet written), or
// written with every key but missing ones, each value new when rotated.
type externalSecretSync struct {
	deleted bool
	missing []string
	rotated bool
}

// TestExternalSecretScenario: property 23 against the real API server and
// the running operator, in fixed cases (the property itself, generated,
// is TestExternalSecretRotationProperty in cheapworld_identity_test.go):
// a template whose GitHub credentials (a PAT, or a GitHub App's three
// values) come from a Secret an external-secrets controller writes (its
// labels, data-hash annotation and ExternalSecret owner), through a
// sequence of syncs (not yet written, every key, a key missing, rotated,
// deleted). The operator follows each sync through its watch of the
// Secret, without being told: the template is Valid exactly when the
// Secret holds every key, and otherwise not Valid with reason
// SecretNotFound and a message naming the Secret, every missing key and
// the fix; no value the Secret ever held appears in the template's status,
// in events or in the operator's log.
func TestExternalSecretScenario(t *testing.T) {
	longScenario(t)
	sim := startSim(t, func(c *proxmoxsim.Config) {
		c.Latency = propertyLatency()
		c.RefreshInterval = proxmoxsim.Duration(100 * time.Millisecond)
	})
	op := startOperator(t, operatorOptions{maxRetryDelay: time.Second})
	f := newFixture(t, sim, nil)
	for _, tc := range []struct {
		name  string
		keys  []string
		syncs []externalSecretSync
	}{
		{name: "PAT", keys: []string{"gh.token"}, syncs: []externalSecretSync{
			{deleted: true}, {}, {missing: []string{"gh.token"}}, {rotated: true}, {deleted: true},
		}},
		{name: "App", keys: []string{"app-id", "installation_id", "key"}, syncs: []externalSecretSync{
			{missing: []string{"app-id", "key"}}, {}, {rotated: true}, {deleted: true}, {rotated: true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { externalSecretScenario(t, op, f, tc.keys, tc.syncs) })
	}
}

func externalSecretScenario(t *testing.T, op *operator, f *fixture, keys []string, syncs []externalSecretSync) {
	ctx := context.Background()
	secretName := "p23-gh-" + strings.ToLower(t.Name()[strings.LastIndex(t.Name(), "/")+1:])
	tmpl := f.template.DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Namespace: f.namespace, Name: secretName + "-tmpl"}
	ref := func(i int) hfv1.LocalSecretKeySelector {
		return hfv1.LocalSecretKeySelector{Name: secretName, Key: keys[i]}
	}
	if len(keys) == 3 {
		tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{App: &hfv1.GitHubAppCredentials{AppID: ref(0), InstallationID: ref(1), PrivateKey: ref(2)}}
	} else {
		tmpl.Spec.Bootstrap.GitHub.Credentials = hfv1.GitHubCredentials{PAT: ptr.To(ref(0))}
	}
	if err := env.Client.Create(ctx, tmpl); err != nil {
		t.Fatalf("template: %v", err)
	}
	secretKey := client.ObjectKey{Namespace: f.namespace, Name: secretName}
	t.Cleanup(func() {
		_ = env.Client.Delete(ctx, tmpl)
		_ = env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}})
	})
	var values []string // every value the Secret held
	version := 0
	for step, sync := range syncs {
		if sync.deleted {
			if err := env.Client.Delete(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		} else {
			if sync.rotated {
				version++
			}
			data := map[string][]byte{}
			for _, k := range keys {
				if slices.Contains(sync.missing, k) {
					continue
				}
				v := fmt.Sprintf("ext-%s-%s-v%d-Zq81xPw3", k, secretName, version)
				values = append(values, v)
				data[k] = []byte(v)
			}
			s := &corev1.Secret{}
			err := env.Client.Get(ctx, secretKey, s)
			if apierrors.IsNotFound(err) {
				s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: secretKey.Namespace, Name: secretKey.Name}}
			} else if err != nil {
				t.Fatal(err)
			}
			externalSecretMeta(s, "gh-"+secretName, fmt.Sprintf("h%d", step))
			s.Data = data
			if s.ResourceVersion == "" {
				err = env.Client.Create(ctx, s)
			} else {
				err = env.Client.Update(ctx, s)
			}
			if err != nil {
				t.Fatalf("sync %d: %v", step, err)
			}
		}
		valid := !sync.deleted && len(sync.missing) == 0
		eventually(t, 30*time.Second, fmt.Sprintf("sync %d: template Valid=%v (Secret deleted %v, keys missing %v)", step, valid, sync.deleted, sync.missing), func() error {
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
			if sync.deleted {
				if !strings.Contains(c.Message, "Secret "+f.namespace+"/"+secretName+" does not exist; create it") {
					return fmt.Errorf("the message does not name the missing Secret and the fix: %s", c.Message)
				}
				return nil
			}
			for _, k := range sync.missing {
				if !strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) || !strings.Contains(c.Message, "add it or fix the key") {
					return fmt.Errorf("the message does not name the missing key %q and the fix: %s", k, c.Message)
				}
			}
			for _, k := range keys {
				if !slices.Contains(sync.missing, k) && strings.Contains(c.Message, fmt.Sprintf("has no key %q", k)) {
					return fmt.Errorf("the message names key %q, which the Secret has: %s", k, c.Message)
				}
			}
			return nil
		})
	}
	// No value the Secret held is in the template, events or log.
	got := &hfv1.HypervisorMachineTemplate{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), got); err != nil {
		t.Fatal(err)
	}
	var events corev1.EventList
	if err := env.Client.List(ctx, &events, client.InNamespace(f.namespace)); err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(map[string]any{"template": got, "events": events.Items})
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{string(raw), op.logs.String()} {
		for _, v := range values {
			if strings.Contains(text, v) {
				t.Fatalf("the Secret's value %q is in the template, an event or the operator's log", v)
			}
		}
	}
}
