package machineclaim

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"pgregory.net/rapid"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/proptest"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
)

// memoryWrites are every way the reconciler records something about a
// claim in its memory (claimMemory's writers), by name.
var memoryWrites = map[string]func(m *claimMemory, uid types.UID){
	"failed":          func(m *claimMemory, uid types.UID) { m.failed(uid) },
	"retryAt":         func(m *claimMemory, uid types.UID) { m.setRetryAt(uid, unitEpoch) },
	"hold":            func(m *claimMemory, uid types.UID) { m.hold(uid, heldProvision{claim: 1, until: unitEpoch}) },
	"progress":        func(m *claimMemory, uid types.UID) { m.keepProgress(uid, provider.Progress{ID: "101", Node: "pve1"}) },
	"minted":          func(m *claimMemory, uid types.UID) { m.putMinted(uid, workload.Credential{RunnerID: 7}) },
	"dnsRegistered":   func(m *claimMemory, uid types.UID) { m.registeredDNS(uid, "key name 192.0.2.1") },
	"dnsRemoveFailed": func(m *claimMemory, uid types.UID) { m.dnsRemoveFailed(uid) },
	"deletedGone":     func(m *claimMemory, uid types.UID) { m.markDeletedGone(uid) },
	"heldEnd":         func(m *claimMemory, uid types.UID) { m.holdEnd(uid, &hfv1.MachineClaimStatus{}) },
	"startRound":      func(m *claimMemory, uid types.UID) { m.startRound(uid) },
	"finishedRound": func(m *claimMemory, uid types.UID) {
		m.startRound(uid)
		m.finishRound(uid, validationRound{finished: unitEpoch})
	},
}

// TestEveryMemoryWriteIsRemembered: each writer leaves something in the
// claim's record (else the property below would prove nothing about it).
func TestEveryMemoryWriteIsRemembered(t *testing.T) {
	for name, write := range memoryWrites {
		var m claimMemory
		write(&m, "uid-a")
		if reflect.DeepEqual(m.recall("uid-a"), claimRecord{}) {
			t.Errorf("%s left nothing in the claim's record", name)
		}
	}
}

// TestForgetDropsEverythingOfTheClaim: whatever was recorded about
// claims, in whatever order, Forget of one leaves nothing of it (its
// record reads as the zero record, every field of it, including any added
// later) and leaves the other claims' records as they were.
func TestForgetDropsEverythingOfTheClaim(t *testing.T) {
	names := make([]string, 0, len(memoryWrites))
	for n := range memoryWrites {
		names = append(names, n)
	}
	slices.Sort(names) // a draw must name the same write on a rerun
	proptest.Check(t, 100, func(t *rapid.T) {
		var m claimMemory
		uids := []types.UID{"uid-a", "uid-b", "uid-c"}
		for i := range rapid.IntRange(0, 30).Draw(t, "writes") {
			uid := rapid.SampledFrom(uids).Draw(t, fmt.Sprintf("claim%d", i))
			memoryWrites[rapid.SampledFrom(names).Draw(t, fmt.Sprintf("write%d", i))](&m, uid)
		}
		gone := rapid.SampledFrom(uids).Draw(t, "gone")
		before := map[types.UID]string{}
		for _, uid := range uids {
			before[uid] = fmt.Sprintf("%+v", m.recall(uid))
		}
		m.Forget(gone)
		if m.remembers(gone) || !reflect.DeepEqual(m.recall(gone), claimRecord{}) {
			t.Fatalf("after Forget(%s): %+v is remembered", gone, m.recall(gone))
		}
		// A round that was running when the claim went is dropped when it
		// ends.
		m.finishRound(gone, validationRound{finished: unitEpoch.Add(time.Second)})
		if _, finished, running := m.takeRound(gone); finished || running {
			t.Fatalf("after Forget(%s): a round of it is finished %v, running %v", gone, finished, running)
		}
		for _, uid := range uids {
			if uid != gone && fmt.Sprintf("%+v", m.recall(uid)) != before[uid] {
				t.Fatalf("Forget(%s) changed claim %s: %s, was %s", gone, uid, fmt.Sprintf("%+v", m.recall(uid)), before[uid])
			}
		}
	})
}
