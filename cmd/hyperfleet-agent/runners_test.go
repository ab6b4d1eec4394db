package main

import (
	"slices"
	"testing"

	"github.com/hyperfleet/hyperfleet/internal/agent"
	"github.com/hyperfleet/hyperfleet/internal/agentconfig"
)

// TestEveryPlatformHasARunnerKind: the agent runs every platform whose
// part of the agent config it links (an agent that knows a platform's
// config but not its runner would call a valid file unsupported), and
// knows no runner without its config.
func TestEveryPlatformHasARunnerKind(t *testing.T) {
	registerRunners()
	configs, runners := agentconfig.RegisteredPlatforms(), agent.RegisteredRunners()
	if !slices.Equal(configs, runners) || len(runners) < 4 {
		t.Errorf("the agent runs platforms %q; its config knows %q", runners, configs)
	}
}
