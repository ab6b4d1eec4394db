package sweeper

import (
	"context"
	"slices"
	"testing"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/identity"
	"github.com/hyperfleet/hyperfleet/internal/spire"
	"github.com/hyperfleet/hyperfleet/internal/testworld/identitytest"
)

// withSPIRE connects the world's cluster to a SPIRE server holding, for a
// live claim and a gone one of this install, each claim's registration
// entry and TPM alias entry, and a gone claim's entry of another install
// and one written before entries had hints.
func withSPIRE(w *world) *identitytest.Server {
	w.t.Helper()
	ctx := context.Background()
	srv := identitytest.NewServer(w.t, "example.org")
	reg := identity.NewRegistry()
	reg.Dial = identitytest.Dialer(srv)
	if _, err := reg.Connect(ctx, w.cluster, hfv1.SPIREConfig{TrustDomain: "example.org", ServerAddress: "spire.example.org:8081",
		ServerAPI: hfv1.SPIREServerAPI{AdminSocket: "/run/spire/admin.sock"}}); err != nil {
		w.t.Fatal(err)
	}
	live := w.claim("live").UID
	ours := spire.InstallHint(w.signer.OperatorID())
	td := spiffeid.RequireTrustDomainFromString("example.org")
	entry := func(id, hint string) spire.Entry {
		return spire.Entry{ID: id, SPIFFEID: spiffeid.RequireFromPath(td, "/vm/ci/x/"+id), ParentID: spire.DefaultServerID(td),
			Selectors: []spire.Selector{{Type: "unix", Value: "uid:0"}}, Hint: hint}
	}
	for _, e := range []spire.Entry{
		entry(spire.EntryIDFor(live), ours), entry(spire.AliasEntryIDFor(live), ours),
		entry(spire.EntryIDFor("uid-gone"), ours), entry(spire.AliasEntryIDFor("uid-gone"), ours),
		entry(spire.EntryIDFor("uid-other"), spire.InstallHint("another-install")),
		entry(spire.EntryIDFor("uid-old"), ""),
	} {
		if err := srv.EnsureEntry(ctx, e); err != nil {
			w.t.Fatal(err)
		}
	}
	w.sweeper.Identity = reg
	return srv
}

func entryIDs(t *testing.T, srv *identitytest.Server) []string {
	t.Helper()
	entries, err := srv.ListEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.ID)
	}
	slices.Sort(out)
	return out
}

// TestSPIRESweep: the entries this install made for a claim that is gone
// are reported at once and deleted after the grace period; a live claim's
// entries, another install's and unmarked ones are never touched; dry-run
// only reports.
func TestSPIRESweep(t *testing.T) {
	for _, dryRun := range []bool{false, true} {
		t.Run(map[bool]string{false: "remove", true: "dry-run"}[dryRun], func(t *testing.T) {
			w := newWorld(t, dryRun)
			srv := withSPIRE(w)
			ctx := context.Background()
			all := entryIDs(t, srv)
			w.sweeper.SweepAll(ctx)
			got := w.sweeper.SPIREOrphans()
			slices.Sort(got)
			want := []string{w.cluster + "/" + spire.EntryIDFor("uid-gone"), w.cluster + "/" + spire.AliasEntryIDFor("uid-gone")}
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("orphans %v, want %v", got, want)
			}
			if !hasEvent(w, "OrphanSPIREEntryFound") {
				t.Fatal("no OrphanSPIREEntryFound event")
			}
			if got := entryIDs(t, srv); !slices.Equal(got, all) {
				t.Fatalf("deleted before the grace period: %v", got)
			}
			w.clock.Step(grace + round)
			w.sweeper.SweepAll(ctx)
			wantLeft := all
			if !dryRun {
				wantLeft = slices.DeleteFunc(slices.Clone(all), func(id string) bool {
					return id == spire.EntryIDFor("uid-gone") || id == spire.AliasEntryIDFor("uid-gone")
				})
				if !hasEvent(w, "OrphanSPIREEntryRemoved") {
					t.Fatal("no OrphanSPIREEntryRemoved event")
				}
			}
			if got := entryIDs(t, srv); !slices.Equal(got, wantLeft) {
				t.Fatalf("entries %v, want %v", got, wantLeft)
			}
		})
	}
}

// TestDevIDAgentClaimUID: only a tpm_devid agent with HyperFleet's common
// name names a claim.
func TestDevIDAgentClaimUID(t *testing.T) {
	for _, c := range []struct {
		a    spire.Agent
		want string
	}{
		{spire.Agent{AttestationType: "tpm_devid", Selectors: []spire.Selector{{Type: "tpm_devid", Value: "issuer:cn:CA"}, spire.DevIDSelector("u1")}}, "u1"},
		{spire.Agent{AttestationType: "join_token", Selectors: []spire.Selector{spire.DevIDSelector("u1")}}, ""},
		{spire.Agent{AttestationType: "tpm_devid", Selectors: []spire.Selector{{Type: "tpm_devid", Value: "subject:cn:someone-else"}}}, ""},
		{spire.Agent{AttestationType: "tpm_devid", Selectors: []spire.Selector{{Type: "tpm_devid", Value: "subject:cn:hyperfleet.node.u1"}}}, ""},
	} {
		if got, ok := spire.DevIDAgentClaimUID(c.a); !ok && got != "" && c.want == "" {
			continue
		} else if got != c.want {
			t.Errorf("%+v: %q, want %q", c.a, got, c.want)
		}
	}
	for id, want := range map[string]string{"hyperfleet.u1": "u1", "hyperfleet.node.u1": "u1", "other.u1": "", "hyperfleet.": "", "hyperfleet.a.b.c": ""} {
		if got, ok := spire.EntryClaimUID(id); !ok && want == "" {
			continue
		} else if got != want {
			t.Errorf("EntryClaimUID(%q) = %q, want %q", id, got, want)
		}
	}
}
