// Package gitlabsimtest gives tests of the operator's neutral packages
// (routing, the manager) GitLab CI's back-end as the operator binary
// registers it, so that they reach GitLab through pkg/workload as the
// operator does instead of importing the platform's package (a lint rule
// keeps those packages, tests included, neutral).
package gitlabsimtest

import (
	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
	"github.com/hyperfleet/hyperfleet/pkg/workload"
	"github.com/hyperfleet/hyperfleet/pkg/workload/gitlab"
)

// Workloads are GitLab CI's back-end by its workload type.
func Workloads() map[hfv1.WorkloadType]workload.Factory {
	return map[hfv1.WorkloadType]workload.Factory{hfv1.WorkloadGitLabCI: gitlab.NewBackend}
}

// OwnerKey is how a group's own webhook token is keyed in the webhook
// Secret after the owner. prefix (gitlab.OwnerKey).
func OwnerKey(group string) string { return gitlab.OwnerKey(group) }
