package workload

import "testing"

// TestWebhookSecretsSecretFor: an owner with its own secret is verified
// with it alone, whatever the case of its key; any other owner, and a
// delivery that names none, with the fallback.
func TestWebhookSecretsSecretFor(t *testing.T) {
	w := WebhookSecrets{Secret: []byte("shared"), OwnerSecrets: map[string][]byte{"Acme": []byte("acme's")}}
	for _, tc := range []struct {
		owner, want string
		own         bool
	}{
		{"acme", "acme's", true},
		{"ACME", "acme's", true},
		{"other", "shared", false},
		{"", "shared", false},
	} {
		got, own := w.SecretFor(tc.owner)
		if string(got) != tc.want || own != tc.own {
			t.Errorf("SecretFor(%q) = %q, %v; want %q, %v", tc.owner, got, own, tc.want, tc.own)
		}
	}
	if got, own := (WebhookSecrets{OwnerSecrets: w.OwnerSecrets}).SecretFor("other"); got != nil || own {
		t.Errorf("SecretFor of an unlisted owner without a fallback = %q, %v; want none", got, own)
	}
}
