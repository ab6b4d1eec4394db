package cloudinit

import "testing"

// TestJobMayEscalateReachesTheAgent: the template's
// spec.guest.jobMayEscalate is the agent's jobMayEscalate, and absent
// unless set (the agent then refuses an escalating job user for a
// multi-job credential: internal/agent/harden.go).
func TestJobMayEscalateReachesTheAgent(t *testing.T) {
	v := baseVars()
	if cfg := renderedAgentConfig(t, v); cfg.JobMayEscalate {
		t.Error("jobMayEscalate set without the template's")
	}
	v.JobMayEscalate = true
	if cfg := renderedAgentConfig(t, v); !cfg.JobMayEscalate {
		t.Error("the template's jobMayEscalate did not reach agent.json")
	}
}
