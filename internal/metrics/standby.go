package metrics

// The standby tier (docs/runnerpool.md, "Standby"): VMs suspended to disk
// and resumed one per job.
var (
	// PoolStandby counts each RunnerPool's standby VMs by state: ready
	// (suspended, waiting), refilling (being built, booted or suspended)
	// and resuming (taken for a job, runner not online yet).
	PoolStandby = NewGaugeVec("runnerpool_standby_vms",
		"A RunnerPool's standby tier by state: ready (suspended to disk), refilling (being built, booted or suspended), resuming (taken for a job, runner not online yet).",
		"namespace", "pool", "state")

	// PoolStandbySize is each RunnerPool's standby tier size after its
	// schedules.
	PoolStandbySize = NewGaugeVec("runnerpool_standby_size",
		"The size of a RunnerPool's standby tier: spec.standby.size, or the largest open schedule window's standby.",
		"namespace", "pool")

	// StandbyRefillShort counts the pool passes that left the tier short
	// of its size, by why: max_replicas (no room under
	// spec.scaling.maxReplicas) or blocked (new VMs are paused: the
	// template, the cluster or the scope is not ready).
	StandbyRefillShort = NewCounterVec("runnerpool_standby_refill_short_total",
		"RunnerPool passes that left the standby tier below its size, by reason (max_replicas, blocked).",
		"namespace", "pool", "reason")

	// StandbyTransitions counts standby VMs suspended and resumed, and
	// the suspends and resumes the hypervisor refused for good.
	StandbyTransitions = NewCounterVec("standby_transitions_total",
		"Standby VMs suspended to disk (suspended) and resumed for a job (resumed), and suspends and resumes that failed for good (suspend_failed, resume_failed).",
		"event")

	// StandbyWaitSeconds is how long standby VMs stood by, suspended,
	// before their pool took them for a job.
	StandbyWaitSeconds = NewHistogram("standby_wait_duration_seconds",
		"How long a standby VM stood by, suspended to disk, before its RunnerPool took it for a job.",
		[]float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 172800, 604800})

	// StandbyResumeSeconds is how long a standby VM taken for a job took
	// to be back: from the resume's request to its guest answering with
	// its addresses read again.
	StandbyResumeSeconds = NewHistogram("standby_resume_duration_seconds",
		"From the resume of a standby VM taken for a job to its guest answering, with its addresses read again.",
		[]float64{0.25, 0.5, 1, 2, 3, 5, 8, 13, 20, 30, 60, 120})
)
