package proxmox

import (
	"context"
	"strconv"
	"testing"

	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// BenchmarkEnsureVMPoll is the cost of one EnsureVM call while a clone
// task runs: the provider's own work plus one task-status GET over TLS on
// loopback. It is what every VM in transition costs per poll.
func BenchmarkEnsureVMPoll(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	spec := testSpec("runner-bench", "uid-bench")
	res, err := e.p.EnsureVM(ctx, spec, provider.Progress{})
	if err != nil {
		b.Fatal(err)
	}
	res, err = e.p.EnsureVM(ctx, spec, res.Progress)
	if err != nil || res.Phase != provider.PhaseCloning || res.Progress.Task == nil {
		b.Fatalf("%+v %v", res, err)
	}
	prog := res.Progress
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, err := e.p.EnsureVM(ctx, spec, prog)
		if err != nil || r.Phase != provider.PhaseCloning {
			b.Fatalf("%+v %v", r, err)
		}
	}
}

// BenchmarkEnsureVMPlace is the cost of placing a VM (id and node chosen
// in-process from a cached listing; no API call while the cache is fresh):
// the operator's share of "claim created -> clone request sent".
func BenchmarkEnsureVMPlace(b *testing.B) {
	e := newEnv(b, func(_ *proxmoxsim.Config, cfg *provider.ClusterConfig) { cfg.VMIDEnd = 999999 })
	ctx := context.Background()
	if _, err := e.p.EnsureVM(ctx, testSpec("warm", "uid-warm"), provider.Progress{}); err != nil {
		b.Fatal(err)
	}
	specs := make([]*provider.VMSpec, b.N)
	for i := range specs {
		specs[i] = testSpec("runner-bench", "uid-"+strconv.Itoa(i))
		specs[i].MemoryHint = 1
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.p.EnsureVM(ctx, specs[i], provider.Progress{}); err != nil {
			b.Fatal(err)
		}
	}
}
