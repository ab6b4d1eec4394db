package main

import (
	"strings"
	"testing"
	"time"
)

func TestParseWebhookSecrets(t *testing.T) {
	got, err := parseWebhookSecrets("ns/hook", map[string][]byte{
		"webhook-secret": []byte("fallback"), "owner.Octo-Org": []byte("octo"), "owner.someone": []byte("someone's"), "other": []byte("ignored"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(got.global) != "fallback" || len(got.owners) != 2 || string(got.owners["octo-org"]) != "octo" || string(got.owners["someone"]) != "someone's" {
		t.Fatalf("parsed %+v", got)
	}
	if got, err := parseWebhookSecrets("ns/hook", map[string][]byte{"owner.octo-org": []byte("octo")}); err != nil || got.global != nil || len(got.owners) != 1 {
		t.Fatalf("owner secrets only: %+v, %v", got, err)
	}
	for name, tc := range map[string]struct {
		data map[string][]byte
		says string
	}{
		"no secret at all":      {map[string][]byte{"other": []byte("x")}, `neither key "webhook-secret" nor keys owner.<owner>`},
		"empty fallback":        {map[string][]byte{"webhook-secret": nil, "owner.a": []byte("x")}, `key "webhook-secret" is empty`},
		"empty owner secret":    {map[string][]byte{"owner.a": nil}, `key "owner.a" is empty`},
		"owner key names none":  {map[string][]byte{"owner.": []byte("x")}, `key "owner." names no owner`},
		"one owner in two keys": {map[string][]byte{"owner.a": []byte("x"), "owner.A": []byte("y")}, `owner "a" has more than one key`},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := parseWebhookSecrets("ns/hook", tc.data); err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "ns/hook") {
				t.Fatalf("error %v, want one naming ns/hook and saying %q", err, tc.says)
			}
		})
	}
}

func TestCheckMaxEventAge(t *testing.T) {
	for d, ok := range map[time.Duration]bool{time.Minute: true, 15 * time.Minute: true, 16 * time.Minute: false, 0: false, -time.Second: false} {
		if err := checkMaxEventAge(d); (err == nil) != ok {
			t.Errorf("checkMaxEventAge(%s) = %v", d, err)
		} else if err != nil && !strings.Contains(err.Error(), "--webhook-max-event-age") {
			t.Errorf("the error does not name the flag: %v", err)
		}
	}
}
