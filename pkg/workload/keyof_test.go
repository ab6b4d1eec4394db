package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestKeyOf pins the encoding RunnerPools' status.scopeVerification
// records: the hex SHA-256 of the value's JSON.
func TestKeyOf(t *testing.T) {
	v := struct {
		URL   string
		Token string
	}{"https://gitlab.example", "secret"}
	sum := sha256.Sum256([]byte(`{"URL":"https://gitlab.example","Token":"secret"}`))
	if got, want := KeyOf(v), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("KeyOf = %s, want %s", got, want)
	}
	v.Token = "other"
	if KeyOf(v) == hex.EncodeToString(sum[:]) {
		t.Error("KeyOf does not change with the value")
	}
}
