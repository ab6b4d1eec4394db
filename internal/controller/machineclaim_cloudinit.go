package controller

import (
	"context"
	"errors"
	"fmt"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/internal/cloudinit"
	"github.com/hyperfleet/hyperfleet/pkg/provider"
)

// errRender marks cloud-init the user's template cannot render: a
// configuration error to fix in the HypervisorMachineTemplate.
var errRender = errors.New("render cloud-init")

// renderCloudInit renders the NoCloud data of a claim's VM: the template's
// cloud-init merged with the operator's, with the workload credential from
// the BootstrapSource.
func (r *MachineClaimReconciler) renderCloudInit(ctx context.Context, claim *hfv1.MachineClaim, tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, addr staticAddr) (provider.CloudInit, error) {
	vars := claimVars(claim, tmpl, cluster, addr)
	if r.Bootstrap != nil {
		if err := r.Bootstrap.BootstrapVars(ctx, claim, tmpl, &vars); err != nil {
			return provider.CloudInit{}, fmt.Errorf("workload bootstrap data: %w", err)
		}
	}
	out, err := cloudinit.Render(cloudInitInput(tmpl, vars))
	if err != nil {
		return provider.CloudInit{}, fmt.Errorf("%w of HypervisorMachineTemplate %s: %w", errRender, tmpl.Name, err)
	}
	return provider.CloudInit{UserData: out.UserData, MetaData: out.MetaData, NetworkConfig: out.NetworkConfig}, nil
}

func cloudInitInput(tmpl *hfv1.HypervisorMachineTemplate, vars cloudinit.Vars) cloudinit.Input {
	in := cloudinit.Input{Vars: vars}
	if ci := tmpl.Spec.CloudInit; ci != nil {
		in.UserData, in.NetworkData, in.MetaData = ci.UserData, ci.NetworkData, ci.MetaData
	}
	return in
}
