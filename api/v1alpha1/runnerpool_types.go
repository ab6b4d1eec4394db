package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WorkloadType is the CI platform whose jobs a pool's VMs run.
// +kubebuilder:validation:Enum=github-actions;gitlab-ci;buildkite;generic
type WorkloadType string

const (
	// WorkloadGitHubActions runs GitHub Actions jobs.
	WorkloadGitHubActions WorkloadType = "github-actions"
	// WorkloadGitLabCI runs GitLab CI jobs (docs/gitlab.md).
	WorkloadGitLabCI WorkloadType = "gitlab-ci"
	// WorkloadBuildkite runs Buildkite jobs (docs/buildkite.md).
	WorkloadBuildkite WorkloadType = "buildkite"
	// WorkloadGeneric runs VMs with no CI platform attached: each runs its
	// template's spec.bootstrap.generic.script once (docs/generic.md).
	WorkloadGeneric WorkloadType = "generic"
)

// RunnerPoolSpec is a pool of single-use VMs serving one kind of CI job.
// +kubebuilder:validation:XValidation:rule="self.workload.type != 'generic' || !has(self.scaling.minIdle) || self.scaling.minIdle == 0",message="scaling.minIdle does not apply to workload.type generic: a generic VM runs its script from its boot and is never idle; keep VMs with scaling.minReplicas instead"
// +kubebuilder:validation:XValidation:rule="self.workload.type != 'generic' || !has(self.scaling.schedules) || self.scaling.schedules.all(s, !has(s.minIdle) || s.minIdle == 0)",message="scaling.schedules[].minIdle does not apply to workload.type generic: a generic VM is never idle; use the schedule's minReplicas instead"
// +kubebuilder:validation:XValidation:rule="self.workload.type != 'generic' || ((!has(self.standby) || self.standby.size == 0) && (!has(self.scaling.schedules) || self.scaling.schedules.all(s, !has(s.standby) || s.standby == 0)))",message="standby does not apply to workload.type generic: a generic VM runs its script from its boot, so it cannot wait suspended for a job; remove standby and the schedules' standby"
// +kubebuilder:validation:XValidation:rule="!has(self.placement) || !self.placement.templates.exists(t, t.name == self.templateRef.name)",message="spec.placement.templates must not name spec.templateRef's template: templateRef is already the first choice; list only the other templates",fieldPath=".placement.templates"
// +kubebuilder:validation:XValidation:rule="!has(self.standby) || self.standby.size <= self.scaling.maxReplicas",message="standby.size must be at most scaling.maxReplicas: every standby VM counts toward it; lower standby.size or raise scaling.maxReplicas"
type RunnerPoolSpec struct {
	// templateRef names the HypervisorMachineTemplate, in this namespace,
	// the pool's VMs are built from.
	// +required
	TemplateRef ObjectName `json:"templateRef"`

	// workload is the CI platform and which of its jobs the pool serves.
	// +required
	Workload Workload `json:"workload"`

	// scaling bounds the pool's size.
	// +optional
	// +kubebuilder:default={minReplicas: 0, maxReplicas: 10}
	Scaling Scaling `json:"scaling,omitempty"`

	// lifecycle bounds how long a VM may live in each state.
	// +optional
	// +kubebuilder:default={}
	Lifecycle Lifecycle `json:"lifecycle,omitempty"`

	// standby is the pool's standby tier: VMs cloned from the template,
	// booted once until their agent waits for its credential, then
	// suspended to disk. Demand resumes one per job; its credential goes
	// in after the resume, and it is destroyed after its job like every
	// VM. A standby VM holds no host memory and no credential while it
	// waits (its saved memory is on the hypervisor's storage). Warm VMs
	// (scaling.minIdle) take jobs first, standby VMs next, new VMs last;
	// the pool refills the tier behind the demand (docs/runnerpool.md,
	// "Standby").
	// +optional
	Standby *Standby `json:"standby,omitempty"`

	// placement spreads the pool's VMs over more templates than
	// templateRef, each on its own HypervisorCluster, so that a cluster
	// that is full, at spec.limits.maxMachines, over the namespace's
	// quota or unreachable spills the pool's new VMs to the next
	// (docs/runnerpool.md, "Overflow across clusters"). Unset: every VM
	// from templateRef.
	// +optional
	Placement *PoolPlacement `json:"placement,omitempty"`
}

// PlacementStrategy says how a pool chooses among its templates.
// +kubebuilder:validation:Enum=pack;spread
type PlacementStrategy string

const (
	// PlacementPack fills the first template that can take a VM, in
	// priority order: templateRef, then placement.templates.
	PlacementPack PlacementStrategy = "pack"
	// PlacementSpread gives each new VM to the template, among those that
	// can take one, holding the fewest of the pool's VMs (ties to the
	// higher priority).
	PlacementSpread PlacementStrategy = "spread"
)

// PoolPlacement is the templates a pool may build VMs from besides its
// templateRef, and how it chooses among them.
type PoolPlacement struct {
	// strategy is pack (default: fill the first template that can take a
	// VM) or spread (balance the pool's VMs over the templates that can).
	// +optional
	// +kubebuilder:default=pack
	Strategy PlacementStrategy `json:"strategy,omitempty"`

	// templates are more HypervisorMachineTemplates of this namespace, in
	// priority order after templateRef. Each must run the same CI
	// platform, scope and credentials as templateRef (its spec.bootstrap
	// equal to templateRef's); one that does not is skipped and named in
	// the pool's status.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.all(t, self.exists_one(o, o.name == t.name))",message="placement.templates must not name a template twice"
	// +listType=atomic
	Templates []ObjectName `json:"templates"`
}

// TemplatePlacement is where a pool's VMs went: one template of the pool
// and whether it takes new VMs now.
type TemplatePlacement struct {
	// name is the HypervisorMachineTemplate.
	Name string `json:"name"`

	// hypervisorCluster is the template's cluster.
	// +optional
	HypervisorCluster string `json:"hypervisorCluster,omitempty"`

	// machines counts the pool's claims built from this template that
	// are not finished.
	Machines int32 `json:"machines"`

	// state is Available (takes new VMs), Full (its cluster has no
	// capacity or is at maxMachines), OverQuota (the namespace's quota on
	// its cluster is used up), Unreachable (its cluster is not connected)
	// or Invalid (the template cannot build VMs for this pool).
	State TemplatePlacementState `json:"state"`

	// message says why a template does not take new VMs.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// since is when the template entered its state. A Full or OverQuota
	// state seen from the pool's waiting claims holds until the cluster's
	// status.lastPollTime passes it or one of the pool's VMs on the
	// template ends; then the next new VM tries the template again.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`
}

// TemplatePlacementState is whether a pool's template takes new VMs.
// +kubebuilder:validation:Enum=Available;Full;OverQuota;Unreachable;Invalid
type TemplatePlacementState string

const (
	TemplateAvailable   TemplatePlacementState = "Available"
	TemplateFull        TemplatePlacementState = "Full"
	TemplateOverQuota   TemplatePlacementState = "OverQuota"
	TemplateUnreachable TemplatePlacementState = "Unreachable"
	TemplateInvalid     TemplatePlacementState = "Invalid"
)

// Standby sizes a pool's standby tier and bounds how long its VMs wait.
type Standby struct {
	// size is how many suspended VMs the pool keeps ready to resume. They
	// count toward scaling.maxReplicas. scaling.schedules may raise it in
	// their windows.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Size int32 `json:"size"`

	// maxAge replaces a standby VM that waited this long, counted from its
	// suspend: its package caches and certificates go stale. Between 10m
	// and 168h.
	// +optional
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10m') && duration(self) <= duration('168h')",message="standby.maxAge must be between 10m and 168h"
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`
}

// Workload is the CI platform a pool serves.
// +kubebuilder:validation:XValidation:rule="self.type != 'github-actions' || has(self.github)",message="workload.type github-actions needs workload.github (at least the runner labels)"
// +kubebuilder:validation:XValidation:rule="self.type == 'github-actions' || !has(self.github)",message="workload.github applies only to workload.type github-actions"
// +kubebuilder:validation:XValidation:rule="self.type != 'gitlab-ci' || has(self.gitlab)",message="workload.type gitlab-ci needs workload.gitlab (at least its tags, or runUntagged)"
// +kubebuilder:validation:XValidation:rule="self.type == 'gitlab-ci' || !has(self.gitlab)",message="workload.gitlab applies only to workload.type gitlab-ci"
// +kubebuilder:validation:XValidation:rule="self.type != 'buildkite' || has(self.buildkite)",message="workload.type buildkite needs workload.buildkite (at least its queue)"
// +kubebuilder:validation:XValidation:rule="self.type == 'buildkite' || !has(self.buildkite)",message="workload.buildkite applies only to workload.type buildkite"
type Workload struct {
	// type is the CI platform: github-actions, gitlab-ci, buildkite, or
	// generic (VMs that run their template's spec.bootstrap.generic.script,
	// with no CI platform and no job demand: the pool keeps
	// scaling.minReplicas of them, replacing each that ends;
	// docs/generic.md). It must be the platform of the template's
	// spec.bootstrap section; otherwise the pool is not Ready (reason
	// InvalidSpec) and creates no VMs.
	// +required
	Type WorkloadType `json:"type"`

	// github selects GitHub Actions jobs.
	// +optional
	GitHub *GitHubWorkload `json:"github,omitempty"`

	// gitlab selects GitLab CI jobs: the tags of the pool's runners, and
	// optionally a project or group under the template's scope.
	// +optional
	GitLab *GitLabWorkload `json:"gitlab,omitempty"`

	// buildkite selects Buildkite jobs: a queue of the template's
	// cluster.
	// +optional
	Buildkite *BuildkiteWorkload `json:"buildkite,omitempty"`
}

// GitHubWorkload selects the GitHub Actions jobs a pool serves.
// +kubebuilder:validation:XValidation:rule="!(has(self.repository) && has(self.organization))",message="set at most one of workload.github.repository and workload.github.organization; leave both unset to use the template's"
// +kubebuilder:validation:XValidation:rule="!has(self.runnerGroup) || !has(self.repository)",message="workload.github.runnerGroup applies only to organization runners (GitHub has no runner groups for a repository): remove it or narrow the pool with workload.github.organization"
type GitHubWorkload struct {
	// repository, as owner/name, narrows the pool to one repository's jobs.
	// Defaults to the template's repository or organization.
	// +optional
	// +kubebuilder:validation:MaxLength=140
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?/[A-Za-z0-9_.-]+$`
	Repository string `json:"repository,omitempty"`

	// organization narrows the pool to one organization's jobs. With a
	// template of enterprise runners it is required (or repository): an
	// organization of the enterprise whose jobs the runners take.
	// +optional
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$`
	Organization string `json:"organization,omitempty"`

	// labels are the runner labels. A queued job is served by this pool when
	// every label in its runs-on is among these (compared case-insensitively).
	// Runners also get the labels self-hosted and hyperfleet.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	// +listType=set
	Labels []string `json:"labels"`

	// runnerGroup is the organization runner group runners join;
	// organization runners only.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	RunnerGroup string `json:"runnerGroup,omitempty"`

	// scaleSet takes the pool's jobs from a GitHub runner scale set, with
	// no inbound webhook: the operator (its leader) creates or adopts the
	// scale set, named here, in the pool's scope and runnerGroup with the
	// pool's runner labels, long-polls its message queue for jobs, acquires
	// them, and registers the pool's VMs as the scale set's just-in-time
	// runners. Webhooks and the periodic resync keep working beside it: a
	// job is recorded once whichever source reports it. Needs a template
	// with spec.bootstrap.method jit-config; not for enterprise runners
	// (docs/github.md, "Runner scale sets").
	// +optional
	ScaleSet *GitHubScaleSet `json:"scaleSet,omitempty"`
}

// GitHubScaleSet is the runner scale set a pool listens to.
type GitHubScaleSet struct {
	// name is the scale set's name in its runner group: the operator
	// adopts the scale set of that name, or creates it. Two RunnerPools
	// must not name the same scale set of the same scope (the younger is
	// refused with reason ScaleSetInUse): a scale set has one listener.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=100
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	Name string `json:"name"`
}

// GitLabWorkload selects the GitLab CI jobs a pool serves: those of its
// scope (the template's, or a project or group under it) whose tags are all
// among the pool's tags.
// +kubebuilder:validation:XValidation:rule="!(has(self.project) && has(self.group))",message="set at most one of workload.gitlab.project and workload.gitlab.group; leave both unset to use the template's scope"
type GitLabWorkload struct {
	// tags are the runner's tags. A job is served by this pool when every
	// one of its tags is among these (compared case-insensitively, as GitLab
	// does); a job without tags only with runUntagged.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	// +listType=set
	Tags []string `json:"tags,omitempty"`

	// project, a full path such as acme/platform/app, narrows the pool to
	// one project of the template's group (or instance). Its runners are
	// then project runners.
	// +optional
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)+$`
	Project string `json:"project,omitempty"`

	// group, a full path such as acme/platform, narrows the pool to one
	// group (and its subgroups) of the template's group (or instance). Its
	// runners are then group runners.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=255
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$`
	Group string `json:"group,omitempty"`

	// runUntagged lets the pool's runners take jobs without tags; defaults
	// to the template's bootstrap.gitlab.runUntagged.
	// +optional
	RunUntagged *bool `json:"runUntagged,omitempty"`
}

// Scaling bounds a pool's size. The pool keeps at least minReplicas VMs and
// at least minIdle idle ones, starts one VM per pending job, and never goes
// above maxReplicas.
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="scaling.minReplicas must not be greater than scaling.maxReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.minIdle) || self.minIdle <= self.maxReplicas",message="scaling.minIdle must not be greater than scaling.maxReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.schedules) || self.schedules.all(s, !has(s.minReplicas) || s.minReplicas <= self.maxReplicas)",message="scaling.schedules[].minReplicas must not be greater than scaling.maxReplicas; lower the schedule's minReplicas or raise maxReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.schedules) || self.schedules.all(s, !has(s.minIdle) || s.minIdle <= self.maxReplicas)",message="scaling.schedules[].minIdle must not be greater than scaling.maxReplicas; lower the schedule's minIdle or raise maxReplicas"
type Scaling struct {
	// minReplicas is the fewest VMs the pool keeps, busy or idle.
	// `kubectl scale` sets this value.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinReplicas int32 `json:"minReplicas"`

	// maxReplicas is the most VMs the pool has at once.
	// +optional
	// +kubebuilder:default=10
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxReplicas int32 `json:"maxReplicas"`

	// minIdle is the warm pool: ready, registered VMs kept waiting for jobs
	// so that a job starts without waiting for a boot.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinIdle *int32 `json:"minIdle,omitempty"`

	// scaleDownDelay is how long demand must stay low before idle VMs are
	// removed. Between 0s and 1h.
	// +optional
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('1h')",message="scaling.scaleDownDelay must be at most 1h"
	ScaleDownDelay *metav1.Duration `json:"scaleDownDelay,omitempty"`

	// schedules raise the pool's minimums in time windows (working hours),
	// declared in the spec rather than scaled by hand. While windows are
	// open, minReplicas and minIdle are the largest of their value here
	// and every open window's (never the sum); `kubectl scale` keeps
	// setting the base minReplicas. status.schedule shows the windows open.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	Schedules []ScalingSchedule `json:"schedules,omitempty"`
}

// ScalingSchedule opens a window at every time its cron expression matches
// in its time zone; each window lasts duration (elapsed time). A start in
// the hour skipped when clocks go forward does not happen that day, and one
// in the hour repeated when they go back happens in both (the windows
// overlap; the minimum is the same).
// +kubebuilder:validation:XValidation:rule="has(self.minReplicas) || has(self.minIdle) || has(self.standby)",message="scaling.schedules[]: set minReplicas, minIdle, standby or more of them; a schedule without any changes nothing"
type ScalingSchedule struct {
	// name identifies the schedule in status and events.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// cron is a standard five-field expression (minute hour day-of-month
	// month day-of-week), such as "0 8 * * 1-5" for 08:00 on weekdays.
	// Descriptors (@daily) and CRON_TZ= are not accepted: timeZone sets the
	// zone. Ranges are checked when the pool is reconciled (condition
	// SchedulesValid).
	// +kubebuilder:validation:MinLength=9
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule="self.matches('^[0-9A-Za-z*/,?-]+( +[0-9A-Za-z*/,?-]+){4}$')",message="scaling.schedules[].cron must have five fields (minute hour day-of-month month day-of-week) of digits, names, *, /, , and -, such as 0 8 * * 1-5"
	Cron string `json:"cron"`

	// timeZone is the IANA zone the cron expression is read in, such as
	// Europe/Berlin. An unknown zone is reported by condition
	// SchedulesValid and its schedule opens no window.
	// +optional
	// +kubebuilder:default=UTC
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*$`
	TimeZone string `json:"timeZone,omitempty"`

	// duration is how long each window stays open after each start.
	// Between 1m and 168h (7 days).
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="scaling.schedules[].duration must be between 1m and 168h"
	Duration metav1.Duration `json:"duration"`

	// minReplicas is the fewest VMs the pool keeps while a window is open.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinReplicas *int32 `json:"minReplicas,omitempty"`

	// minIdle is the warm pool kept while a window is open.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MinIdle *int32 `json:"minIdle,omitempty"`

	// standby is the standby tier's size while a window is open
	// (standby.size otherwise; the largest open window's wins, as for the
	// minimums).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Standby *int32 `json:"standby,omitempty"`
}

// Lifecycle bounds how long a VM may live in each state. Hard limits
// (jobTimeout, maxLifetime) cancel the running job on the CI platform before
// the VM is destroyed and record why.
// +kubebuilder:validation:XValidation:rule="!has(self.jobTimeout) || !has(self.maxLifetime) || duration(self.jobTimeout) <= duration(self.maxLifetime)",message="lifecycle.jobTimeout (default 3h) must not be longer than lifecycle.maxLifetime; lower jobTimeout too"
// +kubebuilder:validation:XValidation:rule="!has(self.bootstrapTimeout) || !has(self.maxLifetime) || duration(self.bootstrapTimeout) < duration(self.maxLifetime)",message="lifecycle.bootstrapTimeout (default 10m) must be shorter than lifecycle.maxLifetime"
type Lifecycle struct {
	// maxLifetime is the longest a VM may exist, whatever it is doing.
	// Between 1m and 7 days (168h).
	// +optional
	// +kubebuilder:default="6h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="lifecycle.maxLifetime must be between 1m and 168h"
	MaxLifetime *metav1.Duration `json:"maxLifetime,omitempty"`

	// idleTimeout is how long a registered VM may wait for a job before it is
	// drained and deleted. Between 1m and 24h.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('24h')",message="lifecycle.idleTimeout must be between 1m and 24h"
	IdleTimeout *metav1.Duration `json:"idleTimeout,omitempty"`

	// jobTimeout is the longest one job may run. Between 1m and 72h.
	// +optional
	// +kubebuilder:default="3h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('72h')",message="lifecycle.jobTimeout must be between 1m and 72h"
	JobTimeout *metav1.Duration `json:"jobTimeout,omitempty"`

	// bootstrapTimeout is how long a new VM may take to register its runner
	// before it is replaced. Between 30s and 2h.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('30s') && duration(self) <= duration('2h')",message="lifecycle.bootstrapTimeout must be between 30s and 2h"
	BootstrapTimeout *metav1.Duration `json:"bootstrapTimeout,omitempty"`

	// failedRetention keeps failed VMs, stopped, for debugging.
	// +optional
	FailedRetention *FailedRetention `json:"failedRetention,omitempty"`

	// history keeps finished MachineClaims for inspection.
	// +optional
	History *ClaimHistory `json:"history,omitempty"`
}

// FailedRetention keeps failed VMs for debugging. They count against
// maxReplicas while kept.
type FailedRetention struct {
	// maxRetained is the most failed VMs kept at once; the oldest goes first.
	// 0 keeps none.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=20
	MaxRetained int32 `json:"maxRetained"`

	// ttl is how long a failed VM is kept. Between 1m and 168h.
	// +optional
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('168h')",message="lifecycle.failedRetention.ttl must be between 1m and 168h"
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// ClaimHistory keeps finished MachineClaims (their VMs are gone).
type ClaimHistory struct {
	// limit is the most finished claims kept; the oldest goes first.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Limit int32 `json:"limit"`

	// ttl is how long a finished claim is kept. Between 1m and 720h.
	// +optional
	// +kubebuilder:default="24h"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m') && duration(self) <= duration('720h')",message="lifecycle.history.ttl must be between 1m and 720h"
	TTL *metav1.Duration `json:"ttl,omitempty"`
}

// RunnerPoolStatus counts the pool's VMs by state and explains its size.
type RunnerPoolStatus struct {
	// conditions are Ready (the template and its cluster can make VMs),
	// Scaling (the pool is changing size, and why), CapacityAvailable
	// (False when demand cannot be served: AtMaxReplicas,
	// ClusterUnavailable, TemplateInvalid, IPPoolExhausted, RateLimited,
	// ScopeNotVerified), ScopeVerified (the credentials manage runners in
	// the pool's scope) and ReplacementBackoff.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// replicas counts the pool's MachineClaims that are not finished.
	// +optional
	Replicas int32 `json:"replicas"`

	// desiredReplicas is the size the pool is moving to.
	// +optional
	DesiredReplicas int32 `json:"desiredReplicas,omitempty"`

	// minReplicas is the minimum the pool scales to now:
	// spec.scaling.minReplicas, or what an active schedule raised it to
	// (status.schedule says which). `kubectl get runnerpools` shows it.
	// +optional
	MinReplicas int32 `json:"minReplicas,omitempty"`

	// readyReplicas counts VMs whose runner is registered (idle or busy).
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// idleReplicas counts registered VMs waiting for a job.
	// +optional
	IdleReplicas int32 `json:"idleReplicas,omitempty"`

	// busyReplicas counts VMs running a job.
	// +optional
	BusyReplicas int32 `json:"busyReplicas,omitempty"`

	// startingReplicas counts VMs being created or booting.
	// +optional
	StartingReplicas int32 `json:"startingReplicas,omitempty"`

	// terminatingReplicas counts VMs being removed; they hold their place
	// under maxReplicas until they are gone.
	// +optional
	TerminatingReplicas int32 `json:"terminatingReplicas,omitempty"`

	// retainedReplicas counts failed VMs kept stopped for debugging
	// (spec.lifecycle.failedRetention); they count against maxReplicas.
	// +optional
	RetainedReplicas int32 `json:"retainedReplicas,omitempty"`

	// staleReplicas counts VMs built from an older template hash.
	// +optional
	StaleReplicas int32 `json:"staleReplicas,omitempty"`

	// standby counts the standby tier (spec.standby); unset when the pool
	// has none and no standby VM.
	// +optional
	Standby *PoolStandbyStatus `json:"standby,omitempty"`

	// pendingJobs counts queued jobs that match the pool and have no runner yet.
	// +optional
	PendingJobs int32 `json:"pendingJobs,omitempty"`

	// placement lists the pool's templates (templateRef first, then
	// spec.placement.templates) with the VMs each holds and whether it
	// takes new ones; unset without spec.placement.
	// +optional
	// +kubebuilder:validation:MaxItems=9
	// +listType=atomic
	Placement []TemplatePlacement `json:"placement,omitempty"`

	// templateHash is the template hash new VMs are built from.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	TemplateHash string `json:"templateHash,omitempty"`

	// selector is the label selector of the pool's MachineClaims, for the
	// scale subresource.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Selector string `json:"selector,omitempty"`

	// lastScaleTime is when the pool last changed size.
	// +optional
	LastScaleTime *metav1.Time `json:"lastScaleTime,omitempty"`

	// lowDemandSince is when the pool first had more VMs than its demand
	// needs, without interruption; idle VMs are removed once this is
	// spec.scaling.scaleDownDelay old. Unset while demand matches the size.
	// +optional
	LowDemandSince *metav1.Time `json:"lowDemandSince,omitempty"`

	// lastResyncTime is when the pool's runners and queued jobs were
	// compared with the CI platform, written at most every 5 minutes: the
	// last comparison is at most that much later than it says.
	// +optional
	LastResyncTime *metav1.Time `json:"lastResyncTime,omitempty"`

	// scopeVerification records which scope, with which template's
	// credentials, was last verified. Routing trusts ScopeVerified only
	// while these still match the pool and its template.
	// +optional
	ScopeVerification *ScopeVerification `json:"scopeVerification,omitempty"`

	// replacementBackoff counts the pool's consecutive claims that failed
	// before their runner came online, and when the next replacement may
	// be created. It lives in status so that a restart keeps the delay.
	// +optional
	ReplacementBackoff *ReplacementBackoff `json:"replacementBackoff,omitempty"`

	// schedule is what spec.scaling.schedules make of the pool's minimums
	// now; unset without schedules.
	// +optional
	Schedule *ScheduleStatus `json:"schedule,omitempty"`

	// scaleSet is the runner scale set the pool listens to
	// (spec.workload.github.scaleSet) as the leader's listener last saw
	// it; unset without one.
	// +optional
	ScaleSet *ScaleSetStatus `json:"scaleSet,omitempty"`
}

// ScaleSetStatus is a pool's runner scale set and its listener.
type ScaleSetStatus struct {
	// id is the scale set's id at the Actions service; 0 until it was
	// created or adopted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ID int64 `json:"id,omitempty"`
	// name is the scale set's name.
	// +kubebuilder:validation:MaxLength=100
	Name string `json:"name"`
	// listeningSince is when the listener's current message session
	// opened; unset while it has none.
	// +optional
	ListeningSince *metav1.Time `json:"listeningSince,omitempty"`
	// lastMessageTime is when the listener last received a message.
	// +optional
	LastMessageTime *metav1.Time `json:"lastMessageTime,omitempty"`
	// assignedJobs is GitHub's count, at the last message, of the scale
	// set's jobs waiting for or running on its runners.
	// +optional
	AssignedJobs int32 `json:"assignedJobs,omitempty"`
	// runningJobs is GitHub's count, at the last message, of the scale
	// set's jobs running.
	// +optional
	RunningJobs int32 `json:"runningJobs,omitempty"`
	// registeredRunners is GitHub's count, at the last message, of the
	// scale set's registered runners.
	// +optional
	RegisteredRunners int32 `json:"registeredRunners,omitempty"`
}

// ScheduleStatus is the pool's scheduled minimums at the last reconcile.
type ScheduleStatus struct {
	// effectiveMinReplicas is the minReplicas the pool scales to:
	// spec.scaling.minReplicas, raised by every open window.
	EffectiveMinReplicas int32 `json:"effectiveMinReplicas"`
	// effectiveMinIdle is the minIdle the pool scales to:
	// spec.scaling.minIdle, raised by every open window.
	EffectiveMinIdle int32 `json:"effectiveMinIdle"`
	// activeWindows are the schedules with a window open.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ActiveWindows []ActiveWindow `json:"activeWindows,omitempty"`
	// nextChange is when a window next opens or closes.
	// +optional
	NextChange *metav1.Time `json:"nextChange,omitempty"`
}

// ActiveWindow is one schedule's open window.
type ActiveWindow struct {
	// name is the schedule's.
	// +kubebuilder:validation:MaxLength=63
	Name string `json:"name"`
	// start is when the window in effect opened.
	Start metav1.Time `json:"start"`
	// end is when the schedule's windows close (windows that overlap or
	// follow each other count as one).
	End metav1.Time `json:"end"`
}

// ScopeVerification is the last successful check that the template's
// credentials manage runners in the pool's scope.
type ScopeVerification struct {
	// scope is the verified owner or owner/repository, prefixed with
	// enterprises/<slug>/ for an enterprise's runners.
	// +kubebuilder:validation:MaxLength=256
	Scope string `json:"scope"`
	// template is the HypervisorMachineTemplate whose credentials were used.
	// +kubebuilder:validation:MaxLength=253
	Template string `json:"template"`
	// credentials identifies what the check used (SHA-256 over the
	// template's spec.bootstrap.github apiBaseURL, registrationURLs and
	// credential Secret references; never the Secrets' values). Other edits
	// of the template keep the verification.
	// +kubebuilder:validation:MaxLength=64
	Credentials string `json:"credentials"`
	// verifiedAt is when the check succeeded.
	VerifiedAt metav1.Time `json:"verifiedAt"`
}

// ReplacementBackoff is the pool's record of consecutive failed claims.
type ReplacementBackoff struct {
	// consecutiveFailures counts claims that failed or ended before their
	// runner came online since the last claim that reached Ready.
	// +optional
	ConsecutiveFailures int32 `json:"consecutiveFailures,omitempty"`
	// lastFailure names the last failed claim and why it failed.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	LastFailure string `json:"lastFailure,omitempty"`
	// lastFailureTime is when it failed.
	// +optional
	LastFailureTime *metav1.Time `json:"lastFailureTime,omitempty"`
	// nextAttemptTime is the earliest time a replacement claim is created.
	// +optional
	NextAttemptTime *metav1.Time `json:"nextAttemptTime,omitempty"`
	// observedThrough is the time of the latest claim outcome (a failure,
	// or a runner online) counted; earlier outcomes are not counted again.
	// +optional
	ObservedThrough *metav1.Time `json:"observedThrough,omitempty"`
	// countedClaims are the UIDs of the claims whose outcome is at
	// observedThrough and already counted (times have one-second
	// resolution), so that they are not counted twice.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	CountedClaims []string `json:"countedClaims,omitempty"`
}

// RunnerPool keeps enough fresh, single-use VMs for the CI jobs that match
// it: one VM per job, scaled from the CI platform's demand, within bounds.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.scaling.minReplicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=rp,categories=hyperfleet
// +kubebuilder:printcolumn:name="Min",type=integer,JSONPath=`.status.minReplicas`,description="The minimum the pool scales to now (a schedule may raise spec.scaling.minReplicas)"
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.scaling.maxReplicas`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredReplicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`,description="VMs whose runner is registered, idle or busy"
// +kubebuilder:printcolumn:name="Busy",type=integer,JSONPath=`.status.busyReplicas`
// +kubebuilder:printcolumn:name="Queued",type=integer,JSONPath=`.status.pendingJobs`,description="Queued jobs that match the pool and have no runner yet"
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Template",type=string,JSONPath=`.spec.templateRef.name`,priority=1
// +kubebuilder:printcolumn:name="Idle",type=integer,JSONPath=`.status.idleReplicas`,priority=1
// +kubebuilder:printcolumn:name="Starting",type=integer,JSONPath=`.status.startingReplicas`,priority=1
// +kubebuilder:printcolumn:name="Workload",type=string,JSONPath=`.spec.workload.type`,priority=1
// +kubebuilder:printcolumn:name="Stale",type=integer,JSONPath=`.status.staleReplicas`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RunnerPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the pool's template, workload and bounds.
	// +required
	Spec RunnerPoolSpec `json:"spec"`

	// status counts the pool's VMs.
	// +optional
	Status RunnerPoolStatus `json:"status,omitempty"`
}

// RunnerPoolList is a list of RunnerPool.
// +kubebuilder:object:root=true
type RunnerPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RunnerPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&RunnerPool{}, &RunnerPoolList{})
}

// PoolStandbyStatus counts a pool's standby tier.
type PoolStandbyStatus struct {
	// size is the tier's size now: spec.standby.size, or the largest open
	// schedule window's standby.
	Size int32 `json:"size"`
	// ready counts standby VMs suspended to disk, ready to be resumed.
	// +optional
	Ready int32 `json:"ready,omitempty"`
	// refilling counts standby VMs being built, booted or suspended.
	// +optional
	Refilling int32 `json:"refilling,omitempty"`
	// resuming counts VMs taken from the tier for a job whose runner is
	// not online yet.
	// +optional
	Resuming int32 `json:"resuming,omitempty"`
}
