package machineclaim

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hfv1 "github.com/hyperfleet/hyperfleet/api/v1alpha1"
)

// Join-token lifetimes a cluster allows when its spec.spire.joinTokenTTL
// leaves a bound out.
const (
	defaultMinJoinTokenTTL = time.Minute
	defaultMaxJoinTokenTTL = time.Hour
)

// CheckTemplate says why a template that attests with SPIRE cannot be used
// on cluster, or returns an empty reason. canIssue and hasBroker say
// whether this operator holds an identity issuer and runs the credential
// broker.
func CheckTemplateIdentity(tmpl *hfv1.HypervisorMachineTemplate, cluster *hfv1.HypervisorCluster, canIssue, hasBroker bool) (hfv1.ConditionReason, string) {
	if !Attests(tmpl) {
		return "", ""
	}
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		return hfv1.SPIRENotConfiguredReason, fmt.Sprintf("spec.attestation.method is join-token, but HypervisorCluster %s has no spec.spire: ask its owner to connect it to a SPIRE server (docs/identity.md), or set spec.attestation.method none", cluster.Name)
	}
	ttl := defaultJoinTokenTTL
	if jt := tmpl.Spec.Attestation.JoinToken; jt != nil && jt.TTL != nil {
		ttl = jt.TTL.Duration
	}
	lo, hi := defaultMinJoinTokenTTL, defaultMaxJoinTokenTTL
	if b := cfg.JoinTokenTTL; b != nil {
		if b.Min != nil {
			lo = b.Min.Duration
		}
		if b.Max != nil {
			hi = b.Max.Duration
		}
	}
	if ttl < lo || ttl > hi {
		return hfv1.JoinTokenTTLNotAllowedReason, fmt.Sprintf("spec.attestation.joinToken.ttl %s is outside the join-token lifetimes HypervisorCluster %s allows (spec.spire.joinTokenTTL, %s to %s); choose a ttl within them",
			ttl, cluster.Name, lo, hi)
	}
	if !canIssue || cfg.SecretStore == nil && !hasBroker {
		return hfv1.BrokerUnavailableReason, "spec.attestation.method is join-token, but this operator runs no credential broker for the VMs to fetch their runner credential from: start the manager with the agent server (--agent-server-addr, --agent-server-url, --agent-server-cert and --agent-server-key; docs/identity.md), or set spec.attestation.method none"
	}
	if c := hfv1.FindCondition(cluster.Status.Conditions, hfv1.HypervisorClusterSPIREConnectedCondition); c == nil || c.Status != metav1.ConditionTrue {
		msg := "it has not been reached yet"
		if c != nil {
			msg = c.Message
		}
		return hfv1.SPIREUnavailableReason, fmt.Sprintf("the SPIRE server of HypervisorCluster %s (spec.spire) is not connected: %s", cluster.Name, msg)
	}
	return "", ""
}
