package buildkitesim

import (
	"strings"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/simulator/simclock"
)

func newTestClock() *FakeClock {
	return simclock.NewFakeClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// TestWebhookSignature checks Sign and VerifySignature against a value
// computed independently (HMAC-SHA256 of "1700000000.{}" keyed "secret",
// by `printf '1700000000.{}' | openssl dgst -sha256 -hmac secret`), and
// that a changed body, another token, a replayed old delivery and a
// malformed header are refused.
func TestWebhookSignature(t *testing.T) {
	ts := time.Unix(1700000000, 0)
	body := []byte("{}")
	const want = "timestamp=1700000000,signature=" + opensslHMAC
	if got := Sign("secret", ts, body); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := VerifySignature("secret", want, body, ts.Add(time.Minute), 5*time.Minute); err != nil {
		t.Errorf("valid signature refused: %v", err)
	}
	for name, c := range map[string]struct {
		token, header, body string
		now                 time.Time
	}{
		"other body":  {"secret", want, `{"a":1}`, ts},
		"other token": {"nope", want, "{}", ts},
		"replayed":    {"secret", want, "{}", ts.Add(10 * time.Minute)},
		"no stamp":    {"secret", "signature=" + opensslHMAC, "{}", ts},
		"garbage":     {"secret", "timestamp=abc,signature=00", "{}", ts},
		"bad hex":     {"secret", strings.Replace(want, opensslHMAC[:4], "zzzz", 1), "{}", ts},
	} {
		if err := VerifySignature(c.token, c.header, []byte(c.body), c.now, 5*time.Minute); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// opensslHMAC is the HMAC named in TestWebhookSignature's comment.
const opensslHMAC = "b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
