package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// recordingSystem records what freshen asks of the guest, in order.
type recordingSystem struct {
	calls                         []string
	seed                          []byte
	clock                         time.Time
	entropyErr, setErr, leasesErr error
}

func (r *recordingSystem) SetClock(t time.Time) error {
	r.calls, r.clock = append(r.calls, "clock"), t
	return r.setErr
}

func (r *recordingSystem) AddEntropy(seed []byte) error {
	r.calls, r.seed = append(r.calls, "entropy"), bytes.Clone(seed)
	return r.entropyErr
}

func (r *recordingSystem) RenewLeases(context.Context) ([]string, error) {
	r.calls = append(r.calls, "leases")
	return []string{"eth0"}, r.leasesErr
}

func freshness(t *testing.T, at time.Time) *agentconfig.Freshness {
	t.Helper()
	seed := make([]byte, agentconfig.FreshEntropyBytes)
	if _, err := rand.Read(seed); err != nil {
		t.Fatal(err)
	}
	return &agentconfig.Freshness{Time: at, Entropy: seed}
}

// resumedFreshness is freshness for a VM the operator resumed.
func resumedFreshness(t *testing.T, at time.Time) *agentconfig.Freshness {
	f := freshness(t, at)
	f.Resumed = true
	return f
}

func TestFreshen(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	suspended := time.Now().Add(3 * time.Hour)
	cases := []struct {
		name  string
		fresh *agentconfig.Freshness
		// since is how long ago the document was written, by the guest's
		// clock.
		since     time.Duration
		sys       recordingSystem
		wantCalls []string
		wantFail  string
	}{
		{name: "no freshness: an operator from before it", wantCalls: nil},
		{name: "clock close enough (not resumed): entropy only", fresh: freshness(t, time.Now()), wantCalls: []string{"entropy"}},
		{name: "resumed hours later: entropy, the clock, then the leases", fresh: freshness(t, suspended), wantCalls: []string{"entropy", "clock", "leases"}},
		{name: "clock ahead is stepped back too", fresh: freshness(t, time.Now().Add(-time.Hour)), wantCalls: []string{"entropy", "clock", "leases"}},
		// The agent read the document 9 s after its write (a guest busy
		// after its resume): its clock, right, is not set back to the
		// document's time.
		// Under TCG a restored guest's clock may be right: the operator's
		// word that it resumed the VM renews the leases all the same.
		{name: "resumed by the operator, clock right: entropy, then the leases", fresh: resumedFreshness(t, time.Now()),
			wantCalls: []string{"entropy", "leases"}},
		{name: "read late, clock right: not stepped back", fresh: freshness(t, time.Now().Add(-9*time.Second)), since: 9 * time.Second,
			wantCalls: []string{"entropy"}},
		{name: "read late, resumed hours later: stepped to the operator's now", fresh: freshness(t, suspended.Add(-9*time.Second)), since: 9 * time.Second,
			wantCalls: []string{"entropy", "clock", "leases"}},
		{name: "reseed fails: no secret used, clock untouched", fresh: freshness(t, suspended), sys: recordingSystem{entropyErr: syscall.EPERM},
			wantCalls: []string{"entropy"}, wantFail: "reseed the random number generator"},
		{name: "clock step fails", fresh: freshness(t, suspended), sys: recordingSystem{setErr: syscall.EPERM},
			wantCalls: []string{"entropy", "clock"}, wantFail: "step the clock"},
		{name: "lease renewal fails", fresh: freshness(t, suspended), sys: recordingSystem{leasesErr: errors.New("dhclient exited 2")},
			wantCalls: []string{"entropy", "clock", "leases"}, wantFail: "renew the DHCP leases"},
		{name: "a system without the calls goes on", fresh: freshness(t, suspended), sys: recordingSystem{entropyErr: errNotSupported, setErr: errNotSupported, leasesErr: errNotSupported},
			wantCalls: []string{"entropy", "clock", "leases"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sys := c.sys
			err := freshen(t.Context(), log, &sys, c.fresh, c.since, ExitNoSecrets)
			if !slices.Equal(sys.calls, c.wantCalls) {
				t.Errorf("calls %v, want %v", sys.calls, c.wantCalls)
			}
			switch {
			case c.wantFail == "" && err != nil:
				t.Fatalf("freshen: %v", err)
			case c.wantFail != "" && (err == nil || exitCode(err) != ExitNoSecrets || !bytes.Contains([]byte(err.Error()), []byte(c.wantFail))):
				t.Fatalf("freshen: %v (exit code %d), want ExitNoSecrets saying %q", err, exitCode(err), c.wantFail)
			}
			if c.fresh != nil && !bytes.Equal(sys.seed, c.fresh.Entropy) {
				t.Errorf("entropy %x, want the operator's %x", sys.seed, c.fresh.Entropy)
			}
			if c.fresh == nil {
				return
			}
			if want := c.fresh.Time.Add(c.since); slices.Contains(sys.calls, "clock") && !sys.clock.Equal(want) {
				t.Errorf("clock stepped to %v, want the operator's %v (its time at the write and %s since)", sys.clock, want, c.since)
			}
		})
	}
}

// TestGuestSecretsFreshenFirst: the secrets a suspended guest receives are
// returned only after its system was made fresh from the document, and a
// document whose fresh part is unusable is not taken.
func TestGuestSecretsFreshenFirst(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets", "guest-secrets.json")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	// Written 30 s before the agent reads it (by the guest's clock, the
	// file's modification time), by an operator 2 h ahead of the guest:
	// the clock goes to the operator's time at the write and 30 s since.
	const readLate = 30 * time.Second
	fresh := freshness(t, time.Now().Add(2*time.Hour-readLate))
	doc, err := json.Marshal(agentconfig.GuestSecrets{JITConfig: "jit", Fresh: fresh})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	written := time.Now().Add(-readLate)
	if err := os.Chtimes(path, written, written); err != nil {
		t.Fatal(err)
	}
	sys := &recordingSystem{}
	g, err := waitGuestSecrets(t.Context(), t.Context(), log, sys, path, ExitNoSecrets)
	if err != nil || g.JITConfig != "jit" {
		t.Fatalf("waitGuestSecrets = %+v, %v", g, err)
	}
	want := fresh.Time.Add(readLate)
	if !slices.Equal(sys.calls, []string{"entropy", "clock", "leases"}) || sys.clock.Before(want) || sys.clock.After(want.Add(agentconfig.MaxClockSkew)) {
		t.Errorf("the guest saw %v (clock %v), want its entropy, its clock and its leases made fresh, the clock at %v (the operator's time at the write and the %s since)",
			sys.calls, sys.clock, want, readLate)
	}

	fresh.Entropy = fresh.Entropy[:8]
	doc, _ = json.Marshal(agentconfig.GuestSecrets{JITConfig: "jit", Fresh: fresh})
	if err := os.WriteFile(path, doc, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the deadline has passed: one read, then the refusal
	sys = &recordingSystem{}
	if _, err := waitGuestSecrets(t.Context(), ctx, log, sys, path, ExitNoSecrets); exitCode(err) != ExitNoSecrets || !bytes.Contains([]byte(err.Error()), []byte("entropy")) {
		t.Fatalf("a document with 8 bytes of entropy: %v, want ExitNoSecrets saying why", err)
	}
	if len(sys.calls) != 0 {
		t.Errorf("an unusable document changed the guest: %v", sys.calls)
	}
}

func TestGuestSystemOfOptions(t *testing.T) {
	own := &recordingSystem{}
	if got := guestSystem(&Options{System: own, Root: "/x"}); got != own {
		t.Errorf("Options.System is not used: %T", got)
	}
	if _, ok := guestSystem(&Options{Root: "/x"}).(sharedHost); !ok {
		t.Error("an agent sharing its host (Root set) would change the host's clock")
	}
	if _, ok := guestSystem(&Options{}).(hostSystem); !ok {
		t.Error("a real VM's agent does not use its own system")
	}
}

// TestHostSystemReseeds makes the real calls on this host's kernel:
// RNDADDENTROPY and RNDRESEEDCRNG take the operator's seed as root (which
// only adds to the pool) and are refused without privilege; a wrong
// rand_pool_info layout would be EINVAL either way. The clock is never
// stepped here: CLOCK_REALTIME has no namespace.
func TestHostSystemReseeds(t *testing.T) {
	seed := freshness(t, time.Now()).Entropy
	err := hostSystem{}.AddEntropy(seed)
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("AddEntropy as root: %v", err)
		}
		return
	}
	if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("AddEntropy without privilege: %v, want EPERM", err)
	}
}
