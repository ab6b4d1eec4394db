//go:build chaos

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
	"github.com/hyperfleet/hyperfleet/internal/testworld/eventdump"
	"github.com/hyperfleet/hyperfleet/internal/testworld/netns"
	proxmoxsim "github.com/hyperfleet/hyperfleet/internal/testworld/simulator/proxmox"
	"github.com/hyperfleet/hyperfleet/test/managerproc"
)

// The run's clusters: the world's own (local-pve), a three-node cluster
// with shared storage (one node goes offline), and one in a network
// namespace (partitioned from the manager).
const (
	clusterA        = "pve-a"
	clusterB        = "pve-b"
	offlineNode     = "pve2"
	partitionedPool = "b-dhcp"
	staticPool      = "a-static"
	// overflowPool builds its VMs on cluster B and spills them to cluster
	// A (spec.placement) while B is partitioned.
	overflowPool = "b-overflow"
	// overflowQueue is how many of overflowPool's jobs the run keeps
	// queued (the other pools', twice their maximum): its claims on B then
	// stay under its maxReplicas, so that the claims its VMs on B hold
	// while B is partitioned (ended, their VMs not deletable until B is
	// back, each holding its place under maxReplicas) leave room for the
	// claims that spill to A. A pool at its maximum on a partitioned
	// cluster has nothing to spill: every place is held.
	overflowQueue = 2
)

// chaosPools are the run's pools: the world's SPIFFE pool (attesting VMs,
// so SPIRE entries can leak), two on cluster A (DHCP and static addresses
// from an IPPool), one on the partitioned cluster B, and one on B that
// overflows to A.
func chaosPools() []devenv.PoolSpec {
	return []devenv.PoolSpec{
		{Name: devenv.PoolName, Cluster: devenv.ClusterName, Label: devenv.JobLabel, MinReplicas: 0, MaxReplicas: 3, Attest: true},
		{Name: "a-dhcp", Cluster: clusterA, Label: "chaos-a-dhcp", MinReplicas: 1, MaxReplicas: 8},
		{Name: staticPool, Cluster: clusterA, Label: "chaos-a-static", MinReplicas: 1, MaxReplicas: 5,
			IPPool: &hfv1.IPPoolSpec{Addresses: []string{"192.168.50.10-192.168.50.40"}, Prefix: 24, Gateways: []string{"192.168.50.1"}}},
		{Name: partitionedPool, Cluster: clusterB, Label: "chaos-b-dhcp", MinReplicas: 1, MaxReplicas: 8},
		{Name: overflowPool, Cluster: clusterB, OverflowCluster: clusterA, Label: "chaos-b-overflow", MinReplicas: 1, MaxReplicas: 8},
	}
}

// githubRateLimit is the PAT's hourly budget on the GitHub simulator.
const githubRateLimit = 200000

// The lease timings of the run's replicas: a crashed leader is replaced
// within 10 s. (4 s renew deadlines made leaders give up under the load
// of the run, a finding written in docs/high-availability.md.)
var leaseArgs = []string{"--leader-elect-lease-duration=10s", "--leader-elect-renew-deadline=8s", "--leader-elect-retry-period=2s"}

// chaosWorld is the run's world and the manager's replicas.
type chaosWorld struct {
	t    *testing.T
	w    *devenv.World
	dep  *managerproc.Deployment
	sims map[string]*proxmoxsim.Simulator
	link *netns.Link
	// replicas are the live replicas; dead are the killed or exited ones
	// (their logs stay).
	replicas, dead []*managerproc.Process
	// webhook and agent are the Services in front of the replicas.
	webhook, agent *managerproc.Service
	pools          []devenv.PoolSpec
	// githubCalls counts the calls the GitHub simulator received with
	// the PAT (the operator's), proxmoxCalls every Proxmox VE API call.
	githubCalls, proxmoxCalls atomic.Int64
}

// startWorld brings the world up: the API server, the simulators, the
// three clusters, the pools and two manager replicas.
func startWorld(t *testing.T, dir string) *chaosWorld {
	t.Helper()
	ctx := context.Background()
	agentBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet-agent")
	managerBin := managerproc.GoBuild(t, dir, "./cmd/hyperfleet")
	c := &chaosWorld{t: t, pools: chaosPools()}
	w, err := devenv.Start(ctx, devenv.Options{
		Dir: filepath.Join(dir, "world"), AgentBinary: agentBin, ExternalOperator: true, AgentFromOperator: true,
		SPIFFE: true, MinReplicas: 0, MaxReplicas: 3,
		// 1,000 claims in a quarter of an hour take more than a PAT's
		// 5,000 calls an hour (the first full run stalled on it, the
		// operator keeping its reserve for cleanup, as it should); the
		// report states the calls made per claim.
		GitHubRateLimit: githubRateLimit,
		OnGitHubRequest: func(r *http.Request) {
			// The operator's calls: those made with the PAT (the runners
			// use their own credentials).
			if strings.HasSuffix(r.Header.Get("Authorization"), devenv.PAT) {
				c.githubCalls.Add(1)
			}
		},
		OnProxmoxRequest: func(*http.Request) { c.proxmoxCalls.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	c.w, c.sims = w, map[string]*proxmoxsim.Simulator{devenv.ClusterName: w.Proxmox}
	// Cluster B lives in a network namespace of its own; its name is
	// unique per process so that runs do not collide.
	removeStaleLinks(t)
	link, err := netns.Create(fmt.Sprintf("hfch%d", os.Getpid()%1000000), netip.MustParsePrefix("10.242.0.0/30"))
	if err != nil {
		t.Fatal(err)
	}
	c.link = link
	t.Cleanup(func() { _ = link.Close() })
	lnB, err := link.Listen("0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := w.AddCluster(ctx, devenv.ClusterSpec{Name: clusterA, Configure: threeNodes, VMIDs: hfv1.VMIDRange{Start: 3000, End: 3999}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := w.AddCluster(ctx, devenv.ClusterSpec{Name: clusterB, Listener: lnB, VMIDs: hfv1.VMIDRange{Start: 2000, End: 2999}})
	if err != nil {
		t.Fatal(err)
	}
	c.sims[clusterA], c.sims[clusterB] = a.Sim, b.Sim
	for _, p := range c.pools[1:] {
		if err := w.AddPool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	c.webhook, c.agent = managerproc.NewService(t), managerproc.NewService(t)
	c.dep = managerproc.Prepare(t, w, managerproc.Options{
		Binary: managerBin, AgentBinary: agentBin, CAFile: w.OperatorInputs().GitHubCAFile,
		LeaderElect: true, AgentServerURL: "https://" + c.agent.Addr,
		Args: append([]string{
			// Every guest comes from 127.0.0.1 through the Service, as
			// behind a load balancer.
			"--agent-server-max-conns-per-address=-1",
			// Orphans made by the faults are removed within the run.
			"--orphan-grace-period=1m",
		}, leaseArgs...),
	})
	for range 2 {
		c.startReplica()
	}
	if err := w.ConnectOperator(ctx, "https://"+c.webhook.Addr+"/webhooks/github"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range append(c.dead, c.replicas...) {
				if b, err := os.ReadFile(p.LogFile); err == nil {
					t.Logf("%s (last 6 KiB):\n%s", filepath.Base(p.LogFile), managerproc.Tail(b, 6<<10))
				}
			}
			t.Logf("events:\n%s", eventdump.Format(context.Background(), w.API.Client, nil, devenv.Namespace, "default"))
		}
	})
	return c
}

// threeNodes makes cluster A three nodes whose VMs live on shared storage,
// so that VMs can be placed on any node and one node can go offline.
func threeNodes(cfg *proxmoxsim.Config) {
	n := cfg.Nodes[0]
	cfg.Nodes = nil
	for i, name := range []string{"pve1", offlineNode, "pve3"} {
		node := n
		node.Name, node.IP = name, fmt.Sprintf("192.0.2.%d", 11+i)
		cfg.Nodes = append(cfg.Nodes, node)
	}
	cfg.Storages = append(cfg.Storages, proxmoxsim.StorageConfig{ID: "ceph", Type: "rbd", Content: []string{"images"}, Shared: true, Capacity: 4 << 40})
	cfg.Templates[0].Storage, cfg.Templates[0].CloudInitStorage = "ceph", "ceph"
}

// startReplica starts one more manager replica and puts it behind the
// Services.
func (c *chaosWorld) startReplica() *managerproc.Process {
	p := c.dep.Start(c.t)
	c.replicas = append(c.replicas, p)
	c.updateServices()
	return p
}

// updateServices points the Services at the live replicas.
func (c *chaosWorld) updateServices() {
	var hooks, agents []string
	for _, p := range c.replicas {
		hooks = append(hooks, p.WebhookAddr)
		agents = append(agents, p.AgentServerAddr)
	}
	c.webhook.SetBackends(hooks...)
	c.agent.SetBackends(agents...)
}

// leader is the live replica holding the lease (nil if none does).
func (c *chaosWorld) leader() *managerproc.Process {
	for _, p := range c.replicas {
		if ok, err := p.IsLeader(); err == nil && ok {
			return p
		}
	}
	return nil
}

// kill kills p (SIGKILL) and takes it out of the live replicas.
func (c *chaosWorld) kill(p *managerproc.Process) {
	p.Kill()
	c.bury(p)
}

// bury moves p from the live replicas to the dead.
func (c *chaosWorld) bury(p *managerproc.Process) {
	for i, r := range c.replicas {
		if r == p {
			c.replicas = append(c.replicas[:i], c.replicas[i+1:]...)
			break
		}
	}
	c.dead = append(c.dead, p)
	c.updateServices()
}

// setProxmoxFaults sets f on every cluster.
func (c *chaosWorld) setProxmoxFaults(f proxmoxsim.Faults) {
	for name, sim := range c.sims {
		g := f
		if name != clusterA {
			g.OfflineNodes = nil
		}
		if err := sim.SetFaults(g); err != nil {
			c.t.Fatalf("faults on %s: %v", name, err)
		}
	}
}

// removeStaleLinks deletes the namespaces of earlier runs killed before
// their cleanup (their addresses would collide).
func removeStaleLinks(t *testing.T) {
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "hfch") {
			l := &netns.Link{Name: e.Name()}
			if err := l.Close(); err != nil {
				t.Logf("remove stale namespace %s: %v", e.Name(), err)
			}
		}
	}
}
