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
	method := tmpl.Spec.Attestation.Method
	cfg := cluster.Spec.SPIRE
	if cfg == nil {
		return hfv1.SPIRENotConfiguredReason, fmt.Sprintf("spec.attestation.method is %s, but HypervisorCluster %s has no spec.spire: ask its owner to connect it to a SPIRE server (docs/identity.md), or set spec.attestation.method none", method, cluster.Name)
	}
	if method == hfv1.AttestationTPM {
		if cfg.TPM == nil {
			return hfv1.TPMNotConfiguredReason, fmt.Sprintf("spec.attestation.method is tpm, but HypervisorCluster %s has no spec.spire.tpm (the EK CAs it trusts and the DevID CA): ask its owner to set it up (docs/identity.md, \"TPM\"), or use join-token", cluster.Name)
		}
		return checkBrokerAndServer(cluster, method, canIssue, hasBroker)
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
	return checkBrokerAndServer(cluster, method, canIssue, hasBroker)
}

// checkBrokerAndServer says why the cluster's VMs could not attest or
// fetch their credential: no broker (nor secrets store), or a SPIRE server
// not connected.
func checkBrokerAndServer(cluster *hfv1.HypervisorCluster, method hfv1.AttestationMethod, canIssue, hasBroker bool) (hfv1.ConditionReason, string) {
	cfg := cluster.Spec.SPIRE
	if !canIssue || cfg.SecretStore == nil && !hasBroker || method == hfv1.AttestationTPM && !hasBroker {
		return hfv1.BrokerUnavailableReason, fmt.Sprintf("spec.attestation.method is %s, but this operator runs no credential broker for the VMs to fetch their runner credential from (or, for tpm, to enroll their TPM with): start the manager with the agent server (--agent-server-addr, --agent-server-url, --agent-server-cert and --agent-server-key; docs/identity.md), or set spec.attestation.method none", method)
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
