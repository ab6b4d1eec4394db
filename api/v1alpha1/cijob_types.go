package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CIJobState is where a CI job is in its life, as the CI platform reports it.
// +kubebuilder:validation:Enum=queued;in_progress;completed
type CIJobState string

const (
	// CIJobQueued: the job waits for a runner (GitHub's queued and waiting).
	CIJobQueued CIJobState = "queued"
	// CIJobInProgress: a runner took the job.
	CIJobInProgress CIJobState = "in_progress"
	// CIJobCompleted: the job finished, whatever its conclusion.
	CIJobCompleted CIJobState = "completed"
)

// CIJobRank orders states: a job only moves forward, so a late or repeated
// webhook never moves it back.
func CIJobRank(s CIJobState) int {
	switch s {
	case CIJobQueued:
		return 1
	case CIJobInProgress:
		return 2
	case CIJobCompleted:
		return 3
	}
	return 0
}

// CIJobSpec identifies one CI job. It is written once, when HyperFleet first
// learns of the job, and never changes.
//
// The immutability rule compares jobID and runID under either spelling: a
// CIJob an earlier operator stored with jobId and runId is written back
// with jobID and runID (spelling.go) and stays the same job.
// +kubebuilder:validation:XValidation:rule="self == oldSelf || (self.platform == oldSelf.platform && (has(self.apiHost) ? has(oldSelf.apiHost) && self.apiHost == oldSelf.apiHost : !has(oldSelf.apiHost)) && (has(self.jobKey) ? has(oldSelf.jobKey) && self.jobKey == oldSelf.jobKey : !has(oldSelf.jobKey)) && (has(self.runAttempt) ? has(oldSelf.runAttempt) && self.runAttempt == oldSelf.runAttempt : !has(oldSelf.runAttempt)) && self.repository == oldSelf.repository && (has(self.labels) ? has(oldSelf.labels) && self.labels == oldSelf.labels : !has(oldSelf.labels)) && (has(self.workflowName) ? has(oldSelf.workflowName) && self.workflowName == oldSelf.workflowName : !has(oldSelf.workflowName)) && (has(self.jobName) ? has(oldSelf.jobName) && self.jobName == oldSelf.jobName : !has(oldSelf.jobName)) && self.runnerPoolRef == oldSelf.runnerPoolRef && (has(self.jobID) ? self.jobID : (has(self.jobId) ? self.jobId : 0)) == (has(oldSelf.jobID) ? oldSelf.jobID : (has(oldSelf.jobId) ? oldSelf.jobId : 0)) && (has(self.runID) ? self.runID : (has(self.runId) ? self.runId : 0)) == (has(oldSelf.runID) ? oldSelf.runID : (has(oldSelf.runId) ? oldSelf.runId : 0)))",message="a CIJob's spec is immutable: it identifies the job"
// +kubebuilder:validation:XValidation:rule="(has(self.jobID) || has(self.jobId)) != has(self.jobKey)",message="set exactly one of jobID (a platform's numeric job id) and jobKey (the id of a job whose platform does not number them)"
type CIJobSpec struct {
	// platform is the CI platform that runs the job.
	// +required
	Platform WorkloadType `json:"platform"`

	// apiHost is the API host of the platform instance the job is on (a
	// GitHub Enterprise Server, a self-managed GitLab), as its pool's
	// template names it; unset for the platform's public service. A job's
	// events are recorded here only from that host: the same job id on
	// another host is another job.
	// +optional
	// +kubebuilder:validation:MaxLength=261
	APIHost string `json:"apiHost,omitempty"`

	// jobID is the platform's id of the job when the platform numbers its
	// jobs (GitHub Actions, GitLab CI); the object's name is derived from
	// it, which de-duplicates webhooks across manager replicas. Exactly one
	// of jobID and jobKey is set.
	// +optional
	// +kubebuilder:validation:Minimum=1
	JobID int64 `json:"jobID,omitempty"`

	// jobId is the earlier spelling of jobID, as an earlier operator wrote
	// it: read when jobID is unset, replaced by jobID at the operator's next
	// write of the job.
	//
	// Deprecated: the operator writes jobID. Only the schema reads this
	// field: decoding folds it into JobID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:Minimum=1
	DeprecatedJobID int64 `json:"jobId,omitempty"`

	// jobKey is the platform's id of the job when the platform does not
	// number its jobs (a Buildkite job's UUID); the object's name is derived
	// from it lower-cased. Exactly one of jobID and jobKey is set.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$`
	JobKey string `json:"jobKey,omitempty"`

	// runID is the workflow run the job belongs to; a hard limit cancels
	// this run.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunID int64 `json:"runID,omitempty"`

	// runId is the earlier spelling of runID, as an earlier operator wrote
	// it: read when runID is unset, replaced by runID at the operator's next
	// write of the job.
	//
	// Deprecated: the operator writes runID. Only the schema reads this
	// field: decoding folds it into RunID (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:Minimum=0
	DeprecatedRunID int64 `json:"runId,omitempty"`

	// runAttempt is the run's attempt number.
	// +optional
	// +kubebuilder:validation:Minimum=0
	RunAttempt int64 `json:"runAttempt,omitempty"`

	// repository is the job's repository as owner/name.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=140
	Repository string `json:"repository"`

	// labels are the job's runs-on labels.
	// +optional
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=256
	// +listType=atomic
	Labels []string `json:"labels,omitempty"`

	// workflowName is the workflow's name, for display.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	WorkflowName string `json:"workflowName,omitempty"`

	// jobName is the job's name, for display.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	JobName string `json:"jobName,omitempty"`

	// runnerPoolRef is the RunnerPool, in this namespace, whose labels cover
	// the job's and which serves its repository.
	// +required
	RunnerPoolRef ObjectName `json:"runnerPoolRef"`
}

// CIJobStatus is what the platform last said about the job.
type CIJobStatus struct {
	// state is queued, in_progress or completed. It only moves forward.
	// +optional
	State CIJobState `json:"state,omitempty"`

	// queuedAt is when the job was queued (the platform's time when known).
	// +optional
	QueuedAt *metav1.Time `json:"queuedAt,omitempty"`

	// startedAt is when a runner took the job.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// completedAt is when the job finished.
	// +optional
	CompletedAt *metav1.Time `json:"completedAt,omitempty"`

	// conclusion is the platform's conclusion of a completed job, such as
	// success, failure or cancelled.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Conclusion string `json:"conclusion,omitempty"`

	// runnerName is the runner that took the job, as the platform reports
	// it: any runner whose labels cover the job's may take it.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	RunnerName string `json:"runnerName,omitempty"`

	// runnerID is that runner's id on the platform.
	// +optional
	RunnerID int64 `json:"runnerID,omitempty"`

	// runnerId is the earlier spelling of runnerID, as an earlier operator
	// wrote it: read when runnerID is unset, replaced by runnerID at the
	// operator's next write of the job.
	//
	// Deprecated: the operator writes runnerID. Only the schema reads this
	// field: decoding folds it into RunnerID (api/v1alpha1/spelling.go).
	// +optional
	DeprecatedRunnerID int64 `json:"runnerId,omitempty"`

	// source says how HyperFleet last learned of the job: webhook, resync,
	// or listener (a runner scale set's message queue).
	// +optional
	// +kubebuilder:validation:Enum=webhook;resync;listener
	Source string `json:"source,omitempty"`

	// lastDeliveryID is the platform's id of the last webhook delivery
	// applied, for tracing.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	LastDeliveryID string `json:"lastDeliveryID,omitempty"`

	// lastDeliveryId is the earlier spelling of lastDeliveryID, as an
	// earlier operator wrote it: read when lastDeliveryID is unset, replaced
	// by lastDeliveryID at the operator's next write of the job.
	//
	// Deprecated: the operator writes lastDeliveryID. Only the schema reads
	// this field: decoding folds it into LastDeliveryID
	// (api/v1alpha1/spelling.go).
	// +optional
	// +kubebuilder:validation:MaxLength=128
	DeprecatedLastDeliveryID string `json:"lastDeliveryId,omitempty"`
}

// CIJob is one CI job routed to a RunnerPool: the demand the pool scales
// for. The webhook receiver (on every manager replica) and the periodic
// resync write CIJobs; the leader's controllers read them, so no demand
// lives only in one process's memory. Completed jobs are kept for a while
// for queue-time metrics and then deleted.
//
// CIJob has no status subresource: the webhook receiver records a job and
// its state in one write.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=cij,categories=hyperfleet
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.runnerPoolRef.name`
// +kubebuilder:printcolumn:name="Job",type=integer,JSONPath=`.spec.jobID`
// +kubebuilder:printcolumn:name="Job Key",type=string,JSONPath=`.spec.jobKey`,priority=1
// +kubebuilder:printcolumn:name="Repository",type=string,JSONPath=`.spec.repository`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Runner",type=string,JSONPath=`.status.runnerName`
// +kubebuilder:printcolumn:name="Conclusion",type=string,JSONPath=`.status.conclusion`,priority=1
// +kubebuilder:printcolumn:name="Workflow",type=string,JSONPath=`.spec.workflowName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CIJob struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec identifies the job.
	// +required
	Spec CIJobSpec `json:"spec"`

	// status is the job's state as last reported.
	// +optional
	Status CIJobStatus `json:"status,omitempty"`
}

// CIJobList is a list of CIJob.
// +kubebuilder:object:root=true
type CIJobList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CIJob `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CIJob{}, &CIJobList{})
}
