//go:build spire

package spiretest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/internal/tpmdevid"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// devIDFiles are a provisioned DevID as spire-agent's tpm_devid reads it.
type devIDFiles struct {
	cert, pub, priv string
	certDER         []byte
}

// provisionDevID runs the operator's and the guest's sides of
// internal/tpmdevid against tpm, as the enroll and activate endpoints
// will: enroll, verify against the local CA, challenge, check the answer,
// and certify the DevID key with devIDCA under commonName. The
// certificate and the key's blobs are written to dir (0600).
func provisionDevID(t *testing.T, tpm *swtpm.TPM, localCA *swtpm.LocalCA, devIDCA *tpmdevid.CA, commonName, dir string) devIDFiles {
	t.Helper()
	guest, enrollment, err := tpmdevid.Enroll(tpm.Socket)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := localCA.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	ekCAs := x509.NewCertPool()
	if !ekCAs.AppendCertsFromPEM(bundle) {
		t.Fatal("the local CA's bundle holds no certificate")
	}
	now := time.Now()
	verified, err := tpmdevid.Verify(enrollment, ekCAs, now)
	if err != nil {
		t.Fatal(err)
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	challenge, err := verified.Challenge(secret)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := guest.Activate(challenge)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(answer, secret) {
		t.Fatalf("the TPM answered %x, want %x", answer, secret)
	}
	certDER, err := devIDCA.IssueDevID(verified.DevIDKey, commonName, now.Add(-time.Minute), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	pub, priv := guest.DevIDBlobs()
	files := devIDFiles{
		cert: filepath.Join(dir, "devid.pem"), pub: filepath.Join(dir, "devid.pub"), priv: filepath.Join(dir, "devid.priv"),
		certDER: certDER,
	}
	for path, content := range map[string][]byte{
		files.cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER}),
		files.pub:  pub,
		files.priv: priv,
	} {
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// TestTPMDevIDAttestation provisions a swtpm's DevID through
// internal/tpmdevid and has the real spire-agent attest with SPIRE's own
// tpm_devid attestor against the real spire-server trusting the DevID CA
// and the swtpm local CA: the agent gets the ID SPIRE derives from the
// DevID certificate, a node alias selects it by the certificate's subject
// CN, and a workload under the alias gets its X509-SVID. The same DevID
// files with another TPM do not attest: the key is bound to its TPM.
func TestTPMDevIDAttestation(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()

	localCA := swtpm.NewLocalCAForTest(t)
	tpm := swtpm.StartForTest(t, localCA)
	endorsementCAs, err := localCA.BundlePEM()
	if err != nil {
		t.Fatal(err)
	}
	devIDCA, err := tpmdevid.NewCA("HyperFleet DevID CA", 24*time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	devIDCAPEM, _, err := devIDCA.PEM()
	if err != nil {
		t.Fatal(err)
	}
	endorsementCAPath, devIDCAPath := filepath.Join(dir, "endorsement-ca.pem"), filepath.Join(dir, "devid-ca.pem")
	if err := os.WriteFile(endorsementCAPath, endorsementCAs, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(devIDCAPath, devIDCAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	server := spiretest.StartServer(t, trustDomain, spiretest.WithTPMDevIDAttestor(devIDCAPath, endorsementCAPath))

	const uid = "0b9f6c1e-tpm-devid"
	commonName := "hyperfleet." + uid
	devID := provisionDevID(t, tpm, localCA, devIDCA, commonName, dir)

	aliasPath := "/hyperfleet/node/" + uid
	workload := "/vm/ns/claim/" + uid
	err = server.CreateEntries(ctx,
		&types.Entry{
			SpiffeId:  server.ID(aliasPath),
			ParentId:  server.ID("/spire/server"),
			Selectors: []*types.Selector{{Type: "tpm_devid", Value: "subject:cn:" + commonName}},
		},
		&types.Entry{
			SpiffeId:  server.ID(workload),
			ParentId:  server.ID(aliasPath),
			Selectors: []*types.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}},
		})
	if err != nil {
		t.Fatal(err)
	}

	agent := spiretest.StartAgent(t, server, "", spiretest.AttestWithTPMDevID(spiretest.TPMDevIDAgent{
		DevicePath: tpm.Socket, CertPath: devID.cert, PubPath: devID.pub, PrivPath: devID.priv,
	}))
	waitCtx, waitCancel := context.WithTimeout(ctx, 2*time.Minute)
	svid, err := agent.WaitX509SVID(waitCtx)
	waitCancel()
	if err != nil {
		t.Fatal(err)
	}
	if want := "spiffe://" + trustDomain + workload; svid.ID.String() != want {
		t.Fatalf("X509-SVID for %s, want %s", svid.ID, want)
	}

	sum := sha1.Sum(devID.certDER)
	wantAgent := "/spire/agent/tpm_devid/" + hex.EncodeToString(sum[:])
	agents, err := server.Agents.ListAgents(ctx, &agentv1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	found := false
	for _, a := range agents.GetAgents() {
		paths = append(paths, a.GetId().GetPath())
		if a.GetId().GetPath() != wantAgent {
			continue
		}
		found = true
		var selectors []string
		for _, s := range a.GetSelectors() {
			selectors = append(selectors, s.GetType()+":"+s.GetValue())
		}
		if want := "tpm_devid:subject:cn:" + commonName; !slices.Contains(selectors, want) {
			t.Errorf("agent selectors %q, want %s among them", selectors, want)
		}
	}
	if !found {
		t.Fatalf("agents %q, want %s", paths, wantAgent)
	}

	// The same files with another TPM, trusted as much (same local CA).
	other := swtpm.StartForTest(t, localCA)
	thief := spiretest.StartAgent(t, server, "", spiretest.AttestWithTPMDevID(spiretest.TPMDevIDAgent{
		DevicePath: other.Socket, CertPath: devID.cert, PubPath: devID.pub, PrivPath: devID.priv,
	}))
	// spire-agent retries a failed attestation; its first failure is
	// enough.
	const loadFailure = "cannot load DevID key on TPM"
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(thief.Log(), loadFailure) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent on another TPM did not fail to load the DevID key within a minute; its log:\n%s", thief.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
	fetchCtx, fetchCancel := context.WithTimeout(ctx, 5*time.Second)
	stolen, err := thief.FetchX509SVID(fetchCtx)
	fetchCancel()
	if err == nil {
		t.Fatalf("an agent with the DevID files on another TPM got %s", stolen.ID)
	}
	for _, line := range strings.Split(thief.Log(), "\n") {
		if strings.Contains(line, loadFailure) {
			t.Logf("the agent on another TPM: %s", line)
			break
		}
	}
}
