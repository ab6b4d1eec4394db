package agent

import (
	"fmt"
	"io"
)

// BuildkiteBootstrap is not built for Windows: the Buildkite agent runs on
// Linux VMs only (agentconfig's platform buildkite).
func BuildkiteBootstrap(_ []string, stderr io.Writer) int {
	fmt.Fprintf(stderr, "hyperfleet-agent %s: not built for Windows; the Buildkite agent runs on Linux VMs only\n", BuildkiteBootstrapCommand)
	return 2
}
