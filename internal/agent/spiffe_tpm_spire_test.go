//go:build spire && !windows

package agent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/testworld/swtpm"
	"github.com/hyperfleet/hyperfleet/test/spiretest"
)

// TestBrokerSourceTPMSPIRE runs attestationMethod tpm end to end with the
// real things: a swtpm with an EK certificate from its local CA, the
// operator's enrollment endpoints (tpmOperator, on tpmdevid's operator
// half) and the credential broker on one host as the agent server serves
// them, a real spire-server with the tpm_devid node attestor trusting the
// operator's DevID CA and the local CA, and the real spire-agent the agent
// starts with the DevID it enrolled. The VM's node alias selects the DevID
// certificate's subject CN, its workload entry the agent's uid; the agent
// must reach the broker with that workload's X509-SVID and its broker
// proof, and leave nothing behind.
func TestBrokerSourceTPMSPIRE(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	localCA := swtpm.NewLocalCAForTest(t)
	tpm, ekBundle := testTPM(t, localCA)
	const enrollProof = "enrollment-proof-tpm"
	op := newTPMOperator(t, ekBundle, enrollProof, func(o *tpmOperator) { o.busyFirst = true })

	dir := t.TempDir()
	devIDCAPath, endorsementCAPath := filepath.Join(dir, "devid-ca.pem"), filepath.Join(dir, "endorsement-ca.pem")
	for p, b := range map[string][]byte{devIDCAPath: op.devIDCAPEM(), endorsementCAPath: ekBundle} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	server := spiretest.StartServer(t, spireTrustDomain, spiretest.WithTPMDevIDAttestor(devIDCAPath, endorsementCAPath))
	w := &spireWorld{server: server, bin: filepath.Join(spiretest.SpireDir(t), "spire-agent")}
	bundle, err := x509bundle.Parse(spiffeid.RequireTrustDomainFromString(spireTrustDomain), server.Bundle)
	if err != nil {
		t.Fatalf("parsing the server's bundle: %v", err)
	}
	w.broker = newTestBroker(t, bundle)

	// The agent server: the TPM endpoints (no client certificate yet) and
	// the broker (the X509-SVID as client certificate) on one host.
	front := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/tpm/") {
			op.ServeHTTP(rw, r)
			return
		}
		w.broker.srv.Config.Handler.ServeHTTP(rw, r)
	}))
	front.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	front.StartTLS()
	t.Cleanup(front.Close)

	// vmEntries registers the VM of uid as the operator would: a node
	// alias for its DevID's subject CN, and its workload under it.
	vmEntries := func(uid string) (id string) {
		t.Helper()
		id = "spiffe://" + spireTrustDomain + "/vm/ns/tpm/" + uid
		alias := "/hyperfleet/node/ns/tpm/" + uid
		if err := server.CreateEntries(ctx,
			&types.Entry{Id: "hyperfleet.node." + uid, SpiffeId: server.ID(alias), ParentId: server.ID("/spire/server"),
				Selectors: []*types.Selector{{Type: "tpm_devid", Value: "subject:cn:" + devIDCommonName(id)}}},
			&types.Entry{Id: "hyperfleet." + uid, SpiffeId: server.ID("/vm/ns/tpm/" + uid), ParentId: server.ID(alias),
				Selectors: []*types.Selector{{Type: "unix", Value: fmt.Sprintf("uid:%d", os.Getuid())}}},
		); err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := vmEntries("4f1c2d3e-tpm")

	var secrets []byte
	log := &syncBuffer{}
	src := tpmSource(t, tpm, op, log)
	src.SPIFFE.SPIFFEID = id
	src.SPIFFE.TrustDomain = spireTrustDomain
	src.SPIFFE.TrustBundle = string(server.Bundle)
	src.SPIFFE.ServerAddress = server.Address
	src.SPIFFE.BrokerURL = front.URL + "/credential/tpm"
	src.SPIFFE.BrokerCA = op.caPEM // every httptest server has the same certificate
	src.SPIREAgent = w.bin
	src.AttestTimeout = 3 * time.Minute
	secrets, err = json.Marshal(agentconfig.GuestSecrets{EnrollmentProof: enrollProof, BrokerProof: "proof-tpm"})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(src.Root, agentconfig.SecretsFile)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, secrets, 0o666); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	cred, err := src.Credential(ctx)
	if err != nil {
		t.Fatalf("Credential: %v (exit code %d)\n%s", err, exitCode(err), log)
	}
	t.Logf("enrolled, attested with tpm_devid and fetched the credential in %s", time.Since(start).Round(time.Millisecond))
	if cred.JITConfig != brokerJIT(id) {
		t.Errorf("credential %+v, want the broker's JIT configuration for %s", cred, id)
	}
	if got := w.broker.seenIDs("tpm"); len(got) != 1 || got[0] != id {
		t.Errorf("the broker saw SPIFFE IDs %v, want exactly [%s]", got, id)
	}
	if enrolls, activates, issued := op.counts(); enrolls != 2 || activates != 1 || len(issued) != 1 {
		t.Errorf("the operator saw %d enrollments (want 2: 503, then 200), %d activations, issued %d DevIDs", enrolls, activates, len(issued))
	}
	for _, want := range []string{"TPM DevID certified by the operator", "nodeAttestor=tpm_devid", "X509-SVID obtained", "spire-agent stopped", "SPIRE directory removed"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	checkNothingLeft(t, src.Root, enrollProof, log.String(), nil)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the secrets file is still there: %v", err)
	}

	// The whole agent on the same TPM (a VM boots again with a new
	// claim): config, secrets, enrollment, tpm_devid, broker, runner, and
	// the power-off.
	runID := vmEntries("5a2b3c4d-run")
	v := newVM(t)
	v.secret = brokerJIT(runID)
	writeScript(t, filepath.Join(v.install(), "run.sh"), v.goodRunner(0))
	if err := os.MkdirAll(filepath.Join(v.root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(tpm.Socket, filepath.Join(v.root, "dev", "tpmrm0")); err != nil {
		t.Fatal(err)
	}
	c := v.baseConfig()
	c.WorkloadMethod = agentconfig.WorkloadBroker
	c.SPIFFE = &agentconfig.SPIFFE{
		AttestationMethod: agentconfig.AttestationTPM, TPMDevicePath: "/dev/tpmrm0", SPIFFEID: runID,
		TrustDomain: spireTrustDomain, TrustBundle: string(server.Bundle), ServerAddress: server.Address,
		BrokerURL: front.URL + "/credential/run", BrokerCA: op.caPEM,
	}
	v.writeConfig(c)
	v.placeSecrets(agentconfig.GuestSecrets{EnrollmentProof: enrollProof, BrokerProof: "proof-run"})
	v.opts.SPIREAgent = w.bin
	v.opts.AttestTimeout = 2 * time.Minute
	start = time.Now()
	v.checkCommon(v.run(ctx), ExitOK, 1)
	t.Logf("the whole agent ran in %s", time.Since(start).Round(time.Millisecond))
	if got := v.read("run.jit"); got != v.secret {
		t.Errorf("ACTIONS_RUNNER_INPUT_JITCONFIG = %q, want the broker's", got)
	}
	if got := w.broker.seenIDs("run"); len(got) != 1 || got[0] != runID {
		t.Errorf("the broker saw SPIFFE IDs %v, want exactly [%s]", got, runID)
	}
	checkNothingLeft(t, v.root, enrollProof, v.log.String(), nil)
}
