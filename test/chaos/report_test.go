//go:build chaos

package chaos

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hyperfleet/hyperfleet/internal/testworld/devenv"
)

// report is docs/reliability.md: what the run injected, the invariants'
// results, convergence, failovers, the run's length and the load figures.
func (r *churn) report() string {
	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	secs := func(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }
	p("# Reliability\n\n")
	p("Written by the chaos run (`make test-chaos`, `test/chaos`; [testing.md](testing.md#chaos)), not by hand. ")
	p("The manager built from `cmd/hyperfleet` runs as two leader-elected replicas (lease %s) behind one address for webhooks and one for the agent server, ", strings.Join(leaseArgs, " "))
	p("against the real API server and three simulated Proxmox VE clusters: `%s` (one node), `%s` (three nodes on shared storage) and `%s` (in a network namespace of its own). ", devenv.ClusterName, clusterA, clusterB)
	p("Every VM runs the real agent, which downloads the runner and runs its job; the SPIFFE pool's VMs attest to the real SPIRE server.\n\n")
	p("| pool | cluster | min | max | jobs |\n|---|---|---|---|---|\n")
	for _, pool := range r.c.pools {
		note := ""
		if pool.Attest {
			note = " (SPIFFE)"
		}
		if pool.IPPool != nil {
			note = " (static addresses from an IPPool)"
		}
		p("| `%s`%s | `%s` | %d | %d | %d |\n", pool.Name, note, pool.Cluster, pool.MinReplicas, pool.MaxReplicas, len(r.jobs[pool.Name]))
	}
	p("\n**%d claims' jobs** (each VM runs one job of %s), fed at twice each pool's maximum; the jobs were done after %s and the whole run, load figures included, took %s. ",
		r.total, jobDuration, secs(r.feedLength), secs(r.length))
	p("The operator made %d GitHub REST calls with its PAT (%.1f per job; the PAT's budget is raised to %d an hour: at this churn a PAT's 5,000 run out, and the operator then keeps its reserve for cleanup and issues no new credential until the hour resets), and the clusters answered %d Proxmox VE API calls (%.1f per job), faults and retries included, by the time the jobs were done.\n\n",
		r.githubCalls, float64(r.githubCalls)/float64(r.total), githubRateLimit, r.proxmoxCalls, float64(r.proxmoxCalls)/float64(r.total))

	p("## What was injected\n\n")
	p("From 3 %% of the jobs to 95 %%, on every request class of every cluster: %.0f %% of Proxmox calls answered with a handler error (lock timeouts), %.0f %% dropped without an answer, %.0f %% of tasks failed, %.0f %% delayed by %s; ",
		proxmoxFaults.Classes["*"].ErrorRate*100, proxmoxFaults.Classes["*"].DropRate*100, proxmoxFaults.Classes["*"].TaskFailRate*100, proxmoxFaults.Classes["*"].SpikeRate*100, proxmoxFaults.Classes["*"].SpikeLatency.D())
	p("GitHub answered 3 %% of the operator's calls with 502 or 503 and lost 2 %% of its webhook deliveries. The counts are the simulators' own.\n\n")
	p("| fault | count |\n|---|---|\n")
	pve := map[string]int{}
	for _, sim := range r.c.sims {
		for kind, byClass := range sim.InjectedFaults() {
			for _, n := range byClass {
				pve[kind] += n
			}
		}
	}
	for _, kind := range slices.Sorted(maps.Keys(pve)) {
		p("| Proxmox: %s | %d |\n", kind, pve[kind])
	}
	gh := r.c.w.GitHub.InjectedFaults()
	for _, kind := range slices.Sorted(maps.Keys(gh)) {
		p("| GitHub: %s | %d |\n", kind, gh[kind])
	}
	for _, kind := range slices.Sorted(maps.Keys(r.injected)) {
		p("| %s | %d |\n", kind, r.injected[kind])
	}
	unplanned := r.unplanned
	if r.load != nil {
		unplanned -= r.load.replicaExits // reported with the load figures
	}
	p("| manager replicas that exited on their own (restarted, as a kubelet does) | %d |\n\n", unplanned)

	p("## Invariants\n\n")
	p("Checked every half second during the run (the first three) or at its end.\n\n| invariant | checks | result |\n|---|---|---|\n")
	for _, name := range invariantOrder {
		res := "holds"
		if v := r.rec.violations[name]; len(v) > 0 {
			res = "**FAILED**: " + strings.Join(v, "; ")
		}
		p("| %s | %d | %s |\n", name, r.rec.checks[name], res)
	}
	spilled, returned, before := r.overflowFigures()
	p("\nOverflow across clusters: `%s` (templateRef on `%s`, `spec.placement` template `%s` on `%s`, strategy pack) built %d VMs before the partition, %d on `%s` while `%s` was partitioned, and %d on `%s` again after it healed ([runnerpool.md](runnerpool.md#overflow-across-clusters)).\n",
		overflowPool, clusterB, devenv.OverflowTemplate(overflowPool), clusterA, before, spilled, clusterA, clusterB, returned, clusterB)
	p("\nConvergence: the pools were back to their minimum, with nothing left over, %s after the last fault ended (bound: %s).\n\n", secs(r.converged), convergenceBound)

	p("## Leader failovers\n\n")
	p("The leader killed with SIGKILL: how long until the standby held the lease (takeover), the longest the webhook receiver did not answer through its Service (probed every 100 ms; bound %s), and how long until a claim changed again after the takeover (controllers).\n\n", webhookGapBound)
	p("| kill | takeover | webhook gap | controllers |\n|---|---|---|---|\n")
	for i, f := range r.failovers {
		p("| %d | %s | %s | %s |\n", i+1, secs(f.takeover), secs(f.webhooks), secs(f.controllers))
	}
	p("\nA crashed leader's controllers pause for up to the lease duration; a leader stopped on purpose releases its lease ([high-availability.md](high-availability.md)).\n")

	if lf := r.load; lf != nil {
		p("\n## Load figures\n\n")
		p("After the churn, %d more clusters with a pool of at most %d VMs each; %d jobs queued at once, %d times (faults off).\n\n", lf.clusters, loadPerPool, lf.perCycle, len(lf.cycles))
		p("| cycle | all jobs started | all jobs done | back to zero claims | peak claims |\n|---|---|---|---|---|\n")
		for i, cy := range lf.cycles {
			p("| %d | %s | %s | %s later | %d |\n", i+1, secs(cy.up), secs(cy.done), secs(cy.down), cy.peakClaims)
		}
		p("\nAt most %d claims and %d VMs existed at once on the %d clusters.", lf.peakClaims, lf.peakVMs, lf.clusters)
		p(" Manager replicas that exited on their own during the cycles (restarted, as a kubelet does; the run's log gives each one's last line, such as a lease it could not renew in time): %d.\n", lf.replicaExits)
	}
	return b.String()
}
