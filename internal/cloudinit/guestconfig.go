package cloudinit

import (
	"fmt"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// GuestAgentConfigPath is where the operator places the agent's
// configuration through the hypervisor's guest channel, for VMs whose
// cloud-init comes from the hypervisor's own drive rather than the NoCloud
// ISO (docs/cloud-init.md, "Delivery"): in the root-only tmpfs directory
// the VM's secrets arrive in, so that the file never rests on a disk or on
// a storage and no VM config field (which the hypervisor lets auditors
// read) carries it.
const GuestAgentConfigPath = agentconfig.SecretsDir + "/agent.json"

// GuestAgentUnit is the agent's systemd unit for such a VM: the unit the
// NoCloud ISO's user-data writes, reading its configuration from
// GuestAgentConfigPath instead. The static kit a kind's own cloud-init
// delivery installs carries it (pkg/provider/<kind>). powerOff is
// Vars.PowerOffOnFinish: the unit then stops the VM however the agent
// ends, as the ISO's unit does.
func GuestAgentUnit(powerOff bool) string { return agentUnitAt(GuestAgentConfigPath, powerOff) }

// AgentConfigFile is the agent's configuration for v as the file the
// operator places at GuestAgentConfigPath: the same document the NoCloud
// ISO's user-data writes to AgentConfigPath.
func AgentConfigFile(v *Vars) ([]byte, error) {
	cfg := agentConfig(v)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("vars: the agent config they produce is invalid: %w", err)
	}
	return cfg.Marshal()
}
