package scaleset

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Label is a scale-set label ("System" labels are the ones jobs match).
type Label struct {
	Type string `json:"type,omitempty"`
	Name string `json:"name"`
}

// RunnerGroup is a runner group as the Actions service shows it.
type RunnerGroup struct {
	ID        int    `json:"id"`
	Name      string `json:"name"`
	IsDefault bool   `json:"isDefaultGroup"`
}

// ScaleSet is a runner scale set.
type ScaleSet struct {
	ID              int         `json:"id,omitempty"`
	Name            string      `json:"name,omitempty"`
	RunnerGroupID   int         `json:"runnerGroupId,omitempty"`
	RunnerGroupName string      `json:"runnerGroupName,omitempty"`
	Labels          []Label     `json:"labels,omitempty"`
	Statistics      *Statistics `json:"statistics,omitempty"`
	// RunnerSetting configures the scale set's runners. The service
	// spells its JSON name with a capital R, as GitHub's own client
	// (github.com/actions/scaleset) sends it. Nil is left out: an update
	// then keeps the scale set's.
	RunnerSetting *RunnerSetting `json:"RunnerSetting,omitempty"`
}

// RunnerSetting is how the service configures a scale set's runners.
type RunnerSetting struct {
	// DisableUpdate is written into every JIT configuration of the scale
	// set: its runners do not update themselves when the service offers a
	// newer version (at the start of a job, in a VM that lives for one).
	DisableUpdate bool `json:"disableUpdate,omitempty"`
}

// Statistics are the service's counts for a scale set; ARC scales on
// TotalAssignedJobs.
type Statistics struct {
	TotalAvailableJobs     int `json:"totalAvailableJobs"`
	TotalAcquiredJobs      int `json:"totalAcquiredJobs"`
	TotalAssignedJobs      int `json:"totalAssignedJobs"`
	TotalRunningJobs       int `json:"totalRunningJobs"`
	TotalRegisteredRunners int `json:"totalRegisteredRunners"`
	TotalBusyRunners       int `json:"totalBusyRunners"`
	TotalIdleRunners       int `json:"totalIdleRunners"`
}

// RunnerReference names a runner of a scale set.
type RunnerReference struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	ScaleSetID int    `json:"runnerScaleSetId"`
}

// JITConfig is a generated runner configuration.
type JITConfig struct {
	Runner           *RunnerReference `json:"runner"`
	EncodedJITConfig string           `json:"encodedJITConfig"`
}

// SessionInfo is a message session.
type SessionInfo struct {
	SessionID               string      `json:"sessionId"`
	OwnerName               string      `json:"ownerName"`
	ScaleSet                *ScaleSet   `json:"runnerScaleSet"`
	MessageQueueURL         string      `json:"messageQueueUrl"`
	MessageQueueAccessToken string      `json:"messageQueueAccessToken"`
	Statistics              *Statistics `json:"statistics"`
}

// Job message types.
const (
	JobAvailable = "JobAvailable"
	JobAssigned  = "JobAssigned"
	JobStarted   = "JobStarted"
	JobCompleted = "JobCompleted"
)

// JobMessage is one job message of a batch; the runner fields are set for
// JobStarted and JobCompleted, Result for JobCompleted, AcquireJobURL for
// JobAvailable.
type JobMessage struct {
	Type               string    `json:"messageType"`
	RunnerRequestID    int64     `json:"runnerRequestId"`
	RepositoryName     string    `json:"repositoryName"`
	OwnerName          string    `json:"ownerName"`
	JobID              string    `json:"jobId"`
	JobWorkflowRef     string    `json:"jobWorkflowRef"`
	JobDisplayName     string    `json:"jobDisplayName"`
	WorkflowRunID      int64     `json:"workflowRunId"`
	EventName          string    `json:"eventName"`
	RequestLabels      []string  `json:"requestLabels"`
	QueueTime          time.Time `json:"queueTime"`
	ScaleSetAssignTime time.Time `json:"scaleSetAssignTime"`
	RunnerAssignTime   time.Time `json:"runnerAssignTime"`
	FinishTime         time.Time `json:"finishTime"`
	AcquireJobURL      string    `json:"acquireJobUrl,omitempty"`
	RunnerID           int64     `json:"runnerId,omitempty"`
	RunnerName         string    `json:"runnerName,omitempty"`
	Result             string    `json:"result,omitempty"`
}

// Message is one message of the queue: a batch of job messages and the
// statistics when it was sent.
type Message struct {
	ID         int64
	Statistics *Statistics
	Jobs       []JobMessage
}

// maxBatch bounds the job messages decoded from one message.
const maxBatch = 10000

// DecodeMessage decodes a message-queue answer. Only
// RunnerScaleSetJobMessages exist today; job messages of unknown types are
// skipped (the service may add types), as ARC does.
func DecodeMessage(data []byte) (*Message, error) {
	var raw struct {
		MessageID   int64       `json:"messageId"`
		MessageType string      `json:"messageType"`
		Body        string      `json:"body"`
		Statistics  *Statistics `json:"statistics"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("decode message: %w", err)
	}
	if raw.MessageType != "RunnerScaleSetJobMessages" {
		return nil, fmt.Errorf("decode message %d: unsupported message type %q", raw.MessageID, raw.MessageType)
	}
	if raw.MessageID <= 0 {
		return nil, errors.New("decode message: no messageId")
	}
	m := &Message{ID: raw.MessageID, Statistics: raw.Statistics}
	if raw.Body == "" {
		return m, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal([]byte(raw.Body), &batch); err != nil {
		return nil, fmt.Errorf("decode message %d body: %w", raw.MessageID, err)
	}
	if len(batch) > maxBatch {
		return nil, fmt.Errorf("decode message %d: %d job messages, at most %d", raw.MessageID, len(batch), maxBatch)
	}
	for i, b := range batch {
		var jm JobMessage
		if err := json.Unmarshal(b, &jm); err != nil {
			return nil, fmt.Errorf("decode message %d job message %d: %w", raw.MessageID, i, err)
		}
		switch jm.Type {
		case JobAvailable, JobAssigned, JobStarted, JobCompleted:
			m.Jobs = append(m.Jobs, jm)
		}
	}
	return m, nil
}
