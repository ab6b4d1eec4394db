//go:build bench

package bench

import (
	"github.com/hyperfleet/hyperfleet/internal/testworld/bench"
)

// callTargets are the calls a job's life should make, with how many and
// why. A call not listed here has no target: the report shows it with its
// count so that a new one is noticed.
var callTargets = map[string]struct {
	target float64
	reason string
}{
	"Proxmox POST /nodes/{nodes}/qemu/{id}/clone":                       {1, "create the VM (linked clone of the template)"},
	"Proxmox POST /nodes/{nodes}/qemu/{id}/config":                      {2, "set the VM's resources, tags, ownership marker and NoCloud seed"},
	"Proxmox PUT /nodes/{nodes}/qemu/{id}/config":                       {2, "configure the VM (resources, network, seed ISO, tags, name), then eject the seed ISO once the guest is up"},
	"Proxmox POST /nodes/{nodes}/storage/{storage}/upload":              {1, "upload the VM's NoCloud seed ISO"},
	"Proxmox POST /nodes/{nodes}/qemu/{id}/status/start":                {1, "power the VM on"},
	"Proxmox POST /nodes/{nodes}/qemu/{id}/status/stop":                 {1, "stop the VM before destroying it"},
	"Proxmox DELETE /nodes/{nodes}/qemu/{id}":                           {1, "destroy the VM"},
	"Proxmox GET /nodes/{nodes}/tasks/{upid}/status":                    {6, "follow each task (clone, upload, start, ISO deletion, destroy) once it is due (learnt durations)"},
	"Proxmox GET /nodes/{nodes}/qemu/{id}/status/current":               {1, "read a VM in transition: a power-off notice or the listing says it stopped"},
	"Proxmox GET /nodes/{nodes}/qemu/{id}/config":                       {4, "the ownership marker before configuring, ejecting and destroying; once more after the destroy (gone only when the hypervisor says so)"},
	"Proxmox GET /nodes/{nodes}/storage/{storage}/content/{volume}":     {1, "look for the seed ISO when a VM's state is read back (a restart lost it)"},
	"Proxmox DELETE /nodes/{nodes}/storage/{storage}/content/{volume}":  {1, "delete the seed ISO once the guest is up (with the eject)"},
	"Proxmox GET /nodes/{nodes}/storage/{storage}/content":              {0, "the orphan sweeper's ISO listing (per sweep, not per job)"},
	"Proxmox GET /nodes/{nodes}/qemu/{id}/agent/network-get-interfaces": {2, "the VM's address from the guest agent, for the claim's status"},
	"Proxmox GET /nodes":   {1, "pick the node to clone on (free memory)"},
	"Proxmox GET /version": {0, "a provider client's connection check (per client, not per job)"},
	"GitHub GET /api/v3/repos/{owner}/{repo}/actions/runs/{id}/jobs":      {0, "the pool's resync reading queued jobs (per pool and interval, not per job)"},
	"GitHub GET /api/v3/repos/{owner}/{repo}/actions/runs":                {0, "the pool's resync listing queued runs (per pool and interval, not per job)"},
	"GitHub GET /api/v3/repos/{owner}/{repo}/actions/jobs/{id}":           {1, "confirm a webhook's job before acting on it"},
	"Proxmox GET /cluster/resources":                                      {0, "the cluster's poll (per cluster, not per job; amortised over the jobs of its period)"},
	"GitHub POST /api/v3/orgs/{owner}/actions/runners/generate-jitconfig": {1, "the VM's single-use runner registration"},
	"GitHub DELETE /api/v3/orgs/{owner}/actions/runners/{id}":             {1, "remove the runner when its claim ends"},
	"GitHub GET /api/v3/orgs/{owner}/actions/runners":                     {0, "the pool's resync (per pool and interval, not per job)"},
	// Kubernetes: at most 8 writes and 1 read per job (test/e2e's
	// TestKubernetesRequestsPerJob counts the same by resource).
	"Kubernetes POST":   {2, "create the claim and the job's CIJob record; events only where a person acts (warnings, a failed claim, an admin's action), not for routine steps (a claim's credential delivery and job start, a pool's scaling: log lines)"},
	"Kubernetes PATCH":  {3.5, "the claim's status once per pass and only when it changed: its VM reserved (status.vmRef with its placement record, before the clone request; a wait for a clone slot is a step of the build's one condition: machineclaim/vm.go), the VM up with its credential delivered, the runner online with its job (no hypervisor task is written: machineclaim/vm_progress.go; the routine end is held in memory: machineclaim/end_held.go); the finalizer's removal, which labels the claim finished; the pool's counts batched (runnerpool_statusbatch.go)"},
	"Kubernetes PUT":    {2, "the job's CIJob record moving from queued to in progress and completed"},
	"Kubernetes DELETE": {0.5, "finished claims deleted by collection: one request for the claims of a namespace that finish while the one before it is on its way (machineclaim/finished.go); one per claim when they finish apart"},
	"Kubernetes GET":    {1, "uncached reads: the CI platform's credentials Secret, once per version (internal/manager's credentialReads, with the pools' namespaces in --secret-namespaces)"},
}

func callRow(api, key string, perJob float64) bench.Calls {
	c := bench.Calls{API: api, Call: key, PerJob: perJob, Reason: "(no target: not expected per job)"}
	if t, ok := callTargets[api+" "+key]; ok {
		c.Target, c.Reason = t.target, t.reason
	}
	return c
}
