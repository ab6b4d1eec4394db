package tpmdevid

import (
	"encoding/json"
	"testing"
	"time"
)

// FuzzVerify feeds Verify arbitrary enrollments, the operator's parsing of
// what a guest sends: the JSON request body, then every TPM structure in
// it. Verify must return an error, never panic, and never accept: the
// seed is a real enrollment from swtpm, whose certification the mutations
// break. The only acceptable success is the unchanged seed.
func FuzzVerify(f *testing.F) {
	localCA := newLocalCA(f)
	_, e := enroll(f, startTPM(f, localCA))
	pool := ekPool(f, localCA)
	now := time.Now()
	seed, err := json.Marshal(e)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"ekCertificate":"","akPublic":"AAE=","devidPublic":"AAEACw==","certifyInfo":"/1RDRw==","certifySignature":"ABQACw=="}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var in Enrollment
		if err := json.Unmarshal(body, &in); err != nil {
			return
		}
		v, err := Verify(&in, pool, now)
		if err != nil {
			return
		}
		if string(in.AKPublic) != string(e.AKPublic) || string(in.DevIDPublic) != string(e.DevIDPublic) ||
			string(in.CertifyInfo) != string(e.CertifyInfo) {
			t.Fatalf("Verify accepted an enrollment that is not the seed's: %+v", v)
		}
		if _, err := v.Challenge([]byte("0123456789abcdef")); err != nil {
			t.Fatalf("Challenge of a verified enrollment: %v", err)
		}
	})
}
