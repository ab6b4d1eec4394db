package v1alpha1

// EndReason is why a claim's VM ends: the reason a RunnerPool gives in a
// claim's spec.end, or the one the claim controller records in status.end.
// It is also the runner outcome counted by hyperfleet_runner_outcomes_total.
type EndReason string

const (
	// EndJobCompleted: the runner ran its one job.
	EndJobCompleted EndReason = "job_completed"
	// EndIdleTimeout: registered, but no job came within idleTimeout.
	EndIdleTimeout EndReason = "idle_timeout"
	// EndMaxLifetime: the VM reached maxLifetime (a hard limit).
	EndMaxLifetime EndReason = "max_lifetime"
	// EndJobTimeout: the job ran longer than jobTimeout (a hard limit).
	EndJobTimeout EndReason = "job_timeout"
	// EndBootstrapTimeout: the runner did not register within bootstrapTimeout.
	EndBootstrapTimeout EndReason = "bootstrap_timeout"
	// EndDriftReplaced: built from an older template; replaced by a fresh VM.
	EndDriftReplaced EndReason = "drift_replaced"
	// EndScaledDown: an idle VM removed because demand fell (or a standby
	// VM because its pool's standby tier was made smaller).
	EndScaledDown EndReason = "scaled_down"
	// EndStandbyExpired: a standby VM stood by, suspended, for its pool's
	// standby.maxAge; a fresh one replaces it.
	EndStandbyExpired EndReason = "standby_expired"
	// EndOrphaned: the orphan sweeper destroyed a VM that had no claim.
	EndOrphaned EndReason = "orphaned"
	// EndFailed: provisioning failed for good, or the VM's ownership did
	// not verify.
	EndFailed EndReason = "failed"
	// EndPoweredOff: the VM powered off (or vanished) on its own.
	EndPoweredOff EndReason = "powered_off"
	// EndDeleted: the claim was deleted by someone else.
	EndDeleted EndReason = "deleted"
	// EndDisowned: a platform admin released the claim's VM from
	// HyperFleet's management (annotation hyperfleet.io/disown); the VM
	// was kept, not destroyed.
	EndDisowned EndReason = "disowned"
)

// Hard reports whether the reason is a hard limit: it ends a busy runner,
// after its pool cancelled its job on the CI platform
// (docs/architecture.md, "Teardown never kills a busy runner").
func (r EndReason) Hard() bool { return r == EndMaxLifetime || r == EndJobTimeout }

// endConditionReasons are the condition reasons of the end reasons.
var endConditionReasons = map[EndReason]ConditionReason{
	EndJobCompleted:     JobCompletedReason,
	EndIdleTimeout:      IdleTimeoutReason,
	EndMaxLifetime:      MaxLifetimeReason,
	EndJobTimeout:       JobTimeoutReason,
	EndBootstrapTimeout: BootstrapTimeoutReason,
	EndDriftReplaced:    DriftReplacedReason,
	EndScaledDown:       ScaledDownReason,
	EndStandbyExpired:   StandbyExpiredReason,
	EndOrphaned:         OrphanedReason,
	EndFailed:           ProvisioningFailedReason,
	EndPoweredOff:       VMPoweredOffReason,
	EndDeleted:          DeletedReason,
	EndDisowned:         DisownedReason,
}

// ConditionReason is the reason's condition reason (and event reason):
// job_completed is JobCompleted. An unknown reason is Ended.
func (r EndReason) ConditionReason() ConditionReason {
	if c, ok := endConditionReasons[r]; ok {
		return c
	}
	return EndedReason
}

// EndRequested reports whether the claim was asked to end: its pool set
// spec.end or it is being deleted.
func (c *MachineClaim) EndRequested() bool {
	return c.Spec.End != nil || !c.DeletionTimestamp.IsZero()
}

// HardEnd reports whether the claim's pool ends it for a hard limit, which
// does not wait for a busy runner.
func (c *MachineClaim) HardEnd() bool {
	return c.Spec.End != nil && c.Spec.End.Reason.Hard()
}

// Ended reports whether the claim began to end (Terminating, Failed or
// Finished): its VM is destroyed, kept stopped or already gone.
func (c *MachineClaim) Ended() bool { return c.Status.End != nil }

// HasFailed reports whether the claim failed.
func (c *MachineClaim) HasFailed() bool { return c.Status.End != nil && c.Status.End.Failed }

// IsFinished reports whether the claim's VM is gone and the claim is kept
// as history.
func (c *MachineClaim) IsFinished() bool {
	return c.Status.End != nil && c.Status.End.FinishedAt != nil
}

// EndReason is why the claim ended (empty while it has not).
func (c *MachineClaim) EndReason() EndReason {
	if c.Status.End == nil {
		return ""
	}
	return c.Status.End.Reason
}
