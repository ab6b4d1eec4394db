//go:build !windows

package main

import (
	"io"

	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// Defaults of a Linux VM: the systemd unit's config path, the runner's
// own user, systemd's power-off.
const (
	defaultConfigPath = agentconfig.Path
	defaultRunAs      = agentconfig.DefaultRunnerUser
	defaultPowerOff   = "systemctl poweroff"
)

// platformCommand handles what only one OS has (Windows' service
// commands); none here.
func platformCommand([]string, io.Writer, io.Writer) (int, bool) { return 0, false }
