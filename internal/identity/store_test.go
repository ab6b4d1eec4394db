package identity_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/secretstore"
)

// memStore is a secretstore.Store in memory with the real one's contract:
// Put is create-only, Delete idempotent. putErr fails the next Put.
type memStore struct {
	creds   map[spiffeid.ID]secretstore.Credential
	puts    int
	deletes int
	putErr  error
}

func newMemStore() *memStore { return &memStore{creds: map[spiffeid.ID]secretstore.Credential{}} }

func (m *memStore) Put(_ context.Context, id spiffeid.ID, c secretstore.Credential) error {
	m.puts++
	if err := m.putErr; err != nil {
		m.putErr = nil
		return err
	}
	if _, ok := m.creds[id]; ok {
		return secretstore.ErrExists
	}
	m.creds[id] = c
	return nil
}

func (m *memStore) Delete(_ context.Context, id spiffeid.ID) error {
	m.deletes++
	delete(m.creds, id)
	return nil
}

// platform is a CI platform whose runner names are derived from the claim,
// as workloads.Platforms issues them: registering a name again replaces the earlier,
// never started registration, whose credential is worthless from then on.
type platform struct {
	generation map[string]int // by runner name
	mints      int
}

func (p *platform) mint(_ context.Context, claim *hfv1.MachineClaim) (secretstore.Credential, error) {
	p.mints++
	name := "runner-" + string(claim.UID)
	p.generation[name]++
	claim.Status.Bootstrap = &hfv1.BootstrapStatus{RunnerName: name, RunnerID: int64(p.generation[name])}
	return secretstore.Credential{Method: agentconfig.BootstrapJITConfig, JITConfig: fmt.Sprintf("%s/%d", name, p.generation[name])}, nil
}

// usable reports whether cred still registers a runner.
func (p *platform) usable(cred secretstore.Credential) bool {
	name, gen, _ := strings.Cut(cred.JITConfig, "/")
	return fmt.Sprint(p.generation[name]) == gen
}

func attestedClaim() *hfv1.MachineClaim {
	c := claim("-store")
	c.Status.Identity = &hfv1.IdentityStatus{
		SPIFFEID: "spiffe://example.org/vm/ci/runner-1/0b7c-store", NodeID: "spiffe://example.org/hyperfleet/node/ci/runner-1/0b7c-store",
		EntryID: "hyperfleet.0b7c-store", AttestedAt: &metav1.Time{Time: time.Unix(1_700_000_000, 0)},
	}
	return c
}

func TestDeliverRecordsBeforeItActs(t *testing.T) {
	ctx := context.Background()
	store, plat := newMemStore(), &platform{generation: map[string]int{}}
	c := attestedClaim()
	now := time.Unix(1_700_000_100, 0)

	step, err := identity.Deliver(ctx, store, c, now, plat.mint)
	if err != nil || step != identity.StoreRecorded {
		t.Fatalf("first call: %v, %v; want identity.StoreRecorded", step, err)
	}
	if plat.mints != 0 || store.puts != 0 || store.deletes != 0 || c.Status.Identity.CredentialRequestedAt == nil {
		t.Fatalf("the first call acted before its intent was persisted: mints %d puts %d deletes %d", plat.mints, store.puts, store.deletes)
	}
	step, err = identity.Deliver(ctx, store, c, now, plat.mint)
	if err != nil || step != identity.StoreWritten {
		t.Fatalf("second call: %v, %v; want identity.StoreWritten", step, err)
	}
	id := spiffeid.RequireFromString(c.Status.Identity.SPIFFEID)
	if cred, ok := store.creds[id]; !ok || !plat.usable(cred) || c.Status.Identity.CredentialStoredAt == nil || c.Status.Bootstrap == nil {
		t.Fatalf("after the write: stored %v (usable %v), storedAt %v, bootstrap %v", ok, plat.usable(cred), c.Status.Identity.CredentialStoredAt, c.Status.Bootstrap)
	}
	if step, err := identity.Deliver(ctx, store, c, now, plat.mint); err != nil || step != identity.StoreDone || plat.mints != 1 || store.puts != 1 {
		t.Fatalf("a stored credential is delivered again: %v, %v, mints %d puts %d", step, err, plat.mints, store.puts)
	}

	if err := identity.Forget(ctx, store, c); err != nil || len(store.creds) != 0 {
		t.Fatalf("identity.Forget: %v, left %v", err, store.creds)
	}
	if err := identity.Forget(ctx, store, c); err != nil {
		t.Fatalf("a second identity.Forget: %v", err)
	}
}

// TestDeliverAfterARestart cuts a delivery off at every point after its
// intent was persisted (what a restart loses is the in-memory status) and
// checks that the repeat leaves exactly one usable credential, in the store.
func TestDeliverAfterARestart(t *testing.T) {
	ctx := context.Background()
	errCrash := errors.New("the operator stopped here")
	cases := map[string]struct {
		// interrupted is the attempt the restart cuts off.
		interrupted func(ctx context.Context, store *memStore, c *hfv1.MachineClaim, p *platform)
		// read is true when the VM read the earlier write before the restart.
		read bool
	}{
		"before minting": {interrupted: func(context.Context, *memStore, *hfv1.MachineClaim, *platform) {}},
		"after minting, before the write": {interrupted: func(ctx context.Context, store *memStore, c *hfv1.MachineClaim, p *platform) {
			store.putErr = errCrash
			_, _ = identity.Deliver(ctx, store, c, time.Now(), p.mint)
		}},
		"after the write, before its recording": {interrupted: func(ctx context.Context, store *memStore, c *hfv1.MachineClaim, p *platform) {
			_, _ = identity.Deliver(ctx, store, c, time.Now(), p.mint)
		}},
		"after the write, read by the VM": {read: true, interrupted: func(ctx context.Context, store *memStore, c *hfv1.MachineClaim, p *platform) {
			_, _ = identity.Deliver(ctx, store, c, time.Now(), p.mint)
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			store, plat := newMemStore(), &platform{generation: map[string]int{}}
			persisted := attestedClaim()
			if step, err := identity.Deliver(ctx, store, persisted, time.Now(), plat.mint); err != nil || step != identity.StoreRecorded {
				t.Fatalf("recording the intent: %v, %v", step, err)
			}
			id := spiffeid.RequireFromString(persisted.Status.Identity.SPIFFEID)
			tc.interrupted(ctx, store, persisted.DeepCopy(), plat)
			earlier, wasStored := store.creds[id]
			if tc.read {
				delete(store.creds, id)
			}

			// The restarted operator's pass, from what was persisted.
			c := persisted.DeepCopy()
			step, err := identity.Deliver(ctx, store, c, time.Now(), plat.mint)
			if err != nil || step != identity.StoreWritten {
				t.Fatalf("the repeated attempt: %v, %v", step, err)
			}
			cred, ok := store.creds[id]
			if !ok || !plat.usable(cred) {
				t.Fatalf("after the repeat the store holds %v (usable %v)", ok, plat.usable(cred))
			}
			if wasStored && plat.usable(earlier) {
				t.Error("the interrupted attempt's credential is still usable next to the new one")
			}
			if got := c.Status.Bootstrap; got == nil || got.RunnerID != int64(plat.generation[got.RunnerName]) {
				t.Errorf("status.bootstrap %+v does not name the live registration", got)
			}
			if err := identity.Forget(ctx, store, c); err != nil || len(store.creds) != 0 {
				t.Fatalf("identity.Forget: %v, left %v", err, store.creds)
			}
		})
	}
}

func TestDeliverFailures(t *testing.T) {
	ctx := context.Background()
	store, plat := newMemStore(), &platform{generation: map[string]int{}}
	c := claim("-early")
	if _, err := identity.Deliver(ctx, store, c, time.Now(), plat.mint); err == nil {
		t.Fatal("identity.Deliver for a claim whose VM did not attest succeeded")
	}
	if err := identity.Forget(ctx, store, c); err != nil || store.deletes != 0 {
		t.Fatalf("identity.Forget of a claim that never began a delivery: %v, deletes %d", err, store.deletes)
	}

	c = attestedClaim()
	_, _ = identity.Deliver(ctx, store, c, time.Now(), plat.mint)
	unavailable := errors.New("sealed")
	store.putErr = unavailable
	if _, err := identity.Deliver(ctx, store, c, time.Now(), plat.mint); !errors.Is(err, unavailable) || c.Status.Identity.CredentialStoredAt != nil {
		t.Fatalf("a failed write: %v, storedAt %v", err, c.Status.Identity.CredentialStoredAt)
	}
	if c.Status.Bootstrap == nil {
		t.Error("a runner registered for a failed write is not recorded for the claim's end to remove")
	}
	refused := errors.New("platform down")
	if _, err := identity.Deliver(ctx, store, c, time.Now(), func(context.Context, *hfv1.MachineClaim) (secretstore.Credential, error) {
		return secretstore.Credential{}, refused
	}); !errors.Is(err, refused) || len(store.creds) != 0 {
		t.Fatalf("a failed mint: %v, stored %v", err, store.creds)
	}
	if step, err := identity.Deliver(ctx, store, c, time.Now(), plat.mint); err != nil || step != identity.StoreWritten || len(store.creds) != 1 {
		t.Fatalf("the retry: %v, %v, stored %d", step, err, len(store.creds))
	}
}

func TestStoreAgentConfig(t *testing.T) {
	ctx := context.Background()
	read := func(_ context.Context, field string, ref hfv1.SecretKeySelector) ([]byte, error) {
		if ref.Name != "vault-ca" {
			return nil, fmt.Errorf("%s: no Secret %s", field, ref.Name)
		}
		return []byte("-----BEGIN CERTIFICATE-----\n"), nil
	}
	cfg := &hfv1.SecretStoreConfig{Address: "https://vault.example.com:8200", CABundleRef: &hfv1.SecretKeySelector{Name: "vault-ca", Namespace: "hf", Key: "ca.crt"}}
	got, err := identity.StoreAgentConfig(ctx, cfg, "spiffe://example.org/vm/ci/runner-1/0b7c-1", read)
	if err != nil {
		t.Fatal(err)
	}
	want := agentconfig.SecretStore{
		Address: "https://vault.example.com:8200", CABundle: "-----BEGIN CERTIFICATE-----\n", AuthMount: "jwt", Role: "0b7c-1",
		Audience: "hyperfleet-secret-store", KVMount: "secret", Path: "hyperfleet/example.org/vm/ci/runner-1/0b7c-1",
	}
	if *got != want {
		t.Fatalf("identity.StoreAgentConfig = %+v, want %+v", *got, want)
	}
	cfg.CABundleRef.Name = "missing"
	if _, err := identity.StoreAgentConfig(ctx, cfg, "spiffe://example.org/vm/ci/runner-1/0b7c-1", read); err == nil || !strings.Contains(err.Error(), "caBundleRef") {
		t.Fatalf("a missing CA bundle: %v", err)
	}
	if _, err := identity.OpenStore(ctx, &hfv1.SecretStoreConfig{Address: "https://vault.example.com:8200"}, read); err != nil {
		t.Fatalf("identity.OpenStore: %v", err)
	}
}
