package identity_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
	"github.com/hyperfleet/hyperfleet/pkg/ownership"
)

func cfg(td, socket string) hfv1.SPIREConfig {
	return hfv1.SPIREConfig{TrustDomain: td, ServerAddress: "spire.example.org:8081", ServerAPI: hfv1.SPIREServerAPI{AdminSocket: socket}}
}

// registry returns a registry whose dials give the fake servers by trust
// domain, counting dials.
func registry(servers ...*identitytest.Server) (*identity.Registry, *int) {
	dials := 0
	dial := identitytest.Dialer(servers...)
	r := identity.NewRegistry()
	r.Dial = func(ctx context.Context, c spire.Config) (identity.ServerAPI, error) {
		dials++
		return dial(ctx, c)
	}
	return r, &dials
}

func TestRegistryConnectsOncePerConfiguration(t *testing.T) {
	ctx := context.Background()
	a, b := identitytest.NewServer(t, "a.example"), identitytest.NewServer(t, "b.example")
	now := time.Unix(1_700_000_000, 0)
	r, dials := registry(a, b)
	r.Now = func() time.Time { return now }

	s1, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock"))
	if err != nil {
		t.Fatal(err)
	}
	// The same configuration again: the same connection, the bundle not
	// read again within a minute.
	s2, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock"))
	if err != nil || s2 != s1 || *dials != 1 || a.State().BundleReads != 1 {
		t.Fatalf("second Connect: %v, same %v, dials %d, bundle reads %d", err, s2 == s1, *dials, a.State().BundleReads)
	}
	now = now.Add(2 * time.Minute)
	if _, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/a.sock")); err != nil || a.State().BundleReads != 2 {
		t.Fatalf("after a minute the bundle is read again: %v, reads %d", err, a.State().BundleReads)
	}
	// Another server API setting reconnects and closes the old one.
	s3, err := r.Connect(ctx, "c1", cfg("a.example", "/run/spire/other.sock"))
	if err != nil || s3 == s1 || *dials != 2 || !a.State().Closed {
		t.Fatalf("changed socket: %v, new %v, dials %d, old closed %v", err, s3 != s1, *dials, a.State().Closed)
	}
	// A second trust domain; both bundles verify.
	if _, err := r.Connect(ctx, "c2", cfg("b.example", "/run/spire/b.sock")); err != nil {
		t.Fatal(err)
	}
	set := r.Bundles()
	for _, td := range []spiffeid.TrustDomain{a.TD, b.TD} {
		if _, ok := set.Get(td); !ok {
			t.Errorf("Bundles lacks %s", td)
		}
	}
	if s, ok := r.ByTrustDomain(b.TD); !ok || s.Cluster != "c2" {
		t.Errorf("ByTrustDomain(%s) = %v, %v", b.TD, s, ok)
	}
	r.Remove("c2")
	if _, ok := r.Server("c2"); ok || !b.State().Closed {
		t.Error("Remove kept the server or did not close it")
	}
}

func TestRegistryRefusesAWrongTrustDomain(t *testing.T) {
	// The socket leads to a server of another trust domain than
	// spec.spire says: its bundle must not verify this cluster's VMs.
	other := identitytest.NewServer(t, "other.example")
	r := identity.NewRegistry()
	r.Dial = func(context.Context, spire.Config) (identity.ServerAPI, error) { return other, nil }
	_, err := r.Connect(context.Background(), "c1", cfg("a.example", "/run/spire/a.sock"))
	if err == nil || !strings.Contains(err.Error(), "fix spec.spire.trustDomain") {
		t.Fatalf("Connect = %v, want a trust domain mismatch naming the field", err)
	}
	if _, ok := r.Server("c1"); ok {
		t.Error("a server whose bundle did not verify is offered")
	}
}

// ring is an ownership key ring of the given key ids, each key made of
// seed and its id.
func ring(t *testing.T, seed byte, ids ...int) *ownership.Signer {
	t.Helper()
	var keys []ownership.Key
	for _, id := range ids {
		keys = append(keys, ownership.Key{ID: id, Secret: bytes.Repeat([]byte{seed + byte(id)}, ownership.MinKeyLength)})
	}
	r, err := ownership.NewKeyRing("test", keys)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func claim(uid string) *hfv1.MachineClaim {
	return &hfv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ci", Name: "runner-1", UID: types.UID("0b7c" + uid)}}
}

func TestIssueAttestRelease(t *testing.T) {
	ctx := context.Background()
	fs := identitytest.NewServer(t, "example.org")
	fs.SetClock(func() time.Time { return time.Unix(1_700_000_000, 0) })
	r, _ := registry(fs)
	srv, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	iss := &identity.Issuer{Keys: ring(t, 3, 0), AgentUID: 0}
	c := claim("-1")
	if _, err := iss.Issue(ctx, srv, c, time.Minute, ""); err == nil {
		t.Fatal("Issue without a recorded identity succeeded")
	}
	plan, err := identity.Plan(srv, c)
	if err != nil {
		t.Fatal(err)
	}
	if plan.SPIFFEID != "spiffe://example.org/vm/ci/runner-1/0b7c-1" || plan.EntryID != "hyperfleet.0b7c-1" ||
		plan.NodeID != "spiffe://example.org/hyperfleet/node/ci/runner-1/0b7c-1" {
		t.Fatalf("Plan = %+v", plan)
	}
	c.Status.Identity = plan
	exp, err := iss.Issue(ctx, srv, c, 15*time.Minute, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Unix(1_700_000_000, 0).Add(15 * time.Minute); !exp.Equal(want) {
		t.Errorf("expiry %s, want %s", exp, want)
	}
	// Repeating the pass (a restart before the status write) issues the
	// same token: one alias, one entry.
	if _, err := iss.Issue(ctx, srv, c, 15*time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	token, _ := iss.Token(c)
	st := fs.State()
	if len(st.Tokens) != 1 || st.Tokens[token].String() != plan.NodeID || st.Aliases[st.Tokens[token]] != 1 {
		t.Fatalf("tokens %v aliases %v", st.Tokens, st.Aliases)
	}
	e := st.Entries[plan.EntryID]
	if e.SPIFFEID.String() != plan.SPIFFEID || e.ParentID.String() != plan.NodeID || len(e.Selectors) != 1 || e.Selectors[0].String() != "unix:uid:0" {
		t.Fatalf("entry %+v", e)
	}
	// A generic claim's entry selects its script's user by name instead:
	// the script, not the agent, fetches the VM's SVIDs.
	g := claim("-3")
	g.Status.Identity, _ = identity.Plan(srv, g)
	if _, err := iss.Issue(ctx, srv, g, time.Minute, "batch"); err != nil {
		t.Fatal(err)
	}
	if ge := fs.State().Entries[g.Status.Identity.EntryID]; len(ge.Selectors) != 1 || ge.Selectors[0].String() != "unix:user:batch" {
		t.Fatalf("generic claim's entry selectors %v, want unix:user:batch", ge.Selectors)
	}
	if err := iss.Release(ctx, srv, g); err != nil {
		t.Fatal(err)
	}
	// Another claim gets another token.
	if other, _ := iss.Token(claim("-2")); other == token {
		t.Error("two claims derive the same join token")
	}

	if ok, err := iss.Attested(ctx, srv, c); err != nil || ok {
		t.Fatalf("Attested before the agent attested: %v, %v", ok, err)
	}
	fs.Attest(token)
	if ok, err := iss.Attested(ctx, srv, c); err != nil || !ok {
		t.Fatalf("Attested after the agent attested: %v, %v", ok, err)
	}

	if err := iss.Release(ctx, srv, c); err != nil {
		t.Fatal(err)
	}
	if st := fs.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 || len(st.Agents) != 0 {
		t.Errorf("left after Release: entries %v aliases %v agents %v", st.Entries, st.Aliases, st.Agents)
	}
	if err := iss.Release(ctx, srv, c); err != nil {
		t.Errorf("a second Release: %v", err)
	}
}

// connected is a fake server of example.org and a registry connected to
// it as cluster c1.
func connected(t *testing.T) (*identitytest.Server, *identity.Server) {
	t.Helper()
	fs := identitytest.NewServer(t, "example.org")
	r, _ := registry(fs)
	srv, err := r.Connect(context.Background(), "c1", cfg("example.org", "/run/spire/api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return fs, srv
}

func TestIssuerRefusesAnEditedIdentity(t *testing.T) {
	// status.identity is only as trustworthy as who can write the claim's
	// status: an identity naming another claim's entry is never acted on.
	ctx := context.Background()
	fs, srv := connected(t)
	iss := &identity.Issuer{Keys: ring(t, 0, 0)}
	victim, c := claim("-victim"), claim("-1")
	plan, _ := identity.Plan(srv, victim)
	c.Status.Identity = plan
	for name, f := range map[string]func() error{
		"Issue":   func() error { _, err := iss.Issue(ctx, srv, c, time.Minute, ""); return err },
		"Release": func() error { return iss.Release(ctx, srv, c) },
	} {
		if err := f(); err == nil || !strings.Contains(err.Error(), "is not this claim's identity") {
			t.Errorf("%s with another claim's identity: %v", name, err)
		}
	}
	if st := fs.State(); len(st.Tokens) != 0 || len(st.Entries) != 0 {
		t.Errorf("created for an edited identity: tokens %v entries %v", st.Tokens, st.Entries)
	}
	if _, err := (&identity.Issuer{}).Token(c); err == nil {
		t.Error("an issuer without a key ring derived a token")
	}
}

// blockingServer is a SPIRE server whose bundle reads wait until release
// is closed, counting them.
type blockingServer struct {
	*identitytest.Server
	release chan struct{}
	reads   atomic.Int64
}

func (b *blockingServer) X509Bundle(ctx context.Context) (*x509bundle.Bundle, error) {
	b.reads.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.Server.X509Bundle(ctx)
}

// TestBundleReadsHoldNoLock: a bundle read that hangs on the SPIRE server
// (or a flood of reads forced by certificates that do not verify) never
// holds up what issuance and the broker read from the registry, and the
// callers that need a read while one is under way share it.
func TestBundleReadsHoldNoLock(t *testing.T) {
	ctx := context.Background()
	fs := identitytest.NewServer(t, "example.org")
	srv := &blockingServer{Server: fs, release: make(chan struct{})}
	now := time.Unix(1_700_000_000, 0)
	var clock atomic.Pointer[time.Time]
	clock.Store(&now)
	r := identity.NewRegistry()
	r.Dial = func(context.Context, spire.Config) (identity.ServerAPI, error) { return srv, nil }
	r.Now = func() time.Time { return *clock.Load() }
	close(srv.release)
	s, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	// From now on reads hang until released.
	srv.release = make(chan struct{})
	later := now.Add(2 * time.Minute)
	clock.Store(&later)

	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 50 {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- r.Refresh(ctx, s) }()
		go func() {
			defer wg.Done()
			_, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock"))
			errs <- err
		}()
	}
	// While those wait for the server, everything issuance and the broker
	// read answers at once, from the bundle in hand.
	done := make(chan struct{})
	go func() {
		defer close(done)
		if b, _ := s.Bundle(); b == nil {
			t.Error("the bundle in hand is gone while a read is under way")
		}
		if _, ok := r.ByTrustDomain(fs.TD); !ok {
			t.Error("ByTrustDomain lost the server while a read is under way")
		}
		if _, ok := r.Bundles().Get(fs.TD); !ok {
			t.Error("Bundles lost the trust domain while a read is under way")
		}
		if _, ok := r.Server("c1"); !ok {
			t.Error("Server lost the cluster while a read is under way")
		}
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reading the registry waited for a SPIRE call in flight")
	}
	close(srv.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, identity.ErrBundleFresh) {
			t.Errorf("a caller failed: %v", err)
		}
	}
	// One read at connect, one shared by the 100 callers.
	if n := srv.reads.Load(); n != 2 {
		t.Errorf("%d bundle reads, want 2: 100 callers share one read under way", n)
	}
	// A forced read within the interval of the last is not made.
	if err := r.Refresh(ctx, s); !errors.Is(err, identity.ErrBundleFresh) || srv.reads.Load() != 2 {
		t.Errorf("Refresh right after a read: %v, reads %d; want ErrBundleFresh and no read", err, srv.reads.Load())
	}
	after := later.Add(identity.DefaultForcedRefreshInterval)
	clock.Store(&after)
	if err := r.Refresh(ctx, s); err != nil || srv.reads.Load() != 3 {
		t.Errorf("Refresh after the interval: %v, reads %d; want one more read", err, srv.reads.Load())
	}
}

// TestLookupReadsOnlyAsAllowed: the broker's way to a server (Lookup)
// reads a missing bundle at most once per interval, however many callers
// ask while the server fails; Connect, the controllers' way, reads it
// whenever it is missing.
func TestLookupReadsOnlyAsAllowed(t *testing.T) {
	ctx := context.Background()
	fs := identitytest.NewServer(t, "example.org")
	fs.Fail(errors.New("connection refused"))
	now := time.Unix(1_700_000_000, 0)
	r, dials := registry(fs)
	r.Now = func() time.Time { return now }
	for range 20 {
		if _, err := r.Lookup(ctx, "c1", cfg("example.org", "/run/spire/api.sock")); err == nil {
			t.Fatal("Lookup of a failing server succeeded")
		}
	}
	if n := fs.State().BundleReads; n != 1 || *dials != 1 {
		t.Fatalf("20 Lookups of a failing server: %d reads, %d dials; want 1 and 1", n, *dials)
	}
	fs.Fail(nil)
	if _, err := r.Connect(ctx, "c1", cfg("example.org", "/run/spire/api.sock")); err != nil || fs.State().BundleReads != 2 {
		t.Fatalf("Connect: %v, reads %d", err, fs.State().BundleReads)
	}
	if s, err := r.Lookup(ctx, "c1", cfg("example.org", "/run/spire/api.sock")); err != nil || s == nil || fs.State().BundleReads != 2 {
		t.Fatalf("Lookup with a bundle in hand: %v, reads %d; want no read", err, fs.State().BundleReads)
	}
}

// TestBrokerProof: the proof is derived from the claim's UID with a key of
// its own (the token's key gives different values), stable across calls
// (so the operator needs to store nothing), distinct per claim, and only
// the claim's own proof verifies.
func TestBrokerProof(t *testing.T) {
	iss := &identity.Issuer{Keys: ring(t, 0, 0)}
	a, b := claim("-a"), claim("-b")
	pa, err := iss.BrokerProof(a)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := iss.BrokerProof(a); again != pa || len(pa) != 43 {
		t.Fatalf("proof %q (%d characters), again %q: want one stable 43-character proof", pa, len(pa), again)
	}
	pb, _ := iss.BrokerProof(b)
	token, _ := iss.Token(a)
	if pb == pa || strings.Contains(pa, token) {
		t.Fatalf("proofs not separate: a %q, b %q, a's token %q", pa, pb, token)
	}
	for proof, want := range map[string]error{pa: nil, pb: identity.ErrWrongProof, "": identity.ErrWrongProof, pa[:42]: identity.ErrWrongProof, pa + "x": identity.ErrWrongProof} {
		if got := iss.VerifyBrokerProof(a, proof); !errors.Is(got, want) || (want == nil) != (got == nil) {
			t.Errorf("VerifyBrokerProof(%q) = %v, want %v", proof, got, want)
		}
	}
	if err := (&identity.Issuer{}).VerifyBrokerProof(a, pa); err == nil {
		t.Error("an issuer without a key ring verified a proof")
	}
	doc, err := iss.GuestSecrets(a)
	if err != nil || doc.JoinToken != token || doc.BrokerProof != pa || doc.JITConfig != "" || doc.RegistrationToken != "" {
		t.Fatalf("GuestSecrets = %+v, %v; want the token and the proof only", doc, err)
	}
}

// TestKeyRotationKeepsInFlightSecrets: an identity planned before the
// ownership key is rotated (a new hmac-key-<n> in the Secret and a
// restart, docs/security.md, "Ownership keys") records its key, and the
// operator after the rotation derives the very join token the SPIRE
// server holds, and accepts the broker proof and the enrollment proof the
// VM holds, instead of taking them for stolen; a new identity uses the
// new key. A key removed from the ring is ErrKeyUnavailable, not a wrong
// proof.
func TestKeyRotationKeepsInFlightSecrets(t *testing.T) {
	_, srv := connected(t)
	before := &identity.Issuer{Keys: ring(t, 0, 0)}
	c := claim("-inflight")
	plan, err := before.Plan(srv, c)
	if err != nil {
		t.Fatal(err)
	}
	if plan.KeyID == nil || *plan.KeyID != 0 {
		t.Fatalf("the plan records key %v, want 0", plan.KeyID)
	}
	c.Status.Identity = plan
	c.Status.Identity.TPM = &hfv1.TPMIdentityStatus{}
	token, _ := before.Token(c)
	brokerProof, _ := before.BrokerProof(c)
	enrollProof, err := before.EnrollmentProof(c)
	if err != nil {
		t.Fatal(err)
	}

	after := &identity.Issuer{Keys: ring(t, 0, 0, 1)} // hmac-key-1 added, the operator restarted
	if again, err := after.Token(c); err != nil || again != token {
		t.Errorf("the join token after the rotation: %q, %v; want the one the SPIRE server holds, %q", again, err, token)
	}
	if err := after.VerifyBrokerProof(c, brokerProof); err != nil {
		t.Errorf("the VM's broker proof after the rotation: %v", err)
	}
	if ref, err := after.VerifyEnrollmentProof(enrollProof); err != nil || ref.KeyID != 0 || ref.UID != string(c.UID) {
		t.Errorf("the VM's enrollment proof after the rotation: %+v, %v", ref, err)
	}
	// A claim planned now uses the new key.
	fresh := claim("-new")
	if fresh.Status.Identity, err = after.Plan(srv, fresh); err != nil || *fresh.Status.Identity.KeyID != 1 {
		t.Fatalf("a new identity after the rotation: %+v, %v; want key 1", fresh.Status.Identity, err)
	}
	if newToken, _ := after.Token(fresh); newToken == token {
		t.Error("two claims derive one token")
	}
	// Key 0 removed from the Secret: nothing derives, and that is not a
	// wrong proof.
	removed := &identity.Issuer{Keys: ring(t, 0, 1)}
	if err := removed.VerifyBrokerProof(c, brokerProof); !errors.Is(err, identity.ErrKeyUnavailable) {
		t.Errorf("the broker proof of a removed key: %v, want %v", err, identity.ErrKeyUnavailable)
	}
	if _, err := removed.VerifyEnrollmentProof(enrollProof); !errors.Is(err, identity.ErrKeyUnavailable) {
		t.Errorf("the enrollment proof of a removed key: %v, want %v", err, identity.ErrKeyUnavailable)
	}
}

// TestReleaseWithARemovedKey: a claim whose ownership key was removed
// from the ring while it was in flight still has its entries deleted at
// its end (its agent, which only its token names, cannot be); the claim
// does not wait on a key that will not come back.
func TestReleaseWithARemovedKey(t *testing.T) {
	ctx := context.Background()
	fs, srv := connected(t)
	before := &identity.Issuer{Keys: ring(t, 0, 0)}
	c := claim("-1")
	c.Status.Identity, _ = before.Plan(srv, c)
	if _, err := before.Issue(ctx, srv, c, time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	removed := &identity.Issuer{Keys: ring(t, 0, 1)}
	if ok, err := removed.Attested(ctx, srv, c); err != nil || ok {
		t.Errorf("Attested with the claim's key removed: %v, %v; want false and no error", ok, err)
	}
	if err := removed.Release(ctx, srv, c); err != nil {
		t.Fatalf("Release with the claim's key removed: %v", err)
	}
	if st := fs.State(); len(st.Entries) != 0 || len(st.Aliases) != 0 {
		t.Errorf("left after Release: entries %v aliases %v", st.Entries, st.Aliases)
	}
}

// TestEnrollmentProofCoversWhatItNames: the enrollment proof is checked on
// its own, before anything is read, and its mac covers every part it
// names: the claim's own proof verifies, while that proof with another
// namespace, name, UID or key id, or a mac of another claim, does not, so
// a VM cannot make the operator read another claim with it.
func TestEnrollmentProofCoversWhatItNames(t *testing.T) {
	iss := &identity.Issuer{Keys: ring(t, 0, 0, 1)}
	c, other := claim("-a"), claim("-b")
	other.Name = "runner-2"
	proof, err := iss.EnrollmentProof(c)
	if err != nil {
		t.Fatal(err)
	}
	otherProof, _ := iss.EnrollmentProof(other)
	ref, err := iss.VerifyEnrollmentProof(proof)
	if err != nil || ref != (identity.EnrollmentRef{Namespace: "ci", Name: "runner-1", UID: string(c.UID), KeyID: 1}) {
		t.Fatalf("the claim's own proof: %+v, %v", ref, err)
	}
	parts := strings.Split(proof, "/")
	mac := parts[4]
	otherMAC := otherProof[strings.LastIndex(otherProof, "/")+1:]
	for name, forged := range map[string]string{
		"another namespace":     "prod/runner-1/" + parts[2] + "/1/" + mac,
		"another name":          "ci/runner-2/" + parts[2] + "/1/" + mac,
		"another UID":           "ci/runner-1/0b7c-b/1/" + mac,
		"another key id":        "ci/runner-1/" + parts[2] + "/0/" + mac,
		"a key id as 01":        "ci/runner-1/" + parts[2] + "/01/" + mac,
		"another claim's mac":   "ci/runner-1/" + parts[2] + "/1/" + otherMAC,
		"the old format":        "ci/runner-1/" + parts[2] + "/" + mac,
		"an extra part":         proof + "/x",
		"nothing":               "",
		"an unknown key id":     "ci/runner-1/" + parts[2] + "/7/" + mac,
		"a truncated mac":       proof[:len(proof)-1],
		"empty parts":           "////",
		"a negative key id":     "ci/runner-1/" + parts[2] + "/-1/" + mac,
		"the mac in the middle": "ci/runner-1/" + mac + "/1/" + parts[2],
	} {
		if ref, err := iss.VerifyEnrollmentProof(forged); err == nil {
			t.Errorf("%s (%q) verified as %+v", name, forged, ref)
		}
	}
}

// TestEvict: a stolen identity's agent is banned and the VM's entries go;
// evicting twice, or an agent that is gone, is success.
func TestEvict(t *testing.T) {
	ctx := context.Background()
	fs, srv := connected(t)
	iss := &identity.Issuer{Keys: ring(t, 0, 0)}
	c := claim("-1")
	plan, _ := identity.Plan(srv, c)
	c.Status.Identity = plan
	if _, err := iss.Issue(ctx, srv, c, time.Minute, ""); err != nil {
		t.Fatal(err)
	}
	token, _ := iss.Token(c)
	fs.Attest(token)
	for i := range 2 {
		if err := iss.Evict(ctx, srv, c); err != nil {
			t.Fatalf("Evict, call %d: %v", i+1, err)
		}
	}
	st := fs.State()
	if len(st.Banned) != 1 || st.Banned[0] != spire.JoinTokenAgentID(fs.TD, token) || len(st.Entries) != 0 || len(st.Aliases) != 0 {
		t.Fatalf("after Evict: banned %v, entries %v, aliases %v; want the token's agent banned and no entry", st.Banned, st.Entries, st.Aliases)
	}
	if a, found, err := srv.API.Agent(ctx, spire.JoinTokenAgentID(fs.TD, token)); err != nil || !found || !a.Banned {
		t.Errorf("Agent after Evict: %+v, %v, %v; want it listed as banned", a, found, err)
	}
}
