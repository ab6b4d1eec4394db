package machineclaim

import (
	"cmp"
	"context"
	"fmt"
	"time"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/internal/controller/machineclaim/stuck"
	"github.com/hyperfleet/hyperfleet/internal/vmspec"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// claimCloudInit renders the NoCloud data of a claim's VM when the provider
// delivers it: the template's cloud-init, the operator's per-VM values and
// the workload's runner settings from the reconciler's CI platforms. It holds no
// secret that could be used before the VM runs: the runner credential (or
// the join token) reaches the running VM only (guestsecrets.go), and
// the seed names where and until when (agentconfig's secretsFile and
// secretsDeadline).
type claimCloudInit struct {
	r       *Reconciler
	claim   *hfv1.MachineClaim
	tmpl    *hfv1.HypervisorMachineTemplate
	cluster *hfv1.HypervisorCluster
	addrs   []vmspec.StaticAddr
}

// Render implements provider.CloudInitSource.
func (c *claimCloudInit) Render(ctx context.Context) (provider.CloudInit, error) {
	vars, err := c.vars(ctx)
	if err != nil {
		return provider.CloudInit{}, err
	}
	out, err := cloudinit.Render(vmspec.Input(c.tmpl, vars))
	if err != nil {
		return provider.CloudInit{}, fmt.Errorf("%w of HypervisorMachineTemplate %s: %w", vmspec.ErrRender, c.tmpl.Name, err)
	}
	return provider.CloudInit{UserData: out.UserData, MetaData: out.MetaData, NetworkConfig: out.NetworkConfig}, nil
}

// AgentConfig is the agent's configuration file of the claim's VM under
// delivery proxmox, which the operator places in the running VM
// (cloudinit.GuestAgentConfigPath) because Proxmox's drive cannot carry
// it: the same document the NoCloud ISO carries, built the same way.
func (c *claimCloudInit) AgentConfig(ctx context.Context) ([]byte, error) {
	vars, err := c.vars(ctx)
	if err != nil {
		return nil, err
	}
	return cloudinit.AgentConfigFile(&vars)
}

// vars are the claim's cloud-init variables, the agent's included.
func (c *claimCloudInit) vars(ctx context.Context) (cloudinit.Vars, error) {
	vars := vmspec.ClaimVars(c.r.workloads(), c.claim, c.tmpl, c.cluster, c.addrs)
	// The user the VM's SPIRE entry selects, when it has one.
	vars.ScriptUser = c.r.Identity.scriptUser(c.r.workloads(), c.tmpl)
	if err := vmspec.SetAgentVars(c.r.workloads(), c.tmpl, c.r.Agent, &vars); err != nil {
		// The template is not Ready in this case; only a claim that passed
		// before an operator restart without the agent server gets here.
		return vars, provider.Errorf(provider.ClassConfiguration, string(hfv1.AgentUnavailableReason), "HypervisorMachineTemplate %s: %w", c.tmpl.Name, err)
	}
	if vars.SPIFFEEnabled {
		if err := c.r.Identity.vars(ctx, c.r.Client, c.claim, c.cluster, &vars); err != nil {
			return vars, provider.Errorf(provider.ClassTransient, string(hfv1.SPIREUnavailableReason), "the VM's SPIFFE identity: %w", err)
		}
	}
	vars.PowerOffNotify = c.r.PowerOff.Notices.NotifyFor(c.claim)
	vars.SecretsDeadline = cloudinit.Time{Time: c.r.secretsDeadline()}
	// Render check first: a broken template never reaches the workload
	// side (and is never Ready: the template controller runs the same
	// check).
	if err := vmspec.CheckRender(c.r.workloads(), c.tmpl, vars); err != nil {
		return vars, err
	}
	if ci := c.r.CI; ci != nil && !vars.SPIFFEEnabled {
		if err := ci.BootstrapVars(ctx, c.claim, c.tmpl, &vars); err != nil {
			return vars, fmt.Errorf("workload bootstrap data: %w", err)
		}
	}
	return vars, nil
}

// secretsDeadline is until when a VM rendered now waits for the secrets the
// operator places in it: the rest of its provisioning (start and boot)
// and its bootstrapping, at the bounds past which the claim is reported
// stuck (--claim-stuck-provisioning, --claim-stuck-bootstrapping; their
// defaults when disabled). A VM whose secrets never come then powers off
// and its claim ends, instead of idling until the pool's bootstrapTimeout.
func (r *Reconciler) secretsDeadline() time.Time {
	def := stuck.DefaultBounds()
	b := r.Stuck.Bounds
	return r.Clock.Now().Add(cmp.Or(b.Provisioning, def.Provisioning) + cmp.Or(b.Bootstrapping, def.Bootstrapping))
}
